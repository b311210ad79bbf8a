"""The runtime's interface, counted: each `distrib.runtime` module's lines and public names (its `__all__`), and who
imports each name (the layers above, other runtime modules, or only tests, notebooks and benchmarks), read with `ast`.

    python tools/runtime_names.py        # one line per module, then the totals
    python tools/runtime_names.py -v     # and each public name with its importers"""
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

def main(verbose:bool=False):
    users, lines, names, kinds = importers(), 0, 0, defaultdict(int)
    for p in sorted(p for p in (PKG/'runtime').glob('*.py') if p.name != '__init__.py'):
        m, pub, n = module_name(p), all_of(p), len(p.read_text().splitlines())
        lines, names = lines + n, names + len(pub)
        print(f"{m:30s} {n:5d} lines {len(pub):3d} public")
        for name in pub:
            u = users.get((m, name), set())
            lib = {x for x in u if x.startswith('distrib')}
            kind = ('above' if any(not x.startswith('distrib.runtime') for x in lib) else 'runtime' if lib else
                    'tests/docs' if u else 'none')
            kinds[kind] += 1
            if verbose: print(f"    {name:28s} {kind:10s} {', '.join(sorted(u))}")
    print(f"{'total':30s} {lines:5d} lines {names:3d} public: used above the runtime {kinds['above']}, only between "
          f"runtime modules {kinds['runtime']}, only by tests or docs {kinds['tests/docs']}, by none {kinds['none']}")

if __name__ == '__main__': main('-v' in sys.argv)
