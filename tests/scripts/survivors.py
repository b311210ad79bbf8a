"""Lose a rank, go on in the same processes (issue 50): `python -m distrib.launch --on-failure continue
--nproc_per_node 3 survivors.py job DIR LOSS VICTIM`, or `python survivors.py ref DIR LOSS` (one process, the
reference). LOSS: `mean` (`F.mse_loss`, a batch mean) or `items` (the same as a sum and a count over items: the
`ItemMean` callback then all-reduces each step's count, over the world of the moment).

The data: 96 samples (a multiple of 1, 2, 3 and 6: no padding), a global batch of 6 (each rank reads `6 // W`), 16
steps per epoch, 3 epochs of Adam on a small MLP without dropout. In `job`, rank VICTIM (its rank when the job
started) prints `KILL_AT <time>` and SIGKILLs itself before the backward of batch 5 of epoch 1; every rank writes
`STEP <pid> <epoch> <batch> <time>` in DIR/steps<start rank>.txt after each optimizer step; at the end the rank 0
of the last world writes DIR/weights.pt and DIR/values.pt (the Recorder's `[train_loss, valid_loss]` per epoch) and
prints `DONE`. `ref` writes DIR/ref-LOSS.pt (and DIR/ref-LOSS-values.pt): the same fit in one process with the whole
global batch.

`SURVIVORS_KILLS=r:e:b:phase,...` replaces VICTIM's one kill: start rank `r` SIGKILLs itself at batch `b` of epoch
`e`, `phase` 'train' (before its backward), 'node' (there too, after SIGKILLing its launcher: its node is lost),
'valid' (after its forward in the validation pass) or 'end' (at `after_train`, before the Recorder's all-reduce of
the pass's losses; `b` is not read). `SURVIVORS_CHECKPOINT=1` adds
a `Checkpoint`.
Every rank opens a TCP connection of its own (`own_connection`) inside `distrib_ctx`, and uses it after the fit: the
survivors shut down their group's connections, never the script's.
`SURVIVORS_STALL=r`: start rank `r` sleeps 5 s after its step at batch 3 of epoch 2 (the other ranks wait for it).
"""
import os, signal, sys, time
from pathlib import Path
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset
from distrib import Learner, DataLoaders, DistributedDL, Callback, Checkpoint, set_seed, current_world

G, N, EPOCHS = int(os.environ.get('SURVIVORS_G', 6)), 96, 3   # the global batch, for a test
START = current_world()   # the place this process had when the job started

def kills(victim:int)->list:
    "The `(start rank, epoch, batch, phase)` of each kill"
    spec = os.environ.get('SURVIVORS_KILLS')
    if not spec: return [(victim, 1, 5, 'train')]
    return [(int(r), int(e), int(b), ph) for r, e, b, ph in (k.split(':') for k in spec.split(','))]

def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 8, generator=g)
    return TensorDataset(x, x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(N, 1, generator=g))

class Epochs(Callback):
    "The training loader reads each epoch's order (`DistributedTrainer` does it under `distrib_ctx`)"
    def before_epoch(self): self.learn.dls.train.set_epoch(self.learn.epoch)

class Steps(Callback):
    "Writes each optimizer step; each victim SIGKILLs itself at its place (`kills`)"
    order = 40   # before the Recorder's after_train
    def __init__(self, victim, d):
        self.f = open(d/f'steps{START.rank}.txt', 'w', buffering=1)
        self.kills = [k[1:] for k in kills(victim) if k[0] == START.rank]
        self.stall = os.environ.get('SURVIVORS_STALL')
    def _maybe_die(self, phase, batch=None):
        here = (self.learn.epoch, self.learn.iter if batch is None else batch, phase)
        if here in self.kills and self.learn.world is not None:
            print(f"KILL_AT {time.time()}", flush=True)
            if phase == 'node': os.kill(int(os.environ['DISTRIB_LAUNCHER_PID']), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
    def before_backward(self): self._maybe_die('train'); self._maybe_die('node')
    def after_pred(self):
        if not self.learn.training: self._maybe_die('valid')
    def after_train(self): self._maybe_die('end', 0)
    def after_step(self):
        self.f.write(f"STEP {os.getpid()} {self.learn.epoch} {self.learn.iter} {time.time()}\n")
        time.sleep(0.05)   # the steps last: the kill lands in the middle of the epoch
        if self.stall is not None and int(self.stall) == START.rank and (self.learn.epoch, self.learn.iter) == (2, 3):
            time.sleep(5)

def sum_and_count(pred, y): return F.mse_loss(pred, y, reduction='sum'), y.numel()

def learner(world_size:int, loss:str, victim:int|None=None, d:Path|None=None)->Learner:
    set_seed(0)
    ds = data()
    rank = 0 if world_size == 1 else START.rank
    train = DistributedDL(ds, batch_size=G // world_size, shuffle=True, seed=1, rank=rank, world_size=world_size)
    valid = DistributedDL(ds, batch_size=16, rank=rank, world_size=world_size, pad=False)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    cbs = [Epochs()] if victim is None else [Steps(victim, d)]
    if os.environ.get('SURVIVORS_CHECKPOINT') and d is not None: cbs.append(Checkpoint(d/'ck', every_epoch=1))
    return Learner(DataLoaders(train, valid), model, F.mse_loss if loss == 'mean' else sum_and_count, lr=1e-2, cbs=cbs)

def own_connection()->tuple:
    "A TCP connection of the script's own (a listener on 127.0.0.1 and a client): `(client, server side)`"
    import socket
    lst = socket.create_server(('127.0.0.1', 0))
    c = socket.create_connection(lst.getsockname())
    s, _ = lst.accept()
    lst.close()
    return c, s

if __name__ == '__main__':
    mode, d, loss = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    if mode == 'ref':
        learn = learner(1, loss)
        learn.fit(EPOCHS)
        torch.save(learn.model.state_dict(), d/f'ref-{loss}.pt')
        torch.save(learn.recorder.values, d/f'ref-{loss}-values.pt')
    else:
        learn = learner(START.world_size, loss, int(sys.argv[4]), d)
        with learn.distrib_ctx(backend='gloo'):
            mine = own_connection()   # opened after the group formed, as a tracker's would be: no loss may touch it
            learn.fit(EPOCHS)
            mine[0].sendall(b'x')
            assert mine[1].recv(1) == b'x', "the script's own connection was shut down by the survivors"
            if current_world().rank == 0:
                torch.save(learn.model.module.state_dict(), d/'weights.pt')
                torch.save(learn.recorder.values, d/'values.pt')
                print(f"DONE world {current_world().world_size}", flush=True)
