"""Trains until stopped from outside: `python -m distrib.launch interrupt.py [stubborn]`.

Each rank prints `PID <rank> <pid>`, then rank 0 prints `TRAINING` once the first batch ran. With `stubborn`,
rank 1 ignores SIGINT and SIGTERM and sleeps (it prints `STUBBORN` first): only SIGKILL ends it.
"""
import os, sys, time, signal
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from distrib import Learner, DataLoaders, Callback, rank_distrib

print(f"PID {os.environ['RANK']} {os.getpid()}", flush=True)

class Mark(Callback):
    def after_batch(self):
        if self.learn.iter == 0 and self.learn.epoch == 0:
            if rank_distrib() == 0: print('TRAINING', flush=True)
            if rank_distrib() == 1 and sys.argv[1:] == ['stubborn']:
                signal.signal(signal.SIGINT, signal.SIG_IGN); signal.signal(signal.SIGTERM, signal.SIG_IGN)
                print('STUBBORN', flush=True)
                while True: time.sleep(1)
        time.sleep(0.01)

x = torch.randn(4000, 3); y = x.sum(1, keepdim=True)
dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=4), DataLoader(TensorDataset(x, y), batch_size=8))
learn = Learner(dls, nn.Linear(3, 1), nn.functional.mse_loss)
with learn.distrib_ctx(timeout=300):
    learn.fit(1000, cbs=Mark())
