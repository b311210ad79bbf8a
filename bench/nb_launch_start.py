"""How long `notebook_launch(fn, nprocs=2)` takes, for functions that do (almost) nothing: its start-up cost.

    python bench/nb_launch_start.py          # each function twice, as a notebook calls it: the first call, then again

`trivial` returns at once; `ddp` builds a `DistributedDataParallel` model (what every training function does
first); `fit` trains a 2-parameter Learner for one epoch of 2 batches under `distrib_ctx`. Target: under 2 s.
"""
import sys, time
t0 = time.perf_counter()
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from distrib import notebook_launch, setup_distrib, Learner, DataLoaders

def trivial(): return 1

def ddp():
    setup_distrib()
    return type(nn.parallel.DistributedDataParallel(nn.Linear(2, 2))).__name__

def fit():
    ds = TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
    learn = Learner(DataLoaders(DataLoader(ds, batch_size=4), DataLoader(ds, batch_size=4)), nn.Linear(2, 1),
                    nn.functional.mse_loss)
    learn.progress.enabled = False
    with learn.distrib_ctx(): learn.fit(1)
    return len(learn.recorder.values)

if __name__ == '__main__':
    print(f"import torch and distrib: {time.perf_counter()-t0:.2f} s")
    for fn in (trivial, ddp, fit):
        for call in ('first', 'second'):
            start = time.perf_counter()
            res = notebook_launch(fn, nprocs=2, timeout=120)
            print(f"notebook_launch({fn.__name__}), {call} call: {time.perf_counter()-start:.2f} s (returned {res})")
