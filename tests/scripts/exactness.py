"""Exactness under W processes (issue: what W processes report equals what one process would).
Run: python -m distrib.launch --nproc_per_node W tests/scripts/exactness.py <tmp dir> (files go to <tmp dir>/w<W>)
Each check computes the single-process reference in the same worker; rank 0 prints one `EXACT {json}` line with
the largest differences measured; any violated property raises (non-zero exit)."""
import json, sys, warnings
from pathlib import Path
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from distrib import (Learner, DataLoaders, Callback, DistributedDL, AccumMetric, accuracy, unwrap_model,
                     setup_distrib, teardown_distrib, rank_distrib, num_distrib)

torch.set_num_threads(1)
setup_distrib(timeout=60)
W, rank = num_distrib(), rank_distrib()
tmp = Path(sys.argv[1])/f'w{W}'
diffs = {}

def rel(a, b)->float:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item() if a.numel() else 0.

def record(key, d, tol):
    diffs[key] = max(diffs.get(key, 0.), d)
    assert d <= tol, f"rank {rank}: {key} differs by {d:.3g} > {tol}"

def same_on_all_ranks(obj, what):
    objs = [None]*W
    dist.all_gather_object(objs, obj)
    if isinstance(obj, dict):
        bad = sorted(k for k in obj if any(o[k] != objs[0][k] for o in objs))
        assert not bad, f"{what} differs between ranks in {bad}"
    assert all(o == objs[0] for o in objs), f"{what} differs between ranks: {objs}"

def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)

def n_preds(preds, targs): return len(preds)
def median_err(preds, targs): return (preds.softmax(1).gather(1, targs[:, None]) - 1).abs().median()

class SetEpoch(Callback):
    "The single-process reference calls `set_epoch` itself (DistributedTrainer does it under distrib_ctx)"
    def before_epoch(self):
        for dl in self.learn.dls.loaders:
            if isinstance(dl, DistributedDL): dl.set_epoch(self.learn.epoch)

# 1, 2, 4: validation, predictions, buffers; valid sets: multiple of W, not a multiple, smaller than W, one sample
xt, yt = data(8*W, 1)
first = 1   # the first n_valid below
for n_valid in sorted({4*W, 4*W + 1, max(W - 1, 1), 1}):
    xv, yv = data(n_valid, 2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    dls = DataLoaders(DataLoader(TensorDataset(xt, yt), batch_size=4, shuffle=True),
                      DataLoader(TensorDataset(xv, yv), batch_size=3))
    learn = Learner(dls, model, F.cross_entropy, lr=1e-2, metrics=[accuracy, AccumMetric(n_preds, flatten=False), AccumMetric(median_err, flatten=False)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        with learn.distrib_ctx(sync_bn=False): pass   # per-rank statistics asked for: no warning
        asked = [str(w.message) for w in caught if 'BatchNorm' in str(w.message)]
        with learn.distrib_ctx():   # sync_bn=None on CPU: per-rank statistics, and rank 0 says so
            learn.fit(2)
            vals = learn.validate()
            preds, targs = learn.get_preds()
            # buffers and parameters identical on every rank
            same_on_all_ranks({k: v.tolist() for k, v in unwrap_model(learn.model).state_dict().items()}, 'state dict')
    bn_warned = [str(w.message) for w in caught if 'BatchNorm' in str(w.message)]
    assert not asked, f"rank {rank}: sync_bn=False warned {asked}"
    on_cpu = not torch.cuda.is_available()   # on CUDA, sync_bn=None converts to SyncBatchNorm: no warning
    # rank 0 says it once per process (once per job), in the first of these distrib_ctx only
    assert len(bn_warned) == (on_cpu and rank == 0 and n_valid == first), f"rank {rank}: BatchNorm warnings {bn_warned}"
    assert not bn_warned or bn_warned[0].startswith('1 BatchNorm layer(s)'), bn_warned
    model.eval()
    with torch.no_grad(): ref_preds = model(xv)
    ref = [F.cross_entropy(ref_preds, yv).item(), accuracy(ref_preds, yv).item(), n_valid, median_err(ref_preds, yv).item()]
    for v, r in zip(vals, ref): record('validate', rel(v, r), 1e-6)
    for v, r in zip(learn.recorder.values[-1][1:], ref): record('epoch_valid_values', rel(v, r), 1e-6)
    assert vals[2] == n_valid, f"{vals[2]} predictions counted for {n_valid} samples"
    same_on_all_ranks(vals, 'validation values')
    assert len(preds) == n_valid and torch.equal(targs, yv), "get_preds: not every sample once, in dataset order"
    record('get_preds', rel(preds, ref_preds), 1e-6)

# 3: training equivalence, W processes x batch B == one process x batch W*B over the same DistributedDL order
B = 4
for n_train, drop_last in [(W*B*3, False), (W*B*3 + 2*W, True)]:
    x, y = data(n_train, 3)
    torch.manual_seed(1)
    init = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).state_dict()
    def learner(train_dl, independent=False):
        m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)); m.load_state_dict(init)
        return Learner(DataLoaders(train_dl, DataLoader(TensorDataset(x[:5], y[:5]), batch_size=5)), m, F.cross_entropy,
                       opt_func=torch.optim.SGD, lr=0.1, independent=independent)
    learn = learner(DataLoader(TensorDataset(x, y), batch_size=B, shuffle=True, drop_last=drop_last))
    with learn.distrib_ctx(): learn.fit(2)
    # the single-process reference, computed in each worker: a deliberately independent run
    one = learner(DistributedDL(TensorDataset(x, y), batch_size=W*B, shuffle=True, rank=0, world_size=1, drop_last=drop_last),
                  independent=True)
    one.fit(2, cbs=SetEpoch())
    for p, q in zip(learn.model.parameters(), one.model.parameters()): record('training', rel(p.detach(), q.detach()), 1e-5)
    assert not torch.equal(learn.model[0].weight, init['0.weight']), "the model did not train"

