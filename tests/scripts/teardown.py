"Collectives right before teardown: all-reduces, DDP backward, then distrib_ctx's exit destroys the group"
import torch
from torch import nn
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from distrib import Learner, DataLoaders

x = torch.randn(64, 8); y = x.sum(1, keepdim=True)
dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=4), DataLoader(TensorDataset(x, y), batch_size=4))
learn = Learner(dls, nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)), nn.functional.mse_loss)
with learn.distrib_ctx(timeout=30):
    learn.fit(1)
    for _ in range(20): dist.all_reduce(torch.ones(1000))  # still in flight as teardown starts
print('done')
