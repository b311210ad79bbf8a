"""The fits that compare distrib with fastai: the same data, initial weights, optimizer (torch's SGD and Adam; fastai
uses them through its `OptimWrapper`), loss, metric and batch order (no shuffling, every batch kept). Imports torch
only: `record.py` runs the cases in fastai (in a virtual environment of its own), `tests/test_fastai_parity.py` in
distrib."""
from functools import partial
import torch
from torch import nn

N_TRAIN, N_VALID, BS = 64, 32, 8          # 8 steps an epoch

def data()->tuple:
    "((x_train, y_train), (x_valid, y_valid)): 5 features, 2 classes from a noisy linear rule"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_TRAIN + N_VALID, 5, generator=g)
    w = torch.randn(5, generator=g)
    y = ((x @ w + 0.8*torch.randn(N_TRAIN + N_VALID, generator=g)) > 0).long()
    return (x[:N_TRAIN], y[:N_TRAIN]), (x[N_TRAIN:], y[N_TRAIN:])

def model()->nn.Module:
    "The network, with the same initial weights at every call"
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 2))

OPTS = {'sgd': partial(torch.optim.SGD, momentum=0.9), 'adam': torch.optim.Adam}

# name -> what runs: the optimizer, then 'one_cycle' (fit_one_cycle(n_epoch, lr)), 'fit' (fit(n_epoch, lr)),
# 'lr_find' (lr_find(), its valley suggestion) or 'save_early' (fit(n_epoch, lr) with SaveModelCallback and
# EarlyStoppingCallback(patience=1) on valid_loss: the epochs run, and the best model loaded at the end)
CASES = {'one_cycle_sgd': dict(opt='sgd', run='one_cycle', n_epoch=3, lr=0.05),
         'adam': dict(opt='adam', run='fit', n_epoch=3, lr=0.01),
         'lr_find': dict(opt='sgd', run='lr_find', lr=1e-3),
         'save_early': dict(opt='adam', run='save_early', n_epoch=12, lr=0.05)}

def flat(m:nn.Module)->list: return torch.cat([p.detach().flatten() for p in m.parameters()]).tolist()
