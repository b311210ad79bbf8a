"""Collectives right before teardown, ROUNDS times in one job: all-reduces, DDP backward, then the group is destroyed
while the last all-reduces may still be in flight: by `teardown_distrib()` in each round but the last, and by the
teardown at the interpreter's exit after the last. Prints 'round N done' per round, 'done' at the end."""
import sys
import torch
from torch import nn
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from distrib import Learner, DataLoaders, teardown_distrib

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 4
x = torch.randn(64, 8); y = x.sum(1, keepdim=True)
dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=4), DataLoader(TensorDataset(x, y), batch_size=4))
learn = Learner(dls, nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)), nn.functional.mse_loss)
learn.progress.enabled = False
for r in range(ROUNDS):
    with learn.distrib_ctx(timeout=30):   # creates the group when none exists (every round after the first)
        learn.fit(1)
        for _ in range(20): dist.all_reduce(torch.ones(1000))  # still in flight as teardown starts
    if r < ROUNDS - 1: teardown_distrib()
    print(f'round {r} done', flush=True)
print('done')