# 5: saving on rank 0 only, atomically; a DDP checkpoint loads into a plain Learner
saves = []
orig_save = torch.save
torch.save = lambda *a, **k: (saves.append(a[1]), orig_save(*a, **k))[1]
learn = learner(DataLoader(TensorDataset(x, y), batch_size=B, shuffle=True))
learn.path = tmp
with learn.distrib_ctx():
    learn.fit(1)
    file = learn.save('ck')
torch.save = orig_save
assert len(saves) == (1 if rank == 0 else 0), f"rank {rank} called torch.save {len(saves)} times"
assert sorted(p.name for p in file.parent.iterdir()) == ['ck.pth'], list(file.parent.iterdir())
assert not any(k.startswith('module.') for k in torch.load(file)['model'])
plain = learner(DataLoader(TensorDataset(x, y), batch_size=B)); plain.path = tmp
plain.load('ck')
for p, q in zip(plain.model.parameters(), learn.model.parameters()): assert torch.equal(p, q)

# 6: resume: fit(2), save, load into a new Learner, fit(4, start_epoch=2) == fit(4) uninterrupted (Adam state too)
def adam_learner():
    l = learner(DataLoader(TensorDataset(x, y), batch_size=B, shuffle=True)); l.opt_func, l.path = torch.optim.Adam, tmp
    return l
full = adam_learner()
with full.distrib_ctx(): full.fit(4)
part = adam_learner()
with part.distrib_ctx():
    part.fit(2)
    part.save('half')
resumed = adam_learner()
with torch.no_grad():
    for p in resumed.model.parameters(): p.add_(1.)  # start elsewhere: load must restore everything
with resumed.distrib_ctx():
    resumed.load('half')
    resumed.fit(4, start_epoch=2)
for p, q in zip(resumed.model.parameters(), full.model.parameters()): record('resume', rel(p.detach(), q.detach()), 1e-6)

same_on_all_ranks(sorted(diffs), 'checks run')
if rank == 0: print('EXACT ' + json.dumps({'world_size': W, **diffs}), flush=True)
teardown_distrib()
