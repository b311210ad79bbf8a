"""A job of 4 ranks training a small model for STEPS steps, each rank sleeping 20 ms per step in `before_batch` (its
work), and rank 3 60 ms when `slow` is given (3 times the work): the straggler check names rank 3, once, on rank 0's
stderr, and nothing in a healthy job. `python -m distrib.launch --nproc_per_node 4 straggler.py STEPS [slow]`.
Each rank prints `ROUNDS <rank> <n>`: the rounds of the straggler check it decided in (read the whole histogram)."""
import sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from distrib import Learner, DataLoaders, Callback, rank_distrib, num_distrib
from distrib.runtime.position import rank_state

steps, slow = int(sys.argv[1]), 'slow' in sys.argv[2:]

class Work(Callback):
    "Each rank's work per training step: a sleep, 3 times longer on rank 3 when `slow`"
    def before_batch(self):
        if self.learn.training: time.sleep(0.06 if slow and rank_distrib() == 3 else 0.02)

torch.manual_seed(0)
n = steps * 4 * num_distrib()  # `steps` batches of 4 per rank
x = torch.randn(n, 8); y = x.sum(1, keepdim=True)
dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=4), DataLoader(TensorDataset(x[:16], y[:16]), batch_size=4))
learn = Learner(dls, nn.Linear(8, 1), nn.functional.mse_loss, cbs=Work())
learn.progress.enabled = False
with learn.distrib_ctx(): learn.fit(1)
print(f"ROUNDS {rank_distrib()} {rank_state().memo.straggler.get('decided', 0)}", flush=True)
