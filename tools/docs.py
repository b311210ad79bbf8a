"""Build the documentation site from the notebooks: `python tools/docs.py` writes `_docs/` (an `index.html` from
`nbs/index.ipynb`, then one page per notebook, in the notebooks' order, with their sections as they are).

Each page keeps its notebook's cells: the prose, then, where a cell exports definitions, the documentation of each
public name it defines (the module's `__all__`, and methods added with fastcore's `@patch`): its signature as
nbdev's `show_doc` writes it (with the parameters' comments) and its docstring, then the public methods with a
docstring of its own; the checks and examples as code. Hidden cells (`#| hide`) and the exported source are left
out, as nbdev's own docs do. The pages are Markdown, written to `_proc/docs/`, built into HTML by MkDocs
(`mkdocs build --strict`: a link to a missing page or anchor fails the build). Needs the `docs` extra
(`pip install -e ".[docs]"`: mkdocs, nbdev) and the package installed (the names are imported from it)."""
import ast, importlib, inspect, json, re, shutil, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBS, SRC, SITE = ROOT/'nbs', ROOT/'_proc'/'docs', ROOT/'_docs'
_DIRECTIVE = re.compile(r'^\s*#\|\s*(.*)$')

def directives(src:str)->list:
    "The words of the cell's `#| ...` lines"
    return [w for line in src.splitlines() if (m := _DIRECTIVE.match(line)) for w in m.group(1).split()]

def strip_directives(src:str)->str: return '\n'.join(l for l in src.splitlines() if not _DIRECTIVE.match(l)).strip()

def defined(src:str)->list:
    "Top-level names a cell defines, in order: functions, classes, assignments; `Cls.name` for a `@patch` function"
    try: tree = ast.parse(strip_directives(src))
    except SyntaxError: return []
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            patched = any(getattr(d, 'id', None) == 'patch' for d in getattr(node, 'decorator_list', []))
            if patched and node.args.args and isinstance(node.args.args[0].annotation, ast.Name):
                out.append(f'{node.args.args[0].annotation.id}.{node.name}')
            else: out.append(node.name)
        elif isinstance(node, ast.Assign):
            out += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return out

def signature(obj, name:str)->str:
    "The signature of `obj` as nbdev's `show_doc` writes it (a fenced Python block), `class` for a class"
    from nbdev.showdoc import show_doc
    md = show_doc(obj, name=name)._repr_markdown_()
    m = re.search(r'```python\n.*?```', md, re.S)
    if m is None: return f'```python\n{name}\n```'
    sig = m.group(0)
    return sig.replace('def ', 'class ', 1) if inspect.isclass(obj) else sig

_SECTION = re.compile(r'^(Args|Arguments|Returns|Raises|Yields|Example|Examples)s?:{1,2}\s*$')

def docstring(doc:str)->str:
    """A Google-style docstring as Markdown: its `Args:` entries a list (continuation lines joined), an `Example::`
    section a code block, the rest as it is"""
    out, section = [], None
    for line in doc.splitlines():
        if m := _SECTION.match(line):
            section = m.group(1)
            out += ['', f'**{section}:**', '']
            if section.startswith('Example'): out.append('```python')
        elif section and (line.startswith('    ') or not line.strip()):
            if section.startswith('Example'): out.append(line[4:])
            elif line.startswith('    ') and not line.startswith('     '): out.append('- ' + line.strip())
            else: out.append('  ' + line.strip())
        else:
            if section and section.startswith('Example'): out.append('```')
            section = None
            out.append(line)
    if section and section.startswith('Example'): out.append('```')
    return '\n'.join(out)

def doc_of(obj, name:str, level:int=3)->str:
    "Markdown for `obj`: a heading, its signature, its docstring"
    return f"{'#'*level} `{name}`\n\n{signature(obj, name)}\n\n{docstring(inspect.getdoc(obj) or '')}\n"

def const_of(obj, name:str)->str:
    "Markdown for a constant: a heading and its value"
    v = repr(obj)
    return f"### `{name}`\n\n```python\n{name} = {v if len(v) <= 300 else v[:300] + ' ...'}\n```\n"

def methods_of(cls)->list:
    "The public methods, properties excluded, defined in `cls`'s own body with a docstring of their own"
    return [(k, v) for k, v in vars(cls).items() if not k.startswith('_') and inspect.isfunction(v) and v.__doc__]

