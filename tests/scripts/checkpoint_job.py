"""Checkpoint, restarts and preemption on 2 gloo processes: `python -m distrib.launch [...] checkpoint_job.py MODE DIR`.

MODE `restart` (with `--max_restarts 2`): attempt 0 trains 4 epochs with `Checkpoint(every_n_steps=5)`, and rank 1
SIGKILLs itself at batch 6 of epoch 2 (the last checkpoint is after batch 4); torchrun restarts both workers, which
create their process group under the new attempt's store prefix, resume from that checkpoint and finish. Attempt 1
then checks, each printing `CHECK <name> OK`:
- restart_exact: the final weights and `recorder.values` equal, bit for bit, those of an uninterrupted run;
- keep_last: `DIR/ck` holds the last 2 checkpoints and no temporary file;
- one_rank_signal: SIGUSR1 to rank 1 alone stops both ranks at the same step, with `Preempted` (code 138);
- save_model: `SaveModelCallback` under DDP picks the epoch one process with the global batch picks, and loads the
  same weights (1e-6), on every rank.
It also leaves in `DIR/ws` the checkpoints of a run without dropout, and its final state in `DIR/ws_final.pth`, for
`checkpoint_world.py` (resuming with 1 process).

MODE `train`: trains 4 epochs with `Checkpoint(signals=('SIGTERM', 'SIGUSR1'))`, slowly (0.1 s per step; rank 0
prints `MIDEPOCH` at batch 2 of epoch 1), so that a signal sent to the launcher then lands in the middle of epoch 1;
each rank prints `PREEMPTED rank <r> step <n> file <f>` and leaves with code 143. MODE `resume` resumes, finishes and
checks (preempt_resumed, preempt_exact) against an uninterrupted run.

Rank 0 prints `MAXDIFF <name> <largest absolute difference>` for each comparison.
"""
import os, shutil, signal, sys, time
from pathlib import Path
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from fastcore.basics import noop
from distrib import (Learner, DataLoaders, Callback, Checkpoint, Preempted, SaveModelCallback, MixedPrecision,
                     DistributedDL, set_seed, current_world, gather_object, setup_distrib, checkpoints)

mode, tmp = sys.argv[1], Path(sys.argv[2])
torch.set_num_threads(1)
world = current_world()
rank, W, attempt = world.rank, world.world_size, world.restart_count
setup_distrib(timeout=60)
print(f"ATTEMPT {attempt} RANK {rank}", flush=True)
N, B = 64, 4   # 8 batches per rank per epoch with 2 processes

def make_learner(p=0.2, bs=B, path=tmp, cbs=None, mp=True):
    "A classifier with dropout (its random states matter) and float16 with a GradScaler whose scale moves"
    set_seed(0)
    x = torch.randn(N + 24, 6); y = (x @ torch.randn(6, 3)).argmax(1)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(p), nn.Linear(16, 3))
    dls = DataLoaders(DataLoader(TensorDataset(x[:N], y[:N]), batch_size=bs, shuffle=True),
                      DataLoader(TensorDataset(x[N:], y[N:]), batch_size=8))
    mp = [MixedPrecision('fp16', init_scale=2.**12, growth_interval=3)] if mp else []
    learn = Learner(dls, model, F.cross_entropy, lr=1e-2, path=path, cbs=mp + (cbs or []))
    learn.progress.enabled, learn.logger = False, noop
    return learn

def check(name, ok, detail=''):
    "Every rank must pass `name`; rank 0 prints the CHECK line"
    oks = gather_object(bool(ok))
    assert all(oks), f"CHECK {name} failed on ranks {[r for r, o in enumerate(oks) if not o]}: {detail}"
    if rank == 0: print(f"CHECK {name} OK", flush=True)

def maxdiff(name, a, b):
    "Largest absolute difference between the parameters of learners `a` and `b` and between their recorded values"
    d = max((p - q).abs().max().item() for p, q in zip(a.model.parameters(), b.model.parameters()))
    dv = max(abs(u - v) for ru, rv in zip(a.recorder.values, b.recorder.values) for u, v in zip(ru, rv))
    if rank == 0: print(f"MAXDIFF {name} weights {d:.3g} values {dv:.3g}", flush=True)
    return max(d, dv)

def exact(a, b)->bool:
    "Bit for bit: parameters, recorded values, the scaler's scale"
    return (all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
            and a.recorder.values == b.recorder.values and len(a.recorder.values) == 4
            and a.mixed_precision.scaler.get_scale() == b.mixed_precision.scaler.get_scale())

def uninterrupted():
    ref = make_learner()
    with ref.distrib_ctx(): ref.fit(4)
    return ref

class At(Callback):
    "Call `fn()` on rank `on` when training reaches batch `it` of epoch `epoch` (in `event`)"
    def __init__(self, epoch, it, fn, on=1, event='before_batch'):
        self.at, self.fn, self.on = (epoch, it), fn, on
        setattr(self, event, self._maybe)
    def _maybe(self):
        if self.learn.training and rank == self.on and (self.learn.epoch, self.learn.iter) == self.at: self.fn()

