"""A script that ends on an uncaught exception after training, on `WHO` ('all' or a rank): the process group is
destroyed at exit without a barrier, so no rank waits for peers that are gone, and the job ends at once.
`python -m distrib.launch exit_after_error.py WHO` (or torchrun directly, without distrib.launch.worker)."""
import sys, time
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from distrib import Learner, DataLoaders, rank_distrib

who = sys.argv[1]
x = torch.randn(64, 3); y = x.sum(1, keepdim=True)
dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=8), DataLoader(TensorDataset(x, y), batch_size=8))
learn = Learner(dls, nn.Linear(3, 1), nn.functional.mse_loss)
learn.progress.enabled = False
with learn.distrib_ctx(): learn.fit(1)
for _ in range(5): dist.all_reduce(torch.ones(100))  # collectives just before the end
print(f"ERROR_AT {time.time()} rank {rank_distrib()}", flush=True)
if who == 'all' or int(who) == rank_distrib(): raise ValueError(f'failed after training on rank {rank_distrib()}')
