"""Resume on another number of processes, in the middle of an epoch, with the same global batch:
`python -m distrib.launch --nproc_per_node W reshard.py STEPS DIR`, STEPS one or more of the steps below joined by
`+`, run in this order in the same processes.

The data: 64 samples (a multiple of 1, 2 and 4: no padding), a global batch of 8 (each rank reads `8 // W`), 8
steps per epoch, 4 epochs of Adam on a small MLP without dropout, `Checkpoint('ck', every_n_steps=5)`: step 20 is
after batch 4 of epoch 2. Every training batch carries its dataset indices, which each rank records per (epoch,
batch): the samples of each global step.

- `ref`: the uninterrupted run (DDP); rank 0 writes DIR/ref.pt (weights, `recorder.values`, the samples of each step).
- `resume` (`resumefsdp`: under FSDP, from sharded checkpoints): first a script that keeps the per-rank batch of the
  old world (another global batch) must be refused before any step; then the same fit resumes from DIR/ck on this
  job's W; rank 0 prints `FIRST_STEP <time>` at the first step after the resume, `MAXDIFF reshard <W>-><W'> weights
  <d> values <d>` against DIR/ref.pt, and `CHECK <name> OK` for: reshard_refused, reshard_resumed (the log line),
  reshard_samples (each global step after the resume read the samples of the uninterrupted run), reshard_exact
  (weights and values within 1e-5).
- `elastic`: under `--nnodes 1:2`, one process per node: the first attempt trains as `kill` does (DIR/ck, DIR/old_world)
  but slowly (0.3 s per step; rank 0 prints `MIDEPOCH <time>` after batch 5 of epoch 2), for the test to SIGKILL
  the other node whole; a later attempt (the survivor's agent restarts it) runs `resume`, and prints `ATTEMPT <n>
  WORLD <W>`.
- `iterstop`: the same training from an iterable data set (`iter_shard` over the samples in the epoch's order that
  `DistributedDL` uses, so the same samples per step) with checkpoints in DIR/iter/ck, stopped on every rank
  (`CancelFitException`) before batch 6 of epoch 2; `iterresume`: `resume` of DIR/iter (its reshard_* checks, the
  iterable set skipping the epoch's first batches).
- `refuse`: prints `REFUSE ATTEMPT <n>`, then fits with the old world's per-rank batch, which Checkpoint refuses
  (`ResumeError`), uncaught: under `--max_restarts`, the launcher must not restart the job.
- `kill` (`killfsdp`: under FSDP): the run with checkpoints in K/ck, K = DIR, or DIR/next after a `resume` (and its
  W in K/old_world, DIR/ref.pt copied to K); rank 1 prints `KILL_AT <time>` and SIGKILLs itself before batch 6 of
  epoch 2: the job fails, and the last checkpoint is step 20's. Always the last step.
"""
import os, shutil, signal, sys, time
from pathlib import Path
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset, IterableDataset
from distrib import (Learner, DataLoaders, Callback, Checkpoint, set_seed, current_world, gather_object, setup_distrib,
                     iter_shard, index_shuffle, CancelFitException)
from distrib.state import full_model_state
from distrib.model import unwrap_model

steps, tmp = sys.argv[1].split('+'), Path(sys.argv[2])
FSDP = dict(strategy='fsdp', shard_classes=nn.Linear)
torch.set_num_threads(1)
world = current_world()
rank, W = world.rank, world.world_size
setup_distrib(timeout=60)
N, G = 64, 8

class Samples(Callback):
    "The dataset indices of each training batch of this rank, gathered on every rank at the end of the fit"
    def before_fit(self): self.mine, self.first = [], None
    def after_step(self):
        if self.first is None: self.first = time.time()
    def after_batch(self):
        if self.learn.training: self.mine.append((self.learn.epoch, self.learn.iter, self.learn.xb[1].tolist()))
    def after_fit(self):
        self.steps = {}
        for part in gather_object(self.mine):
            for e, i, idx in part: self.steps.setdefault((e, i), []).extend(idx)
        self.steps = {k: sorted(v) for k, v in self.steps.items()}

