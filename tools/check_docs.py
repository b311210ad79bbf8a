"""Check the built documentation site (`_docs/`, from `python tools/docs.py`) in a real browser: Debian's
`chromium`, headless, with a fresh profile. Every page loads (chromium renders it, scripts run, and the DOM it
dumps has the page's `<h1>`); every internal link resolves (the file exists, and the anchor is an element id of
the rendered target); every public name each module defines (its `__all__`, less what it re-exports, as
`distrib/__init__.py` does, and the methods it adds with `@patch`) has its API entry on its notebook's page
(mkdocstrings' heading, whose id is the name's path); the figures of the pages of `FIGURES`' modules render
(chromium loads each image: its natural width and height are not 0); every notebook of `nbs/` has its page, and
the home page's navigation links it (the guides too, which export no module); every link of README.md goes to a
notebook (`nbs/NN_x.ipynb`, as GitHub shows it) whose page is built, with the anchor it names, and the home page (made
from README.md) links that page there; a screenshot of the index is written to `_proc/docs_check/index.png` (and must
not be blank). Prints one line per problem and exits 1 when there is any. Usage: python tools/check_docs.py [site dir]"""
import ast, json, re, shutil, subprocess, sys, tempfile
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit, unquote

ROOT = Path(__file__).resolve().parent.parent
SITE = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT/'_docs'
OUT = ROOT/'_proc'/'docs_check'
FIGURES = ('distrib.callback.lr_find', 'distrib.recorder')   # modules whose pages show figures (lr_find, plot_loss)
FLAGS = ['--no-sandbox', '--headless', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
         '--disable-sync', '--no-first-run']

class Page(HTMLParser):
    "The ids, links and `<h1>` count of an HTML document"
    def __init__(self, text):
        super().__init__()
        self.ids, self.hrefs, self.h1 = set(), [], 0
        self.feed(text)
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get('id'): self.ids.add(a['id'])
        if tag == 'a' and a.get('href'): self.hrefs.append(a['href'])
        if tag == 'h1': self.h1 += 1

def chromium()->str:
    for name in ('chromium', 'chromium-browser', 'google-chrome'):
        if path := shutil.which(name): return path
    sys.exit("check_docs: no chromium found (Debian: apt-get install -y chromium)")

def run(args:list, timeout:float=90)->subprocess.CompletedProcess:
    "Chromium with `args`, a fresh profile of its own"
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([chromium(), *FLAGS, f'--user-data-dir={profile}', *args], capture_output=True,
                              text=True, timeout=timeout)

def dump(html:Path)->str:
    "The DOM chromium renders for `html`, after its scripts ran"
    r = run(['--virtual-time-budget=3000', '--dump-dom', html.as_uri()])
    if r.returncode: raise RuntimeError(f"chromium exited {r.returncode} on {html.name}: {r.stderr[-500:]}")
    return r.stdout

def defined_in(tree:ast.Module)->set:
    "The names a module's source (parsed: `tree`) binds at its top level (functions, classes, assignments), not imports"
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)): out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {t.id for t in targets if isinstance(t, ast.Name)}
    return out

def source_of(mod:str)->Path:
    """The file of distrib module `mod` (`distrib.fastai.data` -> `distrib/fastai/data.py`, a package's
    `__init__.py`), found without importing it or its package"""
    f = ROOT/(mod.replace('.', '/') + '.py')
    return f if f.exists() else ROOT/mod.replace('.', '/')/'__init__.py'

def public_names(mod:str)->list:
    """The names of the module's `__all__` it defines itself, then the `Class.method` names its `@patch` functions add
    (fastcore's patch binds no name). Read from the source, not imported: `distrib.fastai` needs fastai, which the
    docs' environment has not (fastai needs fastcore 2, the development tools pin 1.14)"""
    tree = ast.parse(source_of(mod).read_text())
    names = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                  and any(getattr(t, 'id', None) == '__all__' for t in n.targets)), [])
    patched = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and not
               n.name.startswith('_') and any(getattr(d, 'id', None) == 'patch' for d in n.decorator_list)]
    return [n for n in names if n in defined_in(tree)] + patched

