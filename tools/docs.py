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
import argparse, ast, json, os, re, shutil, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBS, PAGES, SITE = ROOT/'nbs', ROOT/'_proc'/'docs', ROOT/'_docs'

NOTES = '## Design notes and checks'   # the heading between what a user calls and how it works
CSS = """.md-grid { max-width: 100rem; }   /* code and outputs 120 characters wide fit on a wide screen */
.md-typeset img { max-width: min(100%, 40rem); }   /* a figure at about the size matplotlib drew it */
"""

def _demote(md:str)->str:
    "The Markdown `md` with its headings one level down (`## x` -> `### x`), code blocks left as they are"
    out, fenced = [], False
    for line in md.splitlines():
        if line.startswith('```'): fenced = not fenced
        out.append('#' + line if not fenced and re.match(r'#{1,5} ', line) else line)
    return '\n'.join(out)

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

    class split_title(Processor):
        """The title cell keeps its `# title`, `> subtitle` and `- key: value` lines, which nbdev's frontmatter takes
        (and drops the cell); any other text of it goes to a cell of its own below (the index's first paragraph)"""
        def begin(self):
            for cell in self.nb.cells:
                if cell.cell_type != 'markdown': continue
                if not cell.source.lstrip().startswith('# '): return
                head, rest = [], []
                for line in cell.source.splitlines():
                    (head if not rest and (not line.strip() or line[:2] in ('# ', '> ', '- ')) else rest).append(line)
                if rest:
                    cell.source = '\n'.join(head).strip()
                    self.nb.cells.insert(self.nb.cells.index(cell) + 1, mk_cell('\n'.join(rest).strip(), 'markdown'))
                return

    class api_entries(Processor):
        """The API entries of the page (mkdocstrings' `::: distrib.<module>.<name>`), kept in `nb.api_` for `layout`:
        one for each public name the notebook's exported cells define, in their order (the `__all__` order), less
        those the page shows already; a `@patch` method is headed `Class.name`"""
        def begin(self):
            self.nb.api_ = []
            mod = _default_exp(self.nb)
            if mod is None: return
            shown = {l.split()[1] for c in self.nb.cells if c.cell_type == 'markdown'
                     for l in c.source.splitlines() if l.startswith('::: ')}
            for cell in [c for c in self.nb.cells if _want_doc(c)]:
                for t in cell.parsed_() or []:
                    if isinstance(t, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)): names = [t.name]
                    elif isinstance(t, (ast.Assign, ast.AnnAssign)):    # a constant: its value and comment
                        names = [n.id for n in (t.targets if isinstance(t, ast.Assign) else [t.target])
                                 if isinstance(n, ast.Name)]
                    else: continue
                    for name in names:
                        path = f'distrib.{mod}.{name}'
                        if name.startswith('_') or path in shown: continue
                        shown.add(path)
                        nm = showdoc_nm(t) if not isinstance(t, (ast.Assign, ast.AnnAssign)) else name
                        head = f'\n    options:\n      heading: "{nm}"' if nm != name else ''
                        self.nb.api_.append(f'::: {path}{head}')

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

    class layout(Processor):
        """What a user calls first. A notebook with a `## Design notes and checks` cell wrote its top by hand: the API
        entries it lacks go after its last entry there (or after the top's cells before its first `## ` section).
        Any other module page gets, right after its title and subtitle, all its API entries, then a `## Design notes
        and checks` heading above the notebook's own cells. The headings after that heading go one level down."""
        def begin(self):
            cells, api = self.nb.cells, getattr(self.nb, 'api_', [])
            marker = next((i for i, c in enumerate(cells) if c.cell_type == 'markdown'
                           and c.source.splitlines()[:1] == [NOTES]), None)
            if marker is None:
                if not api: return
                top = 1 if cells and cells[0].source.startswith('# ') else 0
                cells.insert(top, mk_cell(NOTES, 'markdown'))
                marker = top
                at = top
            else:
                user = cells[:marker]
                md = [i for i, c in enumerate(user) if c.cell_type == 'markdown']
                entries = [i for i in md if any(l.startswith('::: ') for l in user[i].source.splitlines())]
                sections = [i for i in md[1:] if user[i].source.startswith('## ')]
                at = entries[-1] + 1 if entries else sections[0] if sections else marker
            if api: cells.insert(at, mk_cell('\n\n'.join(api), 'markdown')); marker += at <= marker
            for c in cells[marker+1:]:
                if c.cell_type == 'markdown': c.source = _demote(c.source)

    class page_links(Processor):
        """A link to a notebook (`[the launcher](39_launch.cli.ipynb)`, which works on GitHub) goes to its page; so does
        the README's (`nbs/39_launch.cli.ipynb`, from the repository's root), on the home page made from it"""
        def cell(self, cell):
            if cell.cell_type == 'markdown':
                cell.source = re.sub(r'\]\((?:nbs/)?([\w.-]+)\.ipynb(#[^)]*)?\)', r'](\1.md\2)', cell.source)

    return [split_title, FrontmatterProc, populate_language, api_entries, hide_line, rm_header_dash, run_cells,
            strip_ansi, rm_export, clean_magics, hide_, strip_hidden_metadata, title, layout, page_links]

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
    node.metadata['language_info'] = {'name': 'python'}     # code blocks as ```python, highlighted
    md, res = MarkdownExporter().from_notebook_node(node, resources={'output_files_dir': f'{nb_path.stem}_files'})
    (PAGES/f'{nb_path.stem}.md').write_text(md)
    for name, data in res.get('outputs', {}).items():
        (PAGES/name).parent.mkdir(parents=True, exist_ok=True)
        (PAGES/name).write_bytes(data)
    if 'torch._dynamo' in sys.modules: sys.modules['torch._dynamo'].reset()   # else its caches complain at exit
    return time.time() - start

