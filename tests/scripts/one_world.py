"""One world, as a user's script meets it: `python -m distrib.launch --nproc_per_node 2 one_world.py <shared dir>`.

The fastai habit first (`rank0_first` at the top, no set-up call), then a fit without `distrib_ctx` (refused), a fit
inside it, and what the script does after it: the process group is still there, `save` is readable by every rank
the moment it returns (10 times), `validate`/`get_preds` outside the context say once that each rank evaluates the
whole set and give what the context gives. Each check prints `CHECK <name> OK rank <r>`; a failed check raises.
"""
import sys, warnings
from pathlib import Path
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from distrib import (Learner, DataLoaders, accuracy, rank0_first, rank_distrib, num_distrib, pg_initialized,
                     current_world)

tmp = Path(sys.argv[1])
calls = []

def check(name, ok=True, detail=''):
    assert ok, f"rank {rank_distrib()}: check {name} failed {detail}"
    sys.stdout.write(f"CHECK {name} OK rank {rank_distrib()}\n"); sys.stdout.flush()

def load_data():
    "Rank 0 makes and caches the data; the others, called after it, find the cache"
    calls.append(rank_distrib())
    f = tmp/'data.pt'
    if not f.exists():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(200, 4, generator=g); y = (x.sum(1) > 0).long()
        torch.save((x, y), f)
    return torch.load(f)

# 1. fastai's habit: rank0_first before anything else, no set-up call
x, y = rank0_first(load_data)
check('rank0_first_habit', pg_initialized() and num_distrib() == 2 and calls == [rank_distrib()] and len(x) == 200)

def make_learner():
    torch.manual_seed(0)
    dls = DataLoaders(DataLoader(TensorDataset(x[:160], y[:160]), batch_size=8, shuffle=True),
                      DataLoader(TensorDataset(x[160:], y[160:]), batch_size=16))
    learn = Learner(dls, nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2)), nn.functional.cross_entropy,
                    lr=1e-2, metrics=accuracy, path=tmp)
    learn.progress.enabled = False
    return learn

# 3. fit without the context: refused on every rank, naming distrib_ctx
learn = make_learner()
try: learn.fit(1); msg = None
except RuntimeError as e: msg = str(e)
check('fit_without_ctx_refused', msg is not None and 'learn.distrib_ctx()' in msg and 'world of 2' in msg, msg)

with learn.distrib_ctx():
    check('world_in_ctx', learn.world == current_world() and learn.world.world_size == 2)
    learn.fit(2)
    v_in = learn.validate()
    p_in, t_in = learn.get_preds()

# 6. after the context the group is still there, and num_distrib() agrees with it
check('group_outlives_ctx', pg_initialized() and num_distrib() == dist.get_world_size() == 2 and learn.world is None)

# 2. save after the context: every rank can read the file the moment save returns
for i in range(10):
    f = learn.save(f'model{i}')
    state = torch.load(f, weights_only=True)   # not learn.load: no barrier of its own here
    assert set(state) == {'model', 'opt', 'opt_type'}
learn.load('model9')
check('save_after_ctx_readable', sorted(p.name for p in f.parent.iterdir()) == [f'model{i}.pth' for i in range(10)])

# validate/get_preds outside the context: each rank evaluates everything, says so once, same numbers
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter('always')
    v_out = learn.validate()
    p_out, t_out = learn.get_preds()
check('eval_outside_ctx_warns_once', len(w) == 1 and 'evaluates the whole data set on its own' in str(w[0].message),
      [str(m.message) for m in w])
check('eval_outside_ctx_equal', all(abs(a - b) < 1e-6 for a, b in zip(v_in, v_out)) and torch.allclose(p_in, p_out)
      and torch.equal(t_in, t_out) and len(p_out) == 40, (v_in, v_out))
