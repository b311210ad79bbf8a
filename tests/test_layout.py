"""The package's layout: layers that import only from below, modules that meet through public names, a runtime whose
internal names stay inside it, docstrings that are sentences, lines of at most 120 characters, no unused import, no
silent broad `except`.

These read the source (with `ast`), so they run in a fraction of a second and name the file and line at fault."""
import ast, json, re
from pathlib import Path
import pytest

PKG = Path(__file__).resolve().parent.parent/'distrib'

# Lowest first: a module may import from its own layer and the ones before it, never from a later one
LAYERS = [
    ('runtime', ['distrib.runtime']),
    ('data', ['distrib.data']),
    ('loop', ['distrib.loop', 'distrib.callback.core', 'distrib.losses', 'distrib.metrics', 'distrib.recorder', 'distrib.files',
              'distrib.state', 'distrib.model', 'distrib.saving', 'distrib.learner']),
    ('callbacks', ['distrib.callback']),
    ('strategies', ['distrib.strategies']),
    ('launch', ['distrib.launch', 'distrib.env']),
    ('api', ['distrib']),
]

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

def _absolute(node:ast.ImportFrom, path:Path)->str:
    "The absolute module an `ImportFrom` in `path` imports from (`from ..learner import X` -> `distrib.learner`)"
    if not node.level: return node.module or ''
    name = module_name(path)
    package = name if path.name == '__init__.py' else name.rpartition('.')[0]
    base = package.split('.')[:len(package.split('.')) - node.level + 1]
    return '.'.join(base + ([node.module] if node.module else []))

def _ours(mod:str)->bool: return mod == 'distrib' or mod.startswith('distrib.')