class MLP(nn.Module):
    "A small MLP whose input is a batch and its dataset indices (which it ignores)"
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    def forward(self, x, idx): return self.net(x)

class Stream(IterableDataset):
    "The samples in epoch `e`'s order of DistributedDL(shuffle=True, seed=0), split across ranks by iter_shard"
    def __init__(self, *ts): self.ts, self.epoch = ts, 0
    def set_epoch(self, epoch): self.epoch = epoch
    def __iter__(self):
        order = index_shuffle(torch.arange(len(self.ts[0])), len(self.ts[0]), seed=self.epoch)
        return iter_shard(tuple(t[i] for t in self.ts) for i in order.tolist())

def make_learner(bs=G // W, cbs=(), iterable=False):
    set_seed(0)
    x = torch.randn(N + 16, 6); y = (x @ torch.randn(6, 3)).argmax(1); i = torch.arange(N + 16)
    dls = DataLoaders(DataLoader(TensorDataset(x[:N], i[:N], y[:N]), batch_size=bs, shuffle=True),
                      DataLoader(TensorDataset(x[N:], i[N:], y[N:]), batch_size=8))
    learn = Learner(dls, MLP(), F.cross_entropy, lr=1e-2, path=tmp,
                    opt_func=torch.optim.Adam, cbs=[Samples(), *cbs])
    learn.progress.enabled = False
    if iterable: learn.dls = DataLoaders(DataLoader(Stream(x[:N], i[:N], y[:N]), batch_size=bs), learn.dls.valid)
    return learn

def check(name, ok, detail=''):
    oks = gather_object(bool(ok))
    assert all(oks), f"CHECK {name} failed on ranks {[r for r, o in enumerate(oks) if not o]}: {detail}"
    if rank == 0: print(f"CHECK {name} OK", flush=True)

class KillAt(Callback):
    def before_batch(self):
        if self.learn.training and rank == 1 and (self.learn.epoch, self.learn.iter) == (2, 6):
            print(f"KILL_AT {time.time()}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

class Slow(Callback):
    "0.3 s per step; rank 0 prints MIDEPOCH after batch 5 of epoch 2"
    def after_batch(self):
        if not self.learn.training: return
        time.sleep(0.3)
        if rank == 0 and (self.learn.epoch, self.learn.iter) == (2, 5): print(f"MIDEPOCH {time.time()}", flush=True)

def resume(ctx:dict, d:Path=tmp, iterable:bool=False):
    old_w = int((d/'old_world').read_text())
    bad = make_learner(bs=G // old_w + (1 if old_w == W else 0), iterable=iterable)   # another global batch
    bad.path = d
    w0 = [p.detach().clone() for p in bad.model.parameters()]
    try:
        with bad.distrib_ctx(**ctx): bad.fit(4, cbs=Checkpoint('ck', every_n_steps=5))
        msg = ''
    except ValueError as e: msg = str(e)
    sfx, olds = '_iterable' if iterable else '', f"{old_w} process" + ('es' if old_w > 1 else '')
    check('reshard_refused' + sfx, f'with a global batch of {G} ({olds} x {G // old_w})' in msg and
          'step-20' in msg and all(torch.equal(p, q) for p, q in zip(bad.model.parameters(), w0)), msg)
    learn, lines = make_learner(iterable=iterable), []
    learn.logger, learn.path = lines.append, d
    ck = Checkpoint('ck', every_n_steps=5)
    with learn.distrib_ctx(**ctx): learn.fit(4, cbs=ck)
    if rank == 0 and not iterable: print(f"FIRST_STEP {learn.samples.first}", flush=True)
    procs = f"{W} process" + ('es' if W > 1 else '')
    want = f"(epoch 2, batch 4{'' if iterable else ' of 8'}, written by {olds}), now on {procs}, global batch {G} kept"
    check('reshard_resumed' + sfx, ck.resumed_from.name == 'step-20' + ('' if ctx else '.pth') and
          (rank != 0 or lines[0].endswith(want)), (lines[:1], want))
    ref = torch.load(tmp/'ref.pt', weights_only=False)
    got = learn.samples.steps
    check('reshard_samples' + sfx, min(got) == (2, 4) and len(got) == 4 + 8 and
          all(v == ref['steps'][k] and len(v) == G for k, v in got.items()),
          [(k, v, ref['steps'][k]) for k, v in sorted(got.items()) if v != ref['steps'][k]][:2] or len(got))
    final = full_model_state(unwrap_model(learn.model), rank0_only=False)
    d = max((p - ref['model'][k]).abs().max().item() for k, p in final.items())
    dv = max(abs(u - v) for ru, rv in zip(learn.recorder.values, ref['values']) for u, v in zip(ru, rv))
    if rank == 0:
        kind = (' fsdp' if ctx else '') + (' iterable' if iterable else '')
        print(f"MAXDIFF reshard {old_w}->{W}{kind} weights {d:.3g} values {dv:.3g}", flush=True)
    check('reshard_exact' + sfx, len(learn.recorder.values) == 4 and d <= 1e-5 and dv <= 1e-5, (d, dv))

def kill(ctx:dict, k:Path):
    if rank == 0:
        k.mkdir(exist_ok=True)
        (k/'old_world').write_text(str(W))
        if k != tmp: shutil.copy(tmp/'ref.pt', k/'ref.pt')
    learn = make_learner(cbs=[KillAt()])
    learn.path = k
    with learn.distrib_ctx(**ctx): learn.fit(4, cbs=Checkpoint('ck', every_n_steps=5))
    raise AssertionError("rank 1 was not killed")

for step in steps:
    if step == 'ref':
        ref = make_learner()
        with ref.distrib_ctx(): ref.fit(4)
        if rank == 0: torch.save({'model': ref.model.state_dict(), 'values': ref.recorder.values,
                                  'steps': ref.samples.steps}, tmp/'ref.pt')
    elif step in ('resume', 'resumefsdp'): resume(FSDP if step == 'resumefsdp' else {})
    elif step == 'iterstop':
        (tmp/'iter').mkdir(exist_ok=True)
        if rank == 0: (tmp/'iter'/'old_world').write_text(str(W))
        class Stop(Callback):
            def before_batch(self):
                if self.learn.training and (self.learn.epoch, self.learn.iter) == (2, 6): raise CancelFitException()
        it = make_learner(cbs=[Stop()], iterable=True)
        it.path = tmp/'iter'
        with it.distrib_ctx(): it.fit(4, cbs=Checkpoint('ck', every_n_steps=5))
    elif step == 'iterresume': resume({}, tmp/'iter', iterable=True)
    elif step == 'refuse':
        print(f"REFUSE ATTEMPT {world.restart_count}", flush=True)
        bad = make_learner(bs=G // int((tmp/'old_world').read_text()))
        with bad.distrib_ctx(): bad.fit(4, cbs=Checkpoint('ck', every_n_steps=5))
    elif step == 'elastic':
        print(f"ATTEMPT {world.restart_count} WORLD {W}", flush=True)
        if world.restart_count: resume({})
        else:
            if rank == 0: (tmp/'old_world').write_text(str(W))
            learn = make_learner(cbs=[Slow()])
            with learn.distrib_ctx(): learn.fit(4, cbs=Checkpoint('ck', every_n_steps=5))
            raise AssertionError("the other node was not killed")
    elif step in ('kill', 'killfsdp'):
        kill(FSDP if step == 'killfsdp' else {}, tmp/'next' if any(s.startswith('resume') for s in steps) else tmp)
    else: raise ValueError(f"unknown step {step!r}")
