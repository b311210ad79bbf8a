"""The package's layout: layers that import only from below, modules under 300 lines, no silent broad `except`.

These read the source (with `ast`), so they run in a fraction of a second and name the file and line at fault."""
import ast
from pathlib import Path
import pytest

PKG = Path(__file__).resolve().parent.parent/'distrib'

# Lowest first: a module may import from its own layer and the ones before it, never from a later one
LAYERS = [
    ('runtime', ['distrib.runtime']),
    ('data', ['distrib.data']),
    ('loop', ['distrib.callback.core', 'distrib.metrics', 'distrib.recorder', 'distrib.files', 'distrib.state',
              'distrib.saving', 'distrib.learner']),
    ('callbacks', ['distrib.callback']),
    ('strategies', ['distrib.strategies']),
    ('launch', ['distrib.launch', 'distrib.env']),
    ('api', ['distrib']),
]
MAX_LINES = 300

def module_name(path:Path)->str:
    parts = path.relative_to(PKG.parent).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)

def modules()->list:
    return sorted(p for p in PKG.rglob('*.py') if p.name != '_modidx.py')

def layer(name:str)->int:
    "The index in `LAYERS` of module `name`: the longest matching prefix wins (`distrib.callback.core` is the loop)"
    best = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for pre in prefixes:
            if (name == pre or name.startswith(pre + '.')) and (best is None or len(pre) > best[1]):
                best = (i, len(pre))
    assert best is not None, f"{name} is in no layer: add it to LAYERS"
    return best[0]

def imported(path:Path)->list:
    "`(line, module)` for every import of a distrib module in `path`, at any depth (functions too), made absolute"
    name, out = module_name(path), []
    package = name if path.name == '__init__.py' else name.rpartition('.')[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split('.')[:len(package.split('.')) - node.level + 1]
                mod = '.'.join(base + ([node.module] if node.module else []))
            else: mod = node.module or ''
            targets = [mod] if node.module else [f"{mod}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import): targets = [a.name for a in node.names]
        else: continue
        out += [(node.lineno, t) for t in targets if t == 'distrib' or t.startswith('distrib.')]
    return out

def test_layers_cover_every_module():
    for p in modules(): layer(module_name(p))

@pytest.mark.parametrize('path', modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_no_import_from_a_layer_above(path):
    me = layer(module_name(path))
    bad = [f"line {ln}: {mod} ({LAYERS[layer(mod)][0]})" for ln, mod in imported(path) if layer(mod) > me]
    assert not bad, f"{path.relative_to(PKG.parent)} ({LAYERS[me][0]}) imports from a layer above it: {bad}"

def test_modules_are_short():
    long = {str(p.relative_to(PKG.parent)): n for p in modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"

def _swallows(handler:ast.ExceptHandler)->bool:
    "True unless the handler's body raises (at its top level or in an if/else branch that ends it)"
    return not any(isinstance(n, ast.Raise) for n in ast.walk(handler))

def test_broad_excepts_reraise_or_say_why():
    "Every `except Exception`/`except BaseException`/bare `except` re-raises, or its line has a comment saying why"
    bad = []
    for p in modules():
        lines = p.read_text().splitlines()
        for node in ast.walk(ast.parse('\n'.join(lines))):
            if not isinstance(node, ast.ExceptHandler): continue
            names = ('Exception', 'BaseException')
            broad = node.type is None or (isinstance(node.type, ast.Name) and node.type.id in names)
            if broad and _swallows(node) and '#' not in lines[node.lineno - 1]:
                bad.append(f"{p.relative_to(PKG.parent)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not bad, "broad excepts that swallow without a comment saying why:\n" + '\n'.join(bad)

def test_checks_fail_on_a_bad_tree(tmp_path, monkeypatch):
    "The checks above can fail: a runtime module importing the Learner, or a long module, is caught"
    bad = tmp_path/'distrib'/'runtime'; bad.mkdir(parents=True)
    (bad/'x.py').write_text("def f():\n    from ..learner import Learner\n    try: pass\n    except Exception: pass\n")
    monkeypatch.setattr(__import__(__name__), 'PKG', tmp_path/'distrib')
    p = bad/'x.py'
    assert imported(p) == [(2, 'distrib.learner')] and layer('distrib.learner') > layer(module_name(p))
    handler = next(n for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ExceptHandler))
    assert _swallows(handler)

def test_readme_is_the_index_notebook():
    "README.md (written by hand) and nbs/index.ipynb (the docs' home page) say the same: tools/readme_to_index.py"
    import json, sys
    sys.path.insert(0, str(PKG.parent/'tools'))
    from readme_to_index import sections, index_markdown, README, INDEX
    readme, index = sections(README.read_text()), index_markdown(json.loads(INDEX.read_text()))
    differ = [r.split('\n', 1)[0] for r, i in zip(readme, index) if r != i]
    assert len(readme) == len(index) and not differ, (
        f"README.md has {len(readme)} sections, nbs/index.ipynb {len(index)} markdown cells; differing: {differ}. "
        "Run python tools/readme_to_index.py && nbdev_clean")
