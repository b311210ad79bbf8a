"""A mid-epoch `Checkpoint` resumed on another number of processes, on training sets that the global batch does not
divide (issue 46): the resumed run reads every remaining item of the epoch once, and ends with the weights of one
process with the global batch over the same order, uninterrupted.
Run: python -m distrib.launch --nproc_per_node W tests/scripts/any_size_resume.py STEPS DIR, STEPS `stop`, `resume`
or `resume+stop` (in that order in the same processes); the test chains 2 (stop) -> 3 (resume+stop) -> 2 (resume).

Every case trains 3 epochs of SGD with momentum, a global batch of 24 (24 // W per rank), on `n` samples:
- `stop`: trains with `Checkpoint(every_n_steps=at)` in DIR/<case>-from<W> and stops the fit (`CancelFitException`)
  after the checkpoint of step `at`, in the middle of epoch 1.
- `resume`: for each DIR/<case>-from<W0>, W0 != W, the same fit on this W resumes from a copy of its checkpoint (its
  own checkpoints go there too); then each rank trains one process (an independent Learner, global batch 24, the
  same order) uninterrupted. Rank 0 prints `CHECK resume_<case>_<W0>to<W> OK <figures>` when: the log line says where
  it resumed, every global step after the resume read the reference's items (each remaining item of the epoch once),
  the weights are within 1e-5 (relative: max |a - b| / max |b|) and the recorded losses within 1e-6 (relative); and
  `RESUME {json}`: the weights' differences by case.
Cases: nn.CrossEntropyLoss(), a batch-mean loss, a loss over items whose counts differ (ignore_index targets: ItemMean),
GradientAccumulation (with and without ignored targets), a resume right before the epoch's last (uneven) step, 37
samples (24 + 13), 50 (24 + 24 + 2: one rank of 3 empty in the last step), and two batch changes: 8 per rank on both
worlds with `Checkpoint(allow_batch_change=True)`, against one process reading the same batches (8 x W0 samples up
to the checkpoint's position in epoch 1, then 8 x W), one at a position both worlds divide, one at 496 samples (31
batches of 16), which 3 ranks do not divide."""
import json, shutil, sys
from functools import partial
from pathlib import Path
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from distrib import (Learner, DataLoaders, Callback, Checkpoint, DistributedDL, GradientAccumulation,
                     CancelFitException, gather_object, setup_distrib, teardown_distrib, rank_distrib, num_distrib,
                     shard_idxs)

steps, tmp = sys.argv[1].split('+'), Path(sys.argv[2])
torch.set_num_threads(1)
setup_distrib(timeout=60)
W, rank = num_distrib(), rank_distrib()
G, EPOCHS = 24, 3   # global batch, epochs
CE, MEAN = nn.CrossEntropyLoss(), (lambda p, y: F.cross_entropy(p, y))
# case: (n, loss, ignored targets, micro-batches per GradientAccumulation window (0: none), the checkpoint's step)
CASES = {'ce_1001': (1001, CE, False, 0, 42 + 20), 'mean_1001': (1001, MEAN, False, 0, 42 + 20),
         'items_1001': (1001, CE, True, 0, 42 + 20), 'before_last_1001': (1001, CE, False, 0, 42 + 41),
         'accumulate': (1001, CE, False, 2, 21 + 10), 'accumulate_items': (1001, CE, True, 2, 21 + 10),
         'tiny_37': (37, CE, False, 0, 2 + 1), 'empty_rank_50': (50, CE, False, 0, 3 + 1),
         'batch_change': (1001, CE, False, 0, None), 'batch_change_uneven': (1001, CE, False, 0, None)}
# a batch change: the batches of epoch 1 (of 8 x W0 samples) before the checkpoint of the world of W0 = 2 or 3; 31 x 16
# = 496 samples, which 3 ranks do not divide: 3 ranks start at item 496 of the epoch, rank 1 at its 165th
CHANGE = {'batch_change': {2: 30, 3: 20}, 'batch_change_uneven': {2: 31, 3: 21}}
def done(case, w0)->int: return CHANGE[case][w0]*8*w0   # the samples of epoch 1 read before the checkpoint
res = {}