def imported(path:Path)->list:
    "`(line, module)` for every import of a distrib module in `path`, at any depth (functions too), made absolute"
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = _absolute(node, path)
            targets = [mod] if node.module else [f"{mod}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import): targets = [a.name for a in node.names]
        else: continue
        out += [(node.lineno, t) for t in targets if _ours(t)]
    return out

def private_imports(path:Path)->list:
    "`(line, module, name)` for every underscore name `path` imports from another distrib module (dunders aside)"
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and _ours(mod := _absolute(node, path)):
            out += [(node.lineno, mod, a.name) for a in node.names
                    if a.name.startswith('_') and not (a.name.startswith('__') and a.name.endswith('__'))]
    return out

def test_layers_cover_every_module():
    for p in modules(): layer(module_name(p))

@pytest.mark.parametrize('path', modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_no_import_from_a_layer_above(path):
    me = layer(module_name(path))
    bad = [f"line {ln}: {mod} ({LAYERS[layer(mod)][0]})" for ln, mod in imported(path) if layer(mod) > me]
    assert not bad, f"{path.relative_to(PKG.parent)} ({LAYERS[me][0]}) imports from a layer above it: {bad}"

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

MAX_PRIVATE = 5  # underscore names imported across modules, each with a comment on its line saying why

def test_modules_meet_through_public_names():
    """What one module uses of another is public there: at most `MAX_PRIVATE` underscore names cross a module
    boundary, each on an import line whose comment says why"""
    found = [(p, ln, mod, name) for p in modules() for ln, mod, name in private_imports(p)]
    where = [f"{p.relative_to(PKG.parent)}:{ln}: {name} from {mod}" for p, ln, mod, name in found]
    assert len(found) <= MAX_PRIVATE, f"{len(found)} underscore names imported across modules (at most {MAX_PRIVATE}): " \
        "make them public where they are, or move them where they are used:\n" + '\n'.join(where)
    silent = [w for w, (p, ln, _, _) in zip(where, found) if '#' not in p.read_text().splitlines()[ln - 1]]
    assert not silent, "underscore names imported without a comment saying why:\n" + '\n'.join(silent)

_SENTENCE_END = re.compile(r'[.!?]$')

def test_module_docstrings_are_sentences():
    "Every module has a docstring (nbdev makes it from the notebook's `> ` line) that ends a sentence"
    bad = [f"{p.relative_to(PKG.parent)}: {ast.get_docstring(ast.parse(p.read_text()))!r}" for p in modules()
           if not _SENTENCE_END.search((ast.get_docstring(ast.parse(p.read_text())) or '').strip())]
    assert not bad, "module docstrings cut or missing (one line, <= 120 characters with its quotes):\n" + '\n'.join(bad)

MAX_LINE = 120
NBS = PKG.parent/'nbs'

def _nbdev_all(lines:list)->set:
    """Line numbers (1-based) of the `__all__` that nbdev_export writes after `# %% auto #0`: nbdev wraps its names at
    120 characters and then prefixes `__all__ = `, so its first line may be up to 130; the module's own lines are not"""
    out = set()
    for i, l in enumerate(lines):
        if l == '# %% auto #0' and i + 1 < len(lines) and lines[i + 1].startswith('__all__ = '): out.add(i + 2)
    return out

def test_modules_are_small():
    """One concern per module: no module of distrib over 800 lines, none of `distrib.fastai` over 400 (nbdev's
    generated index `_modidx.py` aside: it lists every name and is no module of code)"""
    big = [f"{p.relative_to(PKG.parent)}: {n} lines (at most {lim})" for p in modules()
           for n, lim in [(len(p.read_text().splitlines()), 400 if p.parent.name == 'fastai' else 800)] if n > lim]
    assert not big, "split these modules by concern:\n" + "\n".join(big)

def test_lines_at_most_120():
    "Lines of distrib/ (nbdev's `__all__` aside) and of the notebooks' code cells are at most 120 characters"
    bad = []
    for p in modules():
        lines = p.read_text().splitlines()
        skip = _nbdev_all(lines)
        bad += [f"{p.relative_to(PKG.parent)}:{i}: {len(l)}" for i, l in enumerate(lines, 1)
                if len(l) > MAX_LINE and i not in skip]
    for nb in sorted(NBS.glob('*.ipynb')):
        for k, cell in enumerate(json.loads(nb.read_text())['cells']):
            if cell['cell_type'] != 'code': continue
            bad += [f"{nb.name}, cell {k}: {len(l)}" for l in ''.join(cell['source']).splitlines() if len(l) > MAX_LINE]
    assert not bad, f"lines over {MAX_LINE} characters:\n" + '\n'.join(bad)

def unused_imports(path:Path)->list:
    """`(line, name)` for each name an import statement of `path` binds at module level and the module never uses (a
    name read anywhere in it, or listed in `__all__`); an import whose line says `# noqa` is imported for its effect"""
    src = path.read_text()
    tree, lines = ast.parse(src), src.splitlines()
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used |= {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    for node in tree.body:   # `__all__ = [...]`: the names a module re-exports are used
        if isinstance(node, ast.Assign) and any(getattr(t, 'id', None) == '__all__' for t in node.targets):
            used |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    out = []
    for node in tree.body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or getattr(node, 'module', None) == '__future__': continue
        if 'noqa' in lines[node.lineno - 1]: continue
        for a in node.names:
            name = a.asname or a.name.split('.')[0]
            if name not in used: out.append((node.lineno, name))
    return out

def test_no_unused_import():
    bad = [f"{p.relative_to(PKG.parent)}:{ln}: {name}" for p in modules() for ln, name in unused_imports(p)]
    assert not bad, "imported but never used (remove it, or say `# noqa` and why on its line):\n" + '\n'.join(bad)

def test_init_all_is_what_it_imports():
    "`distrib.__all__` lists exactly the public names `distrib/__init__.py` imports: what `from distrib import *` gives"
    tree = ast.parse((PKG/'__init__.py').read_text())
    imported_names = [a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names]
    public = [n for n in imported_names if not n.startswith('_')]
    import distrib
    assert sorted(distrib.__all__) == sorted(public) and len(set(distrib.__all__)) == len(distrib.__all__), (
        f"in __all__ only: {sorted(set(distrib.__all__) - set(public))}; "
        f"imported only: {sorted(set(public) - set(distrib.__all__))}")

# What `from distrib import X` gave before the layout of issue 31: every name must keep working
EXPORTED = """AccumMetric AvgLoss AvgMetric CSVLogger Callback CancelBackwardException CancelBatchException CancelEpochException
CancelFitException CancelStepException CancelTrainException CancelValidException Checkpoint CollectiveTimeoutError
DEFAULT_LIVENESS_TIMEOUT DEFAULT_TIMEOUT DataLoaders DistributedDL DistributedModule DistributedTrainer
EarlyStoppingCallback ErrorRecord FSDPTrainer Failure GatherPreds GradientAccumulation GradientClip IterableShards
LRFinder Learner LearnerSaving MLflowCallback Metric MixedPrecision ParallelModule ParallelTrainer ParamScheduler
PeerFailedError Preempted ProgressCallback RanksDivergedError Recorder ResumeError RunLogger SYNC_STRATEGIES
SaveModelCallback SchedCos SchedExp SchedLin SchedNo SchedPoly StopSignals SuggestionMethod TensorBoardCallback
TerminateOnNaNCallback TrackerCallback WandbCallback World WorldError accuracy all_reduce_mean all_reduce_sum
broadcast_object check_ddp_buckets check_loader check_models checkpoints clip_grad_norm_ combine_scheds combined_cos
compile_forwards compile_options config_of convert_sync_batchnorm current_world default_backend detect_world
distrib_barrier distrib_timeout ensure_distrib events expand_hostlist full_model_state full_opt_state gather_in_order
gather_object get_random_states in_collective is_sharded iter_shard liveness_timeout load_file load_sharded
local_rank_distrib local_state_bytes long_phase minimum notebook_launch num_distrib offline_history pg_initialized
planned_steps plot_lr_find preflight_check rank0_first rank_distrib record_error requeue_slurm_job restore_forwards
revert_sync_batchnorm root_failure save_file save_sharded set_full_model_state set_full_opt_state set_random_states
set_seed setup_distrib shard_idxs shard_model slide steep teardown_distrib unwrap_model valley
callback data files launch learner metrics recorder runtime saving state strategies""".split()

def test_exported_names_kept():
    "Every name `from distrib import X` gave before keeps working (the last line: subpackages and modules)"
    import distrib
    assert len(EXPORTED) == 136 and not [n for n in EXPORTED if not hasattr(distrib, n)], \
        [n for n in EXPORTED if not hasattr(distrib, n)]

def test_strategies_registered_explicitly():
    """`strategies.context` names every strategy in its table and imports the module when the strategy is asked for:
    it does not import `strategies.fsdp`, which registers nothing (`import distrib` imports it to export `FSDPTrainer`)"""
    context, fsdp = PKG/'strategies'/'context.py', PKG/'strategies'/'fsdp.py'
    assert not [m for _, m in imported(context) if m.startswith('distrib.strategies.fsdp')]
    assert '_STRATEGIES' not in fsdp.read_text() and not [m for _, m in imported(fsdp) if 'context' in m]
    from distrib.strategies.context import _trainer_class
    from distrib.strategies.fsdp import FSDPTrainer
    assert _trainer_class('fsdp') is FSDPTrainer

INTERNAL = ('distrib.runtime', 'distrib.fastai')   # packages whose modules share names not in their `__all__`

def _inside(mod:str, pkg:str)->bool: return mod == pkg or mod.startswith(pkg + '.')

def _public(mod:str)->set|None:
    "The `__all__` of distrib module `mod`, read from its source; None when `mod` is no module file (a package)"
    f = PKG.parent/(mod.replace('.', '/') + '.py')
    if not f.exists(): return None
    tree = ast.parse(f.read_text())
    return next((set(ast.literal_eval(n.value)) for n in tree.body if isinstance(n, ast.Assign)
                 and any(getattr(t, 'id', None) == '__all__' for t in n.targets)), set())

def internal_imports(path:Path)->list:
    """`(line, module, name)` for every name `path` imports from a module of a package of `INTERNAL`
    (`distrib.runtime`, `distrib.fastai`) that is not in that module's `__all__` (its package-internal names,
    `#| exporti`), and every such module it imports whole (whose names it would then reach past `__all__`); empty
    for the package's own modules, which share the internal names"""
    me, out = module_name(path), []
    def outside(mod:str)->bool: return any(_inside(mod, pkg) and not _inside(me, pkg) for pkg in INTERNAL)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = _absolute(node, path)
            if not outside(mod): continue
            public = _public(mod)
            for a in node.names:
                if public is None and mod in INTERNAL and _public(f"{mod}.{a.name}") is None and a.name != '*':
                    continue   # a name of the package's own __init__ (distrib.fastai's re-exports): public
                if public is None: out.append((node.lineno, f"{mod}.{a.name}", '(the whole module)'))
                elif a.name not in public: out.append((node.lineno, mod, a.name))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, '(the whole module)') for a in node.names if outside(a.name)]
    return out

def test_internal_names_stay_inside():
    """The runtime and `distrib.fastai` offer the modules outside them only what their modules' `__all__` list: a
    module of distrib outside `distrib.runtime` (the data, the loop, callbacks, strategies, the launchers, the API)
    that imports one of the runtime's package-internal names (defined in an `#| exporti` cell: importable by the
    package's own modules, not in `__all__`, not in the API docs), or a runtime module whole, fails here; likewise
    for `distrib.fastai`'s internal names (`Shares`, `sum_over_items`, `trainer_of`). Tests, the notebooks' check
    cells and bench/ may import internal names (they check the wiring): only distrib/ is read."""
    bad = [f"{p.relative_to(PKG.parent)}:{ln}: {name} from {mod}" for p in modules()
           for ln, mod, name in internal_imports(p)]
    assert not bad, "names that are internal to their package (not in their module's __all__) imported from " \
        "outside it: make the name public there (an #| export cell) if others need it, or leave it to the package:\n" \
        + '\n'.join(bad)

LOADERS = {'DistributedDL', 'IterableShards', 'ShardedDL'}   # distrib's loader classes

def loader_isinstances(path:Path)->list:
    """`(line, class)` for every `isinstance(x, C)` in `path` whose class (or one of a tuple of them) is one of
    distrib's loader classes (`LOADERS`), by name"""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, 'id', None) == 'isinstance' and len(node.args) == 2:
            cls = node.args[1]
            for c in (cls.elts if isinstance(cls, ast.Tuple) else [cls]):
                name = c.id if isinstance(c, ast.Name) else c.attr if isinstance(c, ast.Attribute) else None
                if name in LOADERS: out.append((node.lineno, name))
    return out

