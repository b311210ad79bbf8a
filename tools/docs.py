"""Build the documentation site: `python tools/docs.py` runs every notebook of `nbs/` once and writes it, with its
outputs (the training tables, the figures, the launcher's messages), as a Markdown page to `_proc/docs/`; MkDocs
(`mkdocs.yml`: the Material theme, `mkdocstrings` writing each API entry) then builds `_docs/` from them.

The notebooks are processed by nbdev's own processors, as `nbdev_docs` does before Quarto renders them: the title
and subtitle become the page's heading, exported source and `#| hide` cells are left out, `#|` directives are
stripped. Each public name a notebook exports gets an API entry (mkdocstrings' `::: distrib.<module>.<name>`:
signature, then a table of the parameters with their types, defaults and meanings). Every code cell runs, in the
notebook's order, in one `execnb` shell per notebook, as `nbdev_test` runs them (cells flagged with `tst_flags` in
settings.ini, `slow` and `notest`, and `#| eval: false` ones are shown without running). A cell that raises fails
the build, naming the notebook and the cell. Needs the `docs` extra (`pip install -e ".[docs]"`).

Usage: python tools/docs.py [--n_workers N] [notebook names...]   (names: build these pages only, for a quick look)"""
import argparse, ast, json, os, shutil, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBS, PAGES, SITE = ROOT/'nbs', ROOT/'_proc'/'docs', ROOT/'_docs'

def _flags()->set:
    "The test flags of settings.ini (`tst_flags`): cells carrying one are shown, not run, as `nbdev_test` skips them"
    from nbdev.config import get_config
    return set(get_config().get('tst_flags', '').split())

def _procs(nb_path:Path)->list:
    "nbdev's processors for docs, with `run_cells` in place of `exec_show_docs` (which runs only exports)"
    from execnb.shell import CaptureShell
    from execnb.nbio import mk_cell
    from nbdev.frontmatter import FrontmatterProc
    from nbdev.process import Processor
    from nbdev.processors import (populate_language, hide_line, rm_header_dash, strip_ansi, rm_export, clean_magics,
                                  hide_, strip_hidden_metadata, _want_doc, _default_exp)
    from nbdev.showdoc import showdoc_nm
    skip = _flags()

    class api_entries(Processor):
        """After each exported cell, an API entry (mkdocstrings' `::: distrib.<module>.<name>`) for each public name it
        defines, unless the page has one already; a `@patch` method is headed `Class.name`"""
        def begin(self):
            mod = _default_exp(self.nb)
            if mod is None: return
            shown = {l.split()[1] for c in self.nb.cells if c.cell_type == 'markdown'
                     for l in c.source.splitlines() if l.startswith('::: ')}
            for cell in reversed([c for c in self.nb.cells if _want_doc(c)]):
                trees = cell.parsed_() or []
                entries = []
                for t in trees:
                    if isinstance(t, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)): names = [t.name]
                    elif isinstance(t, (ast.Assign, ast.AnnAssign)):    # a constant: its value and comment
                        names = [n.id for n in (t.targets if isinstance(t, ast.Assign) else [t.target])
                                 if isinstance(n, ast.Name)]
                    else: continue
                    for name in names:
                        path = f'distrib.{mod}.{name}'
                        if name.startswith('_') or path in shown: continue
                        nm = showdoc_nm(t) if not isinstance(t, (ast.Assign, ast.AnnAssign)) else name
                        entries.append(f'::: {path}' + (f'\n    options:\n      heading: "{nm}"' if nm != name else ''))
                if entries: self.nb.cells.insert(cell.idx_ + 1, mk_cell('\n\n'.join(entries), 'markdown'))

    class run_cells(Processor):
        "Run every code cell, storing its outputs, as `nbdev_test` runs them; raise at the first that fails"
        def begin(self): self.k = CaptureShell(nb_path)
        def cell(self, cell):
            d = cell.directives_
            if cell.cell_type != 'code' or skip & d.keys() or d.get('eval:', [''])[0].lower() == 'false': return
            self.k.cell(cell)
            if self.k.exc:
                raise RuntimeError(f"{nb_path.name}: cell {cell.idx_} raised:\n{cell.source}\n"
                                   f"{self.k.prettytb(fname=nb_path)}") from self.k.exc

    class title(Processor):
        "The frontmatter (the `# title` and `> subtitle` cell, which nbdev takes out for Quarto) back as the page's top"
        def begin(self):
            fm = getattr(self.nb, 'frontmatter_', {})
            self.nb.cells = [c for c in self.nb.cells if c.cell_type != 'raw']       # Quarto's YAML
            if fm.get('title'):
                head = f"# {fm['title']}" + (f"\n\n> {fm['description']}" if fm.get('description') else '')
                self.nb.cells.insert(0, mk_cell(head, 'markdown'))

    return [FrontmatterProc, populate_language, api_entries, hide_line, rm_header_dash, run_cells, strip_ansi,
            rm_export, clean_magics, hide_, strip_hidden_metadata, title]

