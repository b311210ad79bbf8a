"""Exact at any dataset size (issue 46) on W processes: training sets that W*B does not divide, against one process
with the global batch over the same order, computed in the same worker (an independent Learner).
Run: python -m distrib.launch --nproc_per_node W tests/scripts/any_size.py <tmp dir>   (W = 2 or 3)
Rank 0 prints one 'CHECK <name> OK <figures>' line per check and 'ANYSIZE {json}' with the largest relative
differences per case (max |a - b| / max |b| over the weights); a violated property raises."""
import json
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from distrib import (Learner, DataLoaders, Callback, DistributedDL, GradientAccumulation, setup_distrib, teardown_distrib, rank_distrib, num_distrib)
from _common import check_all as check, rel

torch.set_num_threads(1)
setup_distrib(timeout=60)
W, rank = num_distrib(), rank_distrib()
B = 8
res = {'world_size': W}

def data(n, seed, ignored=False):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)
    if ignored: y[torch.rand(n, generator=g) < 0.3] = -100   # items the loss ignores: the ranks' counts differ
    return x, y

class SetEpoch(Callback):
    "The single-process reference calls `set_epoch` itself (DistributedTrainer does it under distrib_ctx)"
    def before_epoch(self):
        for dl in self.learn.dls.loaders:
            if isinstance(dl, DistributedDL): dl.set_epoch(self.learn.epoch)

def model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))

def run(n, loss, train_dl=None, cbs=(), ref_cbs=(), ignored=False, epochs=2, bs=B, **ctx):
    """Train W ranks x `bs` and one process x W*`bs` over the same order (SGD, `epochs`): (weights difference, recorded
    training loss difference, the Learner)"""
    x, y = data(n, 3, ignored)
    valid = DataLoader(TensorDataset(x[:5], y[:5]), batch_size=5)
    train = train_dl or DataLoader(TensorDataset(x, y), batch_size=bs, shuffle=True)
    learn = Learner(DataLoaders(train, valid), model(), loss, opt_func=torch.optim.SGD, lr=0.1, cbs=list(cbs))
    learn.progress.enabled = False
    with learn.distrib_ctx(**ctx): learn.fit(epochs)
    one = Learner(DataLoaders(DistributedDL(TensorDataset(x, y), batch_size=W*bs, shuffle=True, rank=0, world_size=1),
                              valid), model(), loss, opt_func=torch.optim.SGD, lr=0.1, independent=True,
                  cbs=list(ref_cbs))
    one.progress.enabled = False
    one.fit(epochs, cbs=SetEpoch())
    dw = max(rel(p.detach(), q.detach()) for p, q in zip(learn.model.parameters(), one.model.parameters()))
    dl = max(abs(a[0] - b[0])/abs(b[0]) for a, b in zip(learn.recorder.values, one.recorder.values))
    return dw, dl, learn

def exact(name, n, loss, **kw):
    dw, dl, _ = run(n, loss, **kw)
    res[name] = dw
    check(name, dw <= 1e-5 and dl <= 1e-6, f'weights {dw:.2e} training loss {dl:.2e}')

# the example, with the three ways a loss is weighed: nn.CrossEntropyLoss() (counts known from the layout,
# no collective), a batch-mean loss (weighed by its rows), a loss over items whose counts differ (their all-reduce)
exact('ce_1001', 1001, nn.CrossEntropyLoss())
exact('mean_1001', 1001, lambda p, y: F.cross_entropy(p, y))
exact('items_1001', 1001, nn.CrossEntropyLoss(), ignored=True)
exact('w_divides', 96*W, nn.CrossEntropyLoss())
# one rank with nothing to read in the last step (17 = 2*8 + 1 on 2 ranks): ends, exactly
exact('empty_rank_17', 17, nn.CrossEntropyLoss())
exact('empty_rank_17_mean', 17, lambda p, y: F.cross_entropy(p, y))
# fewer samples than ranks: the ranks past the last one read empty batches only
exact('tiny', W - 1, nn.CrossEntropyLoss())
# GradientAccumulation: micro-batches of 4 per rank, windows of 12*W samples (a window ends mid-batch at the end)
for name, loss in [('accumulate', nn.CrossEntropyLoss()), ('accumulate_mean', lambda p, y: F.cross_entropy(p, y))]:
    dw, dl, _ = run(1001, loss, bs=4, cbs=[GradientAccumulation(12*W)], ref_cbs=[GradientAccumulation(12*W)])
    res[name] = dw
    check(name, dw <= 1e-5 and dl <= 1e-6, f'weights {dw:.2e} training loss {dl:.2e}')
# FSDP
exact('fsdp', 1001, nn.CrossEntropyLoss(), strategy='fsdp')
exact('fsdp_mean', 1001, lambda p, y: F.cross_entropy(p, y), strategy='fsdp')
# pad=True, DistributedSampler's behaviour, still there: the first items of each epoch train twice
x, y = data(1001, 3)
dw, _, learn = run(1001, nn.CrossEntropyLoss(), train_dl=DistributedDL(TensorDataset(x, y), batch_size=B, shuffle=True,
                                                                       pad=True))
res['padded'] = dw
check('padded', dw > 1e-3, f'weights {dw:.2e} (items trained twice)')

if rank == 0: print('ANYSIZE ' + json.dumps(res), flush=True)
teardown_distrib()