def build(names=(), n_workers:int=3):
    "Run and process the notebooks (`names`, default all) into `PAGES`, then build the site with MkDocs into `SITE`"
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context
    nbs = [NBS/f'{n.removesuffix(".ipynb")}.ipynb' for n in names] or sorted(NBS.glob('*.ipynb'))
    if not names: shutil.rmtree(PAGES, ignore_errors=True)
    PAGES.mkdir(parents=True, exist_ok=True)
    (PAGES/'extra.css').write_text(CSS)
    start = time.time()
    # a fresh process per notebook, as a kernel per notebook: what one notebook starts (notebook_launch's workers,
    # threads, a process group) cannot reach the next (a pool process reused after the distrib_ctx
    # notebook, which calls notebook_launch, died abruptly). Each is forked from a server that imported the heavy
    # modules once (torch, IPython, nbdev, nbconvert) and started no thread: a notebook's process then starts in a
    # fraction of a second instead of importing them again (64 notebooks: about a minute of 2 cores)
    ctx = get_context('forkserver')
    ctx.set_forkserver_preload(['torch', 'torch.distributed', 'IPython', 'execnb.shell', 'nbdev.process',
                                'nbdev.processors', 'nbconvert', 'nbformat'])
    with ProcessPoolExecutor(n_workers, mp_context=ctx, max_tasks_per_child=1) as ex:
        secs = list(ex.map(page, nbs))
    slow = sorted(zip(secs, nbs), reverse=True)[:3]
    print(f"docs: {len(nbs)} notebooks run in {time.time() - start:.0f} s ({n_workers} workers; slowest: "
          f"{', '.join(f'{p.stem} {s:.0f} s' for s, p in slow)})")
    subprocess.run([sys.executable, '-m', 'mkdocs', 'build', '-q', '--strict', '-f', str(ROOT/'mkdocs.yml')],
                   check=True, env={**os.environ, 'NO_MKDOCS_2_WARNING': '1'})   # no banner about MkDocs 2
    print(f"docs: {len(list(PAGES.glob('*.md')))} pages in {SITE}")

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('names', nargs='*', help='notebooks to build (default: all)')
    p.add_argument("--n_workers", type=int, default=3)
    a = p.parse_args()
    build(a.names, a.n_workers)
