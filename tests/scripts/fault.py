"""A fault on rank 1 in the middle of an epoch: `python -m distrib.launch fault.py MODE [TIMEOUT]`.

MODE: `raise` (ValueError in before_batch at batch 3), `sigkill` (SIGKILL itself at batch 3), `hang` (sleep past the
collective timeout at batch 3: rank 0 waits in the gradient all-reduce), `barrier` (sleep before a barrier that
rank 0 already waits in). Rank 1 prints `FAULT_AT <time.time()>` just before the fault.
"""
import os, sys, time, signal
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from distrib import Learner, DataLoaders, Callback, rank_distrib, distrib_barrier, setup_distrib, teardown_distrib

mode, timeout = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 60.

def fault():
    print(f"FAULT_AT {time.time()}", flush=True)
    if mode == 'raise': raise ValueError('bad batch on purpose')
    if mode == 'sigkill': os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)  # 'hang', 'barrier': stuck far past the timeout

class Fault(Callback):
    def before_batch(self):
        if rank_distrib() == 1 and self.learn.iter == 3: fault()

x = torch.randn(800, 3, generator=torch.Generator().manual_seed(0)); y = x.sum(1, keepdim=True)
dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=4), DataLoader(TensorDataset(x, y), batch_size=8))
learn = Learner(dls, nn.Linear(3, 1), nn.functional.mse_loss)
# a short timeout also bounds the rendezvous: on a loaded machine one rank may start seconds after the other, so
# first meet in a group with a long timeout (its teardown is a barrier), then create the short-timeout group together
setup_distrib(timeout=120); teardown_distrib()
with learn.distrib_ctx(timeout=timeout):
    if mode == 'barrier':
        if rank_distrib() == 1: fault()
        distrib_barrier()
    learn.fit(2, cbs=Fault())
print(f"rank {rank_distrib()} finished: the fault did not happen", flush=True)