def test_loaders_reached_through_the_protocol():
    """distrib reaches a loader through the loop protocol's members (`distrib.loop.is_sharded`, `shard_world`, the
    optional `n_shard` and `dataset_targets()`), never by `isinstance` on its own loader classes, except in the
    modules that define them (`distrib/data.py`, `distrib/fastai/data.py`): any loader with the members is served"""
    bad = [f"{p.relative_to(PKG.parent)}:{ln}: isinstance(..., {c})" for p in modules() if p.name != 'data.py'
           for ln, c in loader_isinstances(p)]
    assert not bad, "isinstance on distrib's loader classes (use distrib.loop's is_sharded/shard_world):\n" + \
        '\n'.join(bad)

def test_loader_rule_can_fail(tmp_path):
    p = tmp_path/'x.py'
    p.write_text("def f(dl):\n    return isinstance(dl, (DistributedDL, list)) or isinstance(dl, data.ShardedDL)\n")
    assert loader_isinstances(p) == [(2, 'DistributedDL'), (2, 'ShardedDL')]

# torch.distributed's tensor all-gathers (two names of one before torch 2.13), and the sort that orders gathered rows
GATHERS = {'all_gather', 'all_gather_into_tensor', 'all_gather_single', 'argsort'}
COLLECTIVES = PKG/'runtime'/'collectives.py'

