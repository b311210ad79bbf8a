"""Bad set-ups that must fail on every rank at once, never hang: `python -m distrib.launch disagree.py [CASE ...]`.

Each case runs in turn (all of them by default) and prints `CASE <name> rank <r> <seconds>s <Type>: <message>`, or
`CASE <name> rank <r> <seconds>s OK` when fit ran. Every case fails on every rank alike, so the process group, which
lives as long as the process, serves the next case: the job goes on.
"""
import sys, time
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from distrib import Learner, DataLoaders, Callback, rank_distrib, unwrap_model

rank = rank_distrib()

def make_learn(n_train=64, model=None, bs=8):
    x = torch.randn(n_train, 3); y = x.sum(1, keepdim=True)
    dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=bs, shuffle=True),
                      DataLoader(TensorDataset(x[:16], y[:16]), batch_size=bs))
    learn = Learner(dls, model or nn.Linear(3, 1), nn.functional.mse_loss, opt_func=torch.optim.SGD, lr=0.01)
    learn.progress.enabled = False
    return learn

class AllReduceEachEpoch(Callback):
    "Runs a collective of its own: on one rank only, it would hang the others"
    def after_epoch(self): dist.all_reduce(torch.ones(1))

class LogOnRank0(Callback):
    "Runs no collective: fine on rank 0 only"
    local_only = True
    def after_epoch(self): pass

def case_len_dl():
    learn = make_learn(64 if rank == 0 else 48)  # 4 batches of 8 per rank, or 3
    with learn.distrib_ctx(timeout=30): learn.fit(1)

def case_params():
    learn = make_learn(model=nn.Linear(3, 1) if rank == 0 else nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1)))
    with learn.distrib_ctx(timeout=30): learn.fit(1)

def case_grown():
    learn = make_learn()
    with learn.distrib_ctx(timeout=30):
        if rank == 1: unwrap_model(learn.model).extra = nn.Linear(2, 2)  # changed after DDP wrapped it
        learn.fit(1)

def case_epochs():
    learn = make_learn()
    with learn.distrib_ctx(timeout=30): learn.fit(1 if rank == 0 else 2)

def case_callback():
    learn = make_learn()
    with learn.distrib_ctx(timeout=30): learn.fit(1, cbs=AllReduceEachEpoch() if rank == 1 else None)

def case_local_only():
    learn = make_learn()
    with learn.distrib_ctx(timeout=30): learn.fit(1, cbs=LogOnRank0() if rank == 0 else None)

def case_tiny():
    learn = make_learn(n_train=1)
    with learn.distrib_ctx(timeout=30): learn.fit(1)

def case_nested():
    learn = make_learn()
    with learn.distrib_ctx(timeout=30):
        with learn.distrib_ctx(timeout=30): learn.fit(1)

def case_cuda():
    learn = make_learn()
    with learn.distrib_ctx(device='cuda', timeout=30): learn.fit(1)

cases = sys.argv[1:] or ['len_dl', 'params', 'grown', 'epochs', 'callback', 'local_only', 'tiny', 'nested', 'cuda']
for name in cases:
    start = time.perf_counter()
    try:
        globals()[f'case_{name}']()
        res = 'OK'
    except Exception as e: res = f"{type(e).__name__}: {e}".replace('\n', ' | ')
    sys.stdout.write(f"CASE {name} rank {rank} {time.perf_counter()-start:.2f}s {res}\n")  # one write: lines of ranks never mix
    sys.stdout.flush()