_FIGS = """<!doctype html><html><body><script>
const pages = %s, out = {};
pages.forEach(p => {
  const f = document.createElement('iframe'); f.src = p;
  f.onload = () => {
    const imgs = [...f.contentDocument.querySelectorAll('article img')];
    Promise.all(imgs.map(i => i.decode().catch(() => null))).then(() => {
      out[p] = imgs.map(i => [i.getAttribute('src'), i.naturalWidth, i.naturalHeight]);
      if (Object.keys(out).length == pages.length) {
        const pre = document.createElement('pre'); pre.id = 'figures'; pre.textContent = JSON.stringify(out);
        document.body.appendChild(pre);
      }
    });
  };
  document.body.appendChild(f);
});
</script></body></html>"""

def figures(pages:list)->dict:
    """page -> [(src, natural width, natural height)] of the images in its content, as chromium renders them (the
    pages loaded in frames of one page, which reads their images once decoded)"""
    OUT.mkdir(parents=True, exist_ok=True)
    html = OUT/'figures.html'
    html.write_text(_FIGS % json.dumps([p.as_uri() for p in pages]))
    for _ in range(3):    # a loaded machine may not have decoded them within the virtual time budget: again
        r = run(['--allow-file-access-from-files', '--virtual-time-budget=30000', '--dump-dom', html.as_uri()])
        if m := re.search(r'<pre id="figures">(.*?)</pre>', r.stdout, re.S): break
    else: return {}
    import html as h
    return {Path(urlsplit(k).path).name: v for k, v in json.loads(h.unescape(m.group(1))).items()}

def module_pages()->dict:
    "page name -> the module its notebook exports (from its `#| default_exp`)"
    out = {}
    for nb in (ROOT/'nbs').glob('*.ipynb'):
        for c in json.loads(nb.read_text())['cells']:
            if c['cell_type'] == 'code' and (m := re.search(r'#\|\s*default_exp\s+(\S+)', ''.join(c['source']))):
                out[f'{nb.stem}.html'] = f'distrib.{m.group(1)}'.removesuffix('.__init__')   # a package's page
                break
    return out

def readme_links(text:str)->list:
    """The targets of the Markdown links of `text` (README.md), outside code blocks and code spans, but web addresses
    (`http`, `https`, `mailto`)"""
    text = re.sub(r'^```.*?^```', '', text, flags=re.S | re.M)
    text = re.sub(r'`[^`\n]*`', '', text)
    return [t for t in re.findall(r'\]\(([^)\s]+)\)', text) if urlsplit(t).scheme not in ('http', 'https', 'mailto')]

def readme_problems(site:Path, home:Page)->list:
    """Each link of README.md must go to a notebook (`nbs/NN_x.ipynb[#anchor]`: on GitHub the notebook, on the site its
    page, as tools/docs.py rewrites it) whose page `site` has, with that anchor among its ids; the home page `home`
    (README.md, through nbs/index.ipynb) must link that page and anchor"""
    out = []
    for t in readme_links((ROOT/'README.md').read_text()):
        u = urlsplit(t)
        m = re.fullmatch(r'nbs/([\w.-]+)\.ipynb', u.path)
        if not m:
            out.append(f"README.md: link {t!r} is not a notebook's (nbs/NN_x.ipynb): the site has no page for it"); continue
        page = site/f'{m.group(1)}.html'
        href = page.name + (f'#{u.fragment}' if u.fragment else '')
        if not page.exists(): out.append(f"README.md: link {t!r}: no page {page.name}"); continue
        if u.fragment and unquote(u.fragment) not in Page(page.read_text()).ids:
            out.append(f"README.md: link {t!r}: no id {u.fragment!r} on {page.name}")
        if href not in home.hrefs: out.append(f"README.md: link {t!r}: the home page does not link {href}")
    return out