def gather_uses(path:Path)->list:
    """`(line, name)` for every use in `path` of a name of `GATHERS` (`torch.distributed`'s tensor all-gathers and
    `argsort`): a name, an attribute, an imported name, or a string naming one (`getattr(dist, 'all_gather_single')`);
    `all_gather_object` (objects, not tensors) is another name"""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        name = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else
                node.name if isinstance(node, ast.alias) else
                node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None)
        if name in GATHERS: out.append((getattr(node, 'lineno', None), name))
    return out

def test_gathers_only_in_collectives():
    """A tensor all-gather (`all_gather`, `all_gather_into_tensor`, `all_gather_single`) and the ordering's `argsort`
    appear in distrib/ only in `runtime/collectives.py` (issue 47): one ordered gather (`gather_rows`, `order_rows`)
    for every loop and metric, and FSDP's probe (`probe_shard_collectives`), each with its collectives' position"""
    assert {n for _, n in gather_uses(COLLECTIVES)} >= {'all_gather', 'all_gather_into_tensor', 'argsort'}
    bad = [f"{p.relative_to(PKG.parent)}:{ln}: {name}" for p in modules() if p != COLLECTIVES
           for ln, name in gather_uses(p)]
    assert not bad, "a tensor all_gather or argsort outside distrib/runtime/collectives.py (use gather_rows, " \
        "order_rows or gather_in_order there, or add the collective there):\n" + '\n'.join(bad)

def test_gather_rule_can_fail(tmp_path):
    p = tmp_path/'x.py'
    p.write_text("import torch, torch.distributed as dist\nfrom torch.distributed import all_gather as ag\n"
                 "def f(t, i):\n    dist.all_gather_into_tensor(t, t); getattr(dist, 'all_gather_single')\n"
                 "    dist.all_gather_object([], 1); return i.argsort(), torch.argsort(i)\n")
    want = [(2, 'all_gather'), (4, 'all_gather_into_tensor'), (4, 'all_gather_single'), (5, 'argsort'), (5, 'argsort')]
    assert sorted(gather_uses(p), key=str) == sorted(want, key=str)

def test_stall_checks_set_up_by_a_call():
    "Nothing imports `runtime.stalls` for its effect: whoever starts liveness calls `watch_stalls()` first"
    for p in modules():
        src = p.read_text()
        assert 'import stalls' not in src, f"{p.relative_to(PKG.parent)} imports runtime.stalls for its effect"
        if 'start_liveness(' in src and p.name != 'liveness.py':
            assert 'watch_stalls()' in src, f"{p.relative_to(PKG.parent)} starts liveness without the stall checks"