def api_docs(module, names:list)->str:
    "The documentation of the public `names` of `module` (in `__all__`, or `Cls.method` patched onto its classes)"
    public, parts = set(getattr(module, '__all__', [])), []
    for name in names:
        if '.' in name:
            cls, meth = name.split('.', 1)
            if cls in public and not meth.startswith('_'): parts.append(doc_of(getattr(getattr(module, cls), meth), name))
        elif name in public:
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or callable(obj)):
                parts.append(const_of(obj, name))
                continue
            parts.append(doc_of(obj, name))
            if inspect.isclass(obj):
                parts += [doc_of(f, f'{name}.{k}', 4) for k, f in methods_of(obj)]
    return '\n'.join(parts)

def links(md:str)->str:
    "Links to notebooks (`x.ipynb`, `nbs/x.ipynb`) point to their pages"
    return re.sub(r'\]\((?:nbs/)?([\w.-]+)\.ipynb(#[^)]*)?\)', lambda m: f']({m.group(1)}.md{m.group(2) or ""})', md)

SECTIONS = {'runtime': 'Runtime', 'strategies': 'Strategies', 'launch': 'Launch', 'callback': 'Callbacks'}

def page(nb_path:Path)->tuple:
    "(title, section, Markdown) of the notebook `nb_path`: its section from its module's subpackage"
    cells = json.loads(nb_path.read_text())['cells']
    src = lambda c: ''.join(c['source'])
    exp = next((d.split()[1] for c in cells if c['cell_type'] == 'code' for d in [' '.join(directives(src(c)))]
                if d.startswith('default_exp')), None)
    module = importlib.import_module(f'distrib.{exp}') if exp else None
    out, title = [], nb_path.stem
    for c in cells:
        s = src(c)
        if c['cell_type'] == 'markdown':
            if title == nb_path.stem and (m := re.match(r'#\s+(.+)', s)): title = m.group(1).strip()
            out.append(links(s))
            continue
        ds = directives(s)
        if 'hide' in ds or any(d.startswith('default_exp') for d in ds): continue
        if 'export' in ds or 'exports' in ds:
            if module is not None and (d := api_docs(module, defined(s))): out.append(d)
            continue
        code = strip_directives(s)
        if code: out.append(f'```python\n{code}\n```')
    section = 'Home' if nb_path.stem == 'index' else SECTIONS.get(exp.split('.')[0], 'Training loop') if exp else 'Notes'
    return title, section, '\n\n'.join(out) + '\n'

def build(strict:bool=True):
    "Write the pages to `SRC`, the MkDocs configuration beside them, and build the site into `SITE`"
    shutil.rmtree(SRC, ignore_errors=True)
    (SRC/'pages').mkdir(parents=True)
    nav = {}
    for nb in sorted(NBS.glob('*.ipynb'), key=lambda p: (p.stem != 'index', p.stem)):
        title, section, md = page(nb)
        (SRC/'pages'/f'{nb.stem}.md').write_text(md)
        nav.setdefault(section, []).append({title: f'{nb.stem}.md'})
    order = ['Home', 'Training loop', 'Runtime', 'Strategies', 'Launch', 'Callbacks', 'Notes']
    nav = [{'Home': 'index.md'}] + [{k: nav[k]} for k in order[1:] if k in nav]
    cfg = dict(site_name='distrib', docs_dir='pages', site_dir=str(SITE), use_directory_urls=False, nav=nav,
               theme={'name': 'mkdocs', 'highlightjs': False, 'navigation_depth': 3},
               markdown_extensions=['tables', 'fenced_code', {'toc': {'permalink': True}}],
               validation={'links': {'not_found': 'warn', 'anchors': 'warn', 'unrecognized_links': 'warn'}})
    (SRC/'mkdocs.yml').write_text(json.dumps(cfg, indent=1))   # JSON is YAML
    subprocess.run([sys.executable, '-m', 'mkdocs', 'build', '-q', *(['--strict'] if strict else []), '-f',
                    str(SRC/'mkdocs.yml')], check=True)
    print(f"docs: {len(list(SRC.glob('pages/*.md')))} pages in {SITE}")

if __name__ == '__main__': build()