def page(nb_path:Path)->float:
    "Run and process the notebook `nb_path`, then write it as Markdown (figures as PNG files) into `PAGES`; seconds"
    from execnb.nbio import read_nb, nb2str
    from fastcore.xtras import working_directory
    from nbdev.process import NBProcessor
    import nbformat
    from nbconvert import MarkdownExporter
    import multiprocessing
    multiprocessing.set_start_method('fork', force=True)  # as in a kernel: DataLoader workers of notebook classes
    start = time.time()
    os.environ['IN_TEST'] = '1'            # as nbdev_test
    nb = read_nb(nb_path)
    nb.path_ = str(nb_path)
    with working_directory(nb_path.parent): NBProcessor(nb=nb, procs=_procs(nb_path), process=True)
    for c in nb.cells:                      # nbdev's bookkeeping, not notebook JSON
        for k in ('directives_', 'idx_', 'has_sd'): c.pop(k, None)
    node = nbformat.reads(nb2str(nb), as_version=4)
    md, res = MarkdownExporter().from_notebook_node(node, resources={'output_files_dir': f'{nb_path.stem}_files'})
    (PAGES/f'{nb_path.stem}.md').write_text(md)
    for name, data in res.get('outputs', {}).items():
        (PAGES/name).parent.mkdir(parents=True, exist_ok=True)
        (PAGES/name).write_bytes(data)
    return time.time() - start

def build(names=(), n_workers:int=3):
    "Run and process the notebooks (`names`, default all) into `PAGES`, then build the site with MkDocs into `SITE`"
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context
    nbs = [NBS/f'{n.removesuffix(".ipynb")}.ipynb' for n in names] or sorted(NBS.glob('*.ipynb'))
    if not names: shutil.rmtree(PAGES, ignore_errors=True)
    PAGES.mkdir(parents=True, exist_ok=True)
    start = time.time()
    # a fresh process per notebook, as a kernel per notebook: what one notebook starts (notebook_launch's workers,
    # threads, a process group) cannot reach the next (a pool process reused after the distrib_ctx
    # notebook, which calls notebook_launch, died abruptly)
    with ProcessPoolExecutor(n_workers, mp_context=get_context('spawn'), max_tasks_per_child=1) as ex:
        secs = list(ex.map(page, nbs))
    slow = sorted(zip(secs, nbs), reverse=True)[:3]
    print(f"docs: {len(nbs)} notebooks run in {time.time() - start:.0f} s ({n_workers} workers; slowest: "
          f"{', '.join(f'{p.stem} {s:.0f} s' for s, p in slow)})")
    subprocess.run([sys.executable, '-m', 'mkdocs', 'build', '-q', '--strict', '-f', str(ROOT/'mkdocs.yml')],
                   check=True)
    print(f"docs: {len(list(PAGES.glob('*.md')))} pages in {SITE}")

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('names', nargs='*', help='notebooks to build (default: all)')
    p.add_argument("--n_workers", type=int, default=3)
    a = p.parse_args()
    build(a.names, a.n_workers)