def main():
    pages = sorted(p for p in SITE.rglob('*.html') if p.name != '404.html')
    if not (SITE/'index.html').exists(): sys.exit(f"check_docs: {SITE}/index.html is missing (python tools/docs.py)")
    with ThreadPoolExecutor(2) as ex: doms = dict(zip(pages, ex.map(dump, pages)))
    parsed, problems = {p: Page(t) for p, t in doms.items()}, []
    for p, page in parsed.items():
        name = p.relative_to(SITE)
        if page.h1 < 1 or '</html>' not in doms[p]: problems.append(f"{name}: did not render (no <h1>)")
        for href in page.hrefs:
            u = urlsplit(href)
            if u.scheme in ('http', 'https', 'mailto') or href == '#': continue
            target = (p.parent/unquote(u.path)).resolve() if u.path else p
            if target.is_dir(): target = target/'index.html'
            if not target.exists(): problems.append(f"{name}: link {href!r}: no {target.relative_to(SITE)}"); continue
            if u.fragment and target.suffix == '.html':
                ids = parsed[target].ids if target in parsed else Page(target.read_text()).ids
                if unquote(u.fragment) not in ids: problems.append(f"{name}: link {href!r}: no id {u.fragment!r}")
    for page, mod in module_pages().items():
        p = SITE/page
        if p not in parsed: problems.append(f"{page}: missing"); continue
        missing = [n for n in public_names(mod) if f"{mod}.{n}" not in parsed[p].ids]
        if missing: problems.append(f"{page}: no API entry for {', '.join(missing)}")
    home = parsed[SITE/'index.html']
    for nb in sorted((ROOT/'nbs').glob('*.ipynb')):    # every notebook has its page, in the navigation
        if nb.stem == 'index': continue
        if not (SITE/f'{nb.stem}.html').exists(): problems.append(f"{nb.name}: no page {nb.stem}.html"); continue
        if f'{nb.stem}.html' not in home.hrefs: problems.append(f"{nb.stem}.html: not in the navigation")
    n_readme = len(readme_links((ROOT/'README.md').read_text()))
    problems += readme_problems(SITE, home)
    fig_pages = [SITE/page for page, mod in module_pages().items() if mod in FIGURES]
    figs = figures(fig_pages)
    for p in fig_pages:
        imgs = figs.get(p.name)
        if imgs is None: problems.append(f"{p.name}: the figures check did not load it")
        elif not imgs: problems.append(f"{p.name}: no figure")
        for src, w, hgt in imgs or []:
            if not (w and hgt): problems.append(f"{p.name}: the figure {src} does not render ({w}x{hgt})")
    OUT.mkdir(parents=True, exist_ok=True)
    shot = OUT/'index.png'
    shot.unlink(missing_ok=True)
    run([f'--screenshot={shot}', '--window-size=1280,1000', '--hide-scrollbars', (SITE/'index.html').as_uri()])
    if not shot.exists(): problems.append("index.html: no screenshot")
    else:
        try:
            import matplotlib.image
            blank = matplotlib.image.imread(shot).std() < 0.02      # one colour: nothing drawn
        except ImportError: blank = shot.stat().st_size < 20_000   # a one-colour 1280x1000 PNG is a few KB
        if blank: problems.append(f"index.html: the screenshot {shot} is blank")
    n_links = sum(len(p.hrefs) for p in parsed.values())
    for line in problems: print(f"check_docs: {line}")
    n_figs = sum(len(v) for v in figs.values())
    print(f"check_docs: {len(pages)} pages, {n_links} links, {len(module_pages())} module pages, {n_readme} README links, "
          f"{n_figs} figures; "
          f"{'OK' if not problems else f'{len(problems)} problems'}; screenshot {shot}")
    sys.exit(1 if problems else 0)

if __name__ == '__main__': main()
