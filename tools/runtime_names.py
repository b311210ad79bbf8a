"""The runtime's interface, counted: each `distrib.runtime` module's lines, its public names (its `__all__`: what the
runtime offers the layers above) and its package-internal names (top-level names without an underscore that are not in
`__all__`: the notebooks' `#| exporti` cells, which the runtime's own modules import from each other), and who imports
each name (the layers above, other runtime modules, or only tests, notebooks and benchmarks), read with `ast`.
It flags an internal name a layer above imports (tests/test_layout.py fails on it too) and a public name no layer
above imports (a candidate for internal, unless it is documented for users: `RankState`).

    python tools/runtime_names.py        # one line per module, then the totals and the flags
    python tools/runtime_names.py -v     # and each name with its importers"""
import ast, json, sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT/'distrib'

def module_name(p:Path)->str:
    parts = p.relative_to(ROOT).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)

def absolute(node:ast.ImportFrom, p:Path)->str:
    "The module an `ImportFrom` in file `p` imports from, made absolute"
    if not node.level: return node.module or ''
    pkg = module_name(p) if p.name == '__init__.py' else module_name(p).rpartition('.')[0]
    base = pkg.split('.')[:len(pkg.split('.')) - node.level + 1]
    return '.'.join(base + ([node.module] if node.module else []))

def all_of(p:Path)->list:
    for n in ast.parse(p.read_text()).body:
        if isinstance(n, ast.Assign) and any(getattr(t, 'id', None) == '__all__' for t in n.targets):
            return [e.value for e in n.value.elts]
    return []

def importers()->dict:
    "(module, name) -> the modules, test files and notebooks that import it"
    users = defaultdict(set)
    files = [p for p in PKG.rglob('*.py') if p.name != '_modidx.py']
    files += list((ROOT/'tests').rglob('*.py')) + list((ROOT/'bench').rglob('*.py'))
    for p in files:
        ours = p.is_relative_to(PKG)
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                mod = absolute(node, p) if ours else (node.module or '')
                for a in node.names: users[(mod, a.name)].add(module_name(p) if ours else str(p.relative_to(ROOT)))
    for nb in sorted((ROOT/'nbs').glob('*.ipynb')):   # the notebooks' checks (their exported cells are distrib/)
        for c in json.loads(nb.read_text())['cells']:
            src = ''.join(c['source'])
            if c['cell_type'] != 'code' or src.startswith('#| export'): continue
            try: tree = ast.parse('\n'.join(l for l in src.splitlines() if not l.lstrip().startswith(('!', '%'))))
            except SyntaxError: continue
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module:
                    for a in node.names: users[(node.module, a.name)].add(f'nb:{nb.stem}')
    return users

def internal_of(p:Path)->list:
    "The names module `p` defines at its top level (functions, classes, assignments), not in `__all__`, no `_` first"
    pub, out = set(all_of(p)), []
    for n in ast.parse(p.read_text()).body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)): names = [n.name]
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            names = [t.id for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)]
        else: continue
        out += [x for x in names if not x.startswith('_') and x not in pub and x not in out]
    return out

def kind_of(u:set)->str:
    "'above', 'runtime', 'tests/docs' or 'none': the highest kind of importer among `u`"
    lib = {x for x in u if x.startswith('distrib')}
    return ('above' if any(not x.startswith('distrib.runtime') for x in lib) else 'runtime' if lib else
            'tests/docs' if u else 'none')

def main(verbose:bool=False):
    users, lines = importers(), 0
    pub_kinds, int_kinds, flags = defaultdict(int), defaultdict(int), []
    for p in sorted(p for p in (PKG/'runtime').glob('*.py') if p.name != '__init__.py'):
        m, pub, internal, n = module_name(p), all_of(p), internal_of(p), len(p.read_text().splitlines())
        lines += n
        print(f"{m:30s} {n:5d} lines {len(pub):3d} public {len(internal):3d} internal")
        for label, names, kinds in (('public', pub, pub_kinds), ('internal', internal, int_kinds)):
            for name in names:
                u = users.get((m, name), set())
                kind = kind_of(u)
                kinds[kind] += 1
                above = sorted(x for x in u if x.startswith('distrib') and not x.startswith('distrib.runtime'))
                if label == 'public' and kind != 'above':
                    flags.append(f"public, not used above the runtime: {m}.{name} ({kind})")
                if label == 'internal' and kind == 'above':
                    flags.append(f"internal, used above the runtime: {m}.{name} by {', '.join(above)}")
                if verbose: print(f"    {label:8s} {name:28s} {kind:10s} {', '.join(sorted(u))}")
    n_pub, n_int = sum(pub_kinds.values()), sum(int_kinds.values())
    print(f"{'total':30s} {lines:5d} lines")
    print(f"  public (in __all__): {n_pub}: used above the runtime {pub_kinds['above']}, only between runtime modules "
          f"{pub_kinds['runtime']}, only by tests or docs {pub_kinds['tests/docs']}, by none {pub_kinds['none']}")
    print(f"  internal (#| exporti): {n_int}: used between runtime modules {int_kinds['runtime']}, used above the "
          f"runtime {int_kinds['above']} (must be 0), only by tests or docs {int_kinds['tests/docs']}, "
          f"by none {int_kinds['none']}")
    for f in flags: print(f"  flag: {f}")

if __name__ == '__main__': main('-v' in sys.argv)