def test_checks_fail_on_a_bad_tree(tmp_path, monkeypatch):
    """The checks above can fail: a runtime module importing the Learner, a silent broad except, an underscore name
    imported from another module, a cut docstring, a long line, an unused import are caught"""
    bad = tmp_path/'distrib'/'runtime'; bad.mkdir(parents=True)
    (bad/'x.py').write_text('"""A module whose docstring stops mid"""\nimport os\nfrom .group import _State\n'
                            "def f():\n    from ..learner import Learner\n    try: pass\n    except Exception: pass\n"
                            f"    return '{'x' * 120}'\n")
    monkeypatch.setattr(__import__(__name__), 'PKG', tmp_path/'distrib')
    p = bad/'x.py'
    assert imported(p) == [(3, 'distrib.runtime.group'), (5, 'distrib.learner')]
    assert layer('distrib.learner') > layer(module_name(p))
    handler = next(n for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ExceptHandler))
    assert _swallows(handler)
    assert private_imports(p) == [(3, 'distrib.runtime.group', '_State')]
    assert not _SENTENCE_END.search(ast.get_docstring(ast.parse(p.read_text())))
    assert [i for i, l in enumerate(p.read_text().splitlines(), 1) if len(l) > MAX_LINE] == [8]
    assert unused_imports(p) == [(2, 'os'), (3, '_State')]

def test_runtime_boundary_can_fail(tmp_path, monkeypatch):
    """The check above can fail: a module above the runtime importing an internal name (`running`, not in liveness'
    `__all__`) or a runtime module whole is named with its line; its public names pass, and so do the same imports
    inside the runtime"""
    pkg = tmp_path/'distrib'
    (pkg/'runtime').mkdir(parents=True); (pkg/'strategies').mkdir()
    (pkg/'runtime'/'liveness.py').write_text("__all__ = ['liveness_timeout']\ndef liveness_timeout(): pass\n"
                                              "def running(): pass\n")
    src = ("from ..runtime.liveness import liveness_timeout\nfrom ..runtime.liveness import running\n"
           "def f():\n    from distrib.runtime import liveness\n    import distrib.runtime.liveness\n")
    (pkg/'strategies'/'x.py').write_text(src)
    (pkg/'runtime'/'y.py').write_text(src.replace('..runtime.', '.'))
    monkeypatch.setattr(__import__(__name__), 'PKG', pkg)
    assert internal_imports(pkg/'strategies'/'x.py') == [
        (2, 'distrib.runtime.liveness', 'running'), (4, 'distrib.runtime.liveness', '(the whole module)'),
        (5, 'distrib.runtime.liveness', '(the whole module)')]
    assert internal_imports(pkg/'runtime'/'y.py') == []
    with pytest.raises(AssertionError, match=r'strategies/x.py:2: running from distrib.runtime.liveness'):
        test_internal_names_stay_inside()

def test_fastai_boundary_can_fail(tmp_path, monkeypatch):
    """The same rule for `distrib.fastai`: a module outside it importing `sum_over_items` (internal to
    `distrib.fastai.losses`) is named; its public `ItemMean`, the package's re-exports, and the same import inside
    `distrib.fastai` pass"""
    pkg = tmp_path/'distrib'
    (pkg/'fastai').mkdir(parents=True); (pkg/'strategies').mkdir()
    (pkg/'fastai'/'__init__.py').write_text("from .losses import ItemMean\n__all__ = ['ItemMean']\n")
    (pkg/'fastai'/'losses.py').write_text("__all__ = ['ItemMean']\nclass ItemMean: pass\ndef sum_over_items(): pass\n")
    src = "from ..fastai.losses import ItemMean, sum_over_items\nfrom ..fastai import ItemMean as I\n"
    (pkg/'strategies'/'x.py').write_text(src)
    (pkg/'fastai'/'y.py').write_text(src.replace('..fastai.', '.').replace('..fastai', '.'))
    monkeypatch.setattr(__import__(__name__), 'PKG', pkg)
    assert internal_imports(pkg/'strategies'/'x.py') == [(1, 'distrib.fastai.losses', 'sum_over_items')]
    assert internal_imports(pkg/'fastai'/'y.py') == []
    with pytest.raises(AssertionError, match=r'strategies/x.py:1: sum_over_items from distrib.fastai.losses'):
        test_internal_names_stay_inside()

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