def check(name, cond, figures=''):
    oks = gather_object(bool(cond))
    assert all(oks), f'{name} failed on ranks {[r for r, o in enumerate(oks) if not o]}: {figures}'
    if rank == 0: print(f'CHECK {name} OK {figures}', flush=True)

def rel(a, b)->float:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return ((a - b).abs().max()/b.abs().max().clamp_min(1e-12)).item()

def data(n, ignored):
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)
    if ignored: y[torch.rand(n, generator=g) < 0.3] = -100   # items the loss ignores: the ranks' counts differ
    return x, torch.arange(n), y

class MLP(nn.Module):
    "A small MLP whose input is a batch and its dataset indices (which it ignores)"
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    def forward(self, x, idx): return self.net(x)

class Samples(Callback):
    "The dataset indices of this rank's training batches, by (epoch, batch); the reference sets its loader's epoch"
    def before_fit(self): self.mine = []
    def before_epoch(self):
        for dl in self.learn.dls.loaders:
            if isinstance(getattr(dl, 'batch_sampler', None), Batches): dl.batch_sampler.epoch = self.learn.epoch
            if isinstance(dl, DistributedDL): dl.set_epoch(self.learn.epoch)
    def after_batch(self):
        if self.learn.training: self.mine.append((self.learn.epoch, self.learn.iter, self.learn.xb[1].tolist()))

def by_step(parts)->dict:
    "{(epoch, batch): sorted indices} from the ranks' `Samples.mine`"
    out = {}
    for part in parts:
        for e, i, idx in part: out.setdefault((e, i), []).extend(idx)
    return {k: sorted(v) for k, v in out.items()}