if mode == 'restart':
    kill = At(2, 6, lambda: os.kill(os.getpid(), signal.SIGKILL))
    ck = Checkpoint('ck', every_n_steps=5)
    learn = make_learner(cbs=[kill] if attempt == 0 else [])
    with learn.distrib_ctx(): learn.fit(4, cbs=ck)
    assert attempt == 1, f"attempt {attempt} finished: rank 1 was not killed"
    check('resumed_mid_epoch', ck.resumed_from == tmp/'ck'/'step-20.pth', ck.resumed_from)
    ref = uninterrupted()
    maxdiff('restart', learn, ref)
    check('restart_exact', exact(learn, ref))
    check('keep_last', sorted(os.listdir(tmp/'ck')) == ['step-30.pth', 'step-32.pth'], os.listdir(tmp/'ck'))

    # SIGUSR1 on rank 1 only, in batch 3 of epoch 1: both ranks stop after the same later step (the ranks agree every
    # few steps, within 0.5 s), checkpointed
    sig = make_learner(cbs=[At(1, 3, lambda: os.kill(os.getpid(), signal.SIGUSR1), event='after_pred')])
    try:
        with sig.distrib_ctx(): sig.fit(4, cbs=Checkpoint('sig', signals=('SIGTERM', 'SIGUSR1')))
        stop = None
    except Preempted as e: stop = (e.code, e.file.name, torch.load(e.file)['epoch'], torch.load(e.file)['batch'])
    stops = gather_object(stop)
    check('one_rank_signal', stops[0] == stops[1] and stops[0] is not None and stops[0][0] == 138
          and (1, 3) < stops[0][2:] < (4, 0) and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL, stops)

    # SaveModelCallback under DDP against one process with the global batch (DistributedDL, world size 1)
    class SetEpoch(Callback):
        def before_epoch(self): self.learn.dls.train.set_epoch(self.learn.epoch)
    def save_model_run(ddp):
        cbs = [SaveModelCallback(monitor='valid_loss'), Weights()]
        learn = make_learner(p=0., path=tmp/('ddp' if ddp else f'one{rank}'), mp=False, cbs=cbs)
        learn.lr = 0.05   # the validation loss is lowest at epoch 1 of 6 (0.19; 0.26 to 0.38 in the others)
        if ddp:
            with learn.distrib_ctx(): learn.fit(6)
        else:
            learn.dls = DataLoaders(DistributedDL(learn.dls.train.dataset, batch_size=W*B, shuffle=True, rank=0,
                                                  world_size=1), learn.dls.valid)
            learn.independent = True
            learn.fit(6, cbs=SetEpoch())
        return learn
    class Weights(Callback):
        order = 70
        def before_fit(self): self.log = []
        def after_epoch(self): self.log.append([p.detach().clone() for p in self.learn.model.parameters()])
    ddp, one = save_model_run(True), save_model_run(False)
    best = lambda l: min(range(6), key=[v[1] for v in l.recorder.values].__getitem__)
    vals = max(abs(u - v)/abs(v) for ru, rv in zip(ddp.recorder.values, one.recorder.values) for u, v in zip(ru, rv))
    w = max(((p - q).abs().max()/q.abs().max()).item() for p, q in zip(ddp.model.parameters(), one.model.parameters()))
    loaded = all(torch.equal(p, q) for p, q in zip(ddp.model.parameters(), ddp.weights.log[best(ddp)]))
    if rank == 0: print(f"MAXDIFF save_model (relative) values {vals:.3g} weights {w:.3g} best epoch {best(ddp)}",
                        flush=True)
    check('save_model', vals <= 1e-6 and w <= 1e-6 and best(ddp) == best(one) and 0 < best(ddp) < 5 and loaded
          and len(set(gather_object(best(ddp)))) == 1, (vals, w, best(ddp), best(one)))

    # for checkpoint_world.py: the checkpoints of a run without dropout, and where it ends
    ws = make_learner(p=0., mp=False)
    with ws.distrib_ctx(): ws.fit(4, cbs=Checkpoint('ws', every_n_steps=5, keep_last=None))
    if rank == 0: torch.save({'model': ws.model.state_dict(), 'values': ws.recorder.values}, tmp/'ws_final.pth')

elif mode == 'train':
    class Slow(Callback):
        "Steps of 0.1 s, so that a signal sent when rank 0 says MIDEPOCH lands in the middle of epoch 1"
        def after_batch(self): time.sleep(0.1)
    learn = make_learner(cbs=[Slow(), At(1, 2, lambda: print("MIDEPOCH", flush=True), on=0)])
    try:
        with learn.distrib_ctx(): learn.fit(4, cbs=Checkpoint('ck', signals=('SIGTERM', 'SIGUSR1')))
    except Preempted as e:
        # one write per line: the ranks share the launcher's stdout, and print() writes the text and its newline apart
        n = torch.load(e.file)['n_steps']
        sys.stdout.write(f"PREEMPTED rank {rank} step {n} file {e.file.name} code {e.code}\n")
        sys.stdout.flush()
        raise
    print(f"rank {rank}: finished without being stopped", flush=True)

elif mode == 'resume':
    ck = Checkpoint('ck', signals=('SIGTERM', 'SIGUSR1'), keep_last=None)   # keep the file it resumes from
    learn = make_learner()
    with learn.distrib_ctx(): learn.fit(4, cbs=ck)
    f = ck.resumed_from
    check('preempt_resumed', f is not None and torch.load(f)['batch'] != 0, f)
    ref = uninterrupted()
    maxdiff('preempt', learn, ref)
    check('preempt_exact', exact(learn, ref))
