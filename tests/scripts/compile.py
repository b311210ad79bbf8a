"""distrib_ctx(compile=...) under 2 processes, DDP and FSDP: compiled after wrapping, equal to eager within 1e-6,
state dict keys without `_orig_mod.`, a model compiled by the user compiled again after wrapping, a bucket_cap_mb
below DDP's first bucket refused. Tiny models: compiling on CPU takes seconds per graph.
Run: python -m distrib.launch --nproc_per_node 2 tests/scripts/compile.py <tmp dir>
Rank 0 prints one 'CHECK <name> OK <figures>' line per check; a violated property raises (non-zero exit)."""
import sys, time
from pathlib import Path
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch._dynamo.utils import counters
from distrib import Learner, DataLoaders, DistributedModule, setup_distrib, teardown_distrib, rank_distrib
from _common import check

tmp = Path(sys.argv[1])
torch.set_num_threads(1)
setup_distrib(timeout=600)     # two ranks compiling at once on a small CPU machine
rank = rank_distrib()
g = torch.Generator().manual_seed(1)
x, y = torch.randn(32, 4, generator=g), torch.randint(0, 2, (32,), generator=g)

def new_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 9), nn.ReLU(), nn.Linear(9, 2))   # torch's own modules: see distrib.strategies.compiling

def learner(model=None):
    dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True),     # 4 steps of 4 per rank
                      DataLoader(TensorDataset(x[:12], y[:12]), batch_size=3))         # 2 batches of 3 per rank
    learn = Learner(dls, model or new_model(), F.cross_entropy, lr=1e-2, path=tmp)
    learn.progress.enabled = False
    return learn

def trained(model=None, **ctx):
    learn = learner(model)
    t = time.perf_counter()
    with learn.distrib_ctx(**ctx):
        learn.fit(2)
        keys = list(learn.model.state_dict())
        file = learn.save('ck')
    return learn, keys, file, time.perf_counter() - t

def max_diff(a, b): return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))

def graphs(): return counters['stats'].get('unique_graphs', 0)

# DDP: compiled inside DDP's forward, equal to eager, clean keys, the forward put back on exit
eager, _, _, t_eager = trained()
n0 = graphs()
comp, keys, file, t_comp = trained(compile=True)
saved = list(torch.load(file, weights_only=True)['model'])
d = max(max_diff(comp.model, eager.model), max(abs(a - b) for a, b in zip(sum(comp.recorder.values, []),
                                                                         sum(eager.recorder.values, []))))
check('compile_ddp_equals_eager', graphs() > n0 and d <= 1e-6 and 'forward' not in comp.model.__dict__,
      f'graphs={graphs() - n0} max_diff={d:.1e} fit eager {t_eager:.1f}s compiled {t_comp:.1f}s')
check('compile_ddp_keys', keys[0] == 'module.0.weight' and saved == list(new_model().state_dict()),
      f'{keys[:1]} {saved[:1]}')

# a model the Learner holds compiled: unwrapped, wrapped, compiled again after wrapping; the Learner's back on exit
user = torch.compile(new_model())
learn = learner(user)
with learn.distrib_ctx():
    inside = (type(learn.model) is DistributedModule, 'forward' in learn.model.module.__dict__)
    learn.fit(2)
    keys = list(learn.model.state_dict())
d = max_diff(learn.model, eager.model)
check('compile_precompiled_model', inside == (True, True) and learn.model is user and keys[0] == 'module.0.weight'
      and d <= 1e-6, f'inside={inside} max_diff={d:.1e}')

# bucket_cap_mb below DDP's first bucket (1 MiB): refused before compiling, with the fix
learn = learner()
try:
    with learn.distrib_ctx(compile=True, bucket_cap_mb=0.5): pass
    msg = ''
except ValueError as e: msg = str(e)
check('compile_small_bucket_refused', 'bucket_cap_mb >= 1' in msg and learn.model is not None, msg)
try:
    with learn.distrib_ctx(compile={'mode': 'default', 'fulgraph': True}): pass
    msg = ''
except TypeError as e: msg = str(e)
check('compile_unknown_option', 'fulgraph' in msg and 'fullgraph' in msg, msg)

# FSDP: each sharded block's forward compiled, equal to eager FSDP (and to DDP)
feager, _, _, t_eager = trained(strategy='fsdp', shard_classes=nn.Linear)
n0 = graphs()
fcomp, keys, file, t_comp = trained(strategy='fsdp', shard_classes=nn.Linear, compile={'dynamic': False})
saved = list(torch.load(file, weights_only=True)['model'])
d = max_diff(fcomp.model, feager.model)
check('compile_fsdp_equals_eager', graphs() > n0 and d <= 1e-6 and max_diff(fcomp.model, eager.model) <= 1e-6,
      f'graphs={graphs() - n0} max_diff={d:.1e} fit eager {t_eager:.1f}s compiled {t_comp:.1f}s')
check('compile_fsdp_keys', keys[0] == '0.weight' and saved == list(new_model().state_dict()), f'{keys[:1]}')
teardown_distrib()
print(f'rank {rank} done')