class Batches:
    """The batch sampler of one process reading what a batch change reads: the epoch's order (`shard_idxs` of one
    rank) in batches of `g0`, but in epoch 1, from sample `done` on, and in later epochs, batches of `g1`"""
    def __init__(self, n, g0, g1, done): self.n, self.g0, self.g1, self.done, self.epoch = n, g0, g1, done, 0
    def _sizes(self):
        if self.epoch == 0: return [self.g0]*(-(-self.n // self.g0))
        head = [self.g0]*(self.done // self.g0) if self.epoch == 1 else []
        rest = self.n - (self.done if self.epoch == 1 else 0)
        return head + [self.g1]*(-(-rest // self.g1))
    def __iter__(self):
        order, i = shard_idxs(self.n, 0, 1, shuffle=True, epoch=self.epoch, pad=False).tolist(), 0
        for s in self._sizes():
            yield order[i:i + s]
            i += s
    def __len__(self): return len(self._sizes())

def learner(case, bs, cbs=(), train=None, **kw):
    n, loss, ignored, acc, _ = CASES[case]
    x, i, y = data(n, ignored)
    valid = DataLoader(TensorDataset(x[:5], i[:5], y[:5]), batch_size=5)
    train = train or DataLoader(TensorDataset(x, i, y), batch_size=bs, shuffle=True)
    cbs = [Samples(), *cbs] + ([GradientAccumulation(acc*G)] if acc else [])
    learn = Learner(DataLoaders(train, valid), MLP(), loss, opt_func=partial(torch.optim.SGD, momentum=0.9), lr=0.05,
                    cbs=cbs, **kw)
    learn.progress.enabled = False
    return learn

def per_rank(case, world)->int: return 8 if case in CHANGE else G // world
def at(case, world)->int:
    "The checkpoint's step: a batch change's, after `CHANGE[case][world]` batches of epoch 1 of 8 x `world` samples"
    if case not in CHANGE: return CASES[case][4]
    return -(-CASES[case][0] // (8*world)) + CHANGE[case][world]

class Stop(Callback):
    "Stop the fit on every rank once the checkpoint of step `step` is written"
    def __init__(self, step): self.step = step
    def before_batch(self):
        if self.learn.training and self.learn.checkpoint.n_steps == self.step: raise CancelFitException()

def stop(case):
    d = tmp/f'{case}-from{W}'
    learn = learner(case, per_rank(case, W), cbs=[Stop(at(case, W))], path=d)
    ck = Checkpoint('ck', every_n_steps=at(case, W), every_epoch=False)
    with learn.distrib_ctx(): learn.fit(EPOCHS, cbs=ck)
    check(f'stop_{case}_{W}', learn.epoch == 1 and ck.n_steps == at(case, W))

def reference(case, w0):
    "One process, uninterrupted: the global batch of 24 (a batch change: 8 x w0, then 8 x W from `done` in epoch 1)"
    n, _, ignored, _, _ = CASES[case]
    ds = TensorDataset(*data(n, ignored))
    if case in CHANGE: train = DataLoader(ds, batch_sampler=Batches(n, 8*w0, 8*W, done(case, w0)))
    else: train = DistributedDL(ds, batch_size=G, shuffle=True, rank=0, world_size=1)
    one = learner(case, G, train=train, independent=True)
    one.fit(EPOCHS)
    return one

def resume(case, w0):
    d, change = tmp/f'{case}-from{w0}', case in CHANGE
    if rank == 0: shutil.copytree(d/'ck', d/f'ck-on{W}')   # the resumed fit writes its own checkpoints there
    gather_object(None)   # every rank waits for the copy
    learn, lines = learner(case, per_rank(case, W), path=d), []
    learn.logger = lines.append
    ck = Checkpoint(f'ck-on{W}', every_n_steps=at(case, W), every_epoch=False, allow_batch_change=change)
    with learn.distrib_ctx(): learn.fit(EPOCHS, cbs=ck)
    got, one = by_step(gather_object(learn.samples.mine)), reference(case, w0)
    ref = by_step([one.samples.mine])
    e, b = min(got)
    g0, at_b = 8*w0 if change else G, torch.load(d/'ck'/f'step-{at(case, w0)}.pth')['batch']   # the checkpoint's batch
    # every step after the resume read the reference's steps after the checkpoint's batch: the rest of epoch 1 and the
    # later epochs, each item once (a batch change numbers the rest of epoch 1 from another batch: its items count)
    rest = [v for k, v in sorted(ref.items()) if k >= (1, at_b)]
    same = e == 1 and b > 0 and (change or b == at_b) and [v for _, v in sorted(got.items())] == rest
    procs = lambda w: f"{w} process" + ('es' if w > 1 else '')
    kept = (f"global batch {8*W} (was {g0}), from sample {done(case, w0)} of the epoch" if change else
            f"global batch {G} kept")
    logged = bool(lines) and lines[0].endswith(f"written by {procs(w0)}), now on {procs(W)}, {kept}")
    dw = max(rel(p.detach(), q.detach()) for p, q in zip(learn.model.parameters(), one.model.parameters()))
    dl = max(abs(u - v)/abs(v) for a, b in zip(learn.recorder.values, one.recorder.values) for u, v in zip(a[:2], b[:2]))
    res[f'{case}_{w0}to{W}'] = dw
    check(f'resume_{case}_{w0}to{W}', same and (rank != 0 or logged) and len(learn.recorder.values) == EPOCHS
          and dw <= 1e-5 and dl <= 1e-6, f'weights {dw:.2e} losses {dl:.2e} resumed at (epoch {e}, batch {b}), the '
          f'checkpoint after batch {at_b}: samples {same} log {lines[:1]}')

for step in steps:
    if step == 'stop':
        for case in CASES: stop(case)
    elif step == 'resume':
        for case in CASES:
            for w0 in (2, 3):
                if w0 != W and (tmp/f'{case}-from{w0}').exists(): resume(case, w0)
        if rank == 0: print('RESUME ' + json.dumps(res), flush=True)
    else: raise ValueError(f"unknown step {step!r}")
teardown_distrib()
