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
from distrib import (Learner, DataLoaders, Callback, rank_distrib, unwrap_model, CancelBatchException,
                     CancelTrainException, CancelFitException, rank0_first, long_phase, distrib_barrier, DistributedDL)

rank = rank_distrib()

def make_learn(n_train=64, model=None, bs=8, lr=0.01, opt_func=torch.optim.SGD, loss=nn.functional.mse_loss,
               shuffle=True, n_valid=16):
    x = torch.randn(n_train, 3); y = x.sum(1, keepdim=True)
    dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=bs, shuffle=shuffle),
                      DataLoader(TensorDataset(x[:n_valid], y[:n_valid]), batch_size=bs))
    learn = Learner(dls, model or nn.Linear(3, 1), loss, opt_func=opt_func, lr=lr)
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

def case_tiny():   # padded (DistributedSampler's behaviour): the rank past the one sample would train on a copy
    learn = make_learn(n_train=1)
    learn.dls.loaders[0] = DistributedDL(learn.dls.train.dataset, batch_size=8, shuffle=True, pad=True)
    with learn.distrib_ctx(timeout=30): learn.fit(1)

def case_nested():
    learn = make_learn()
    with learn.distrib_ctx(timeout=30):
        with learn.distrib_ctx(timeout=30): learn.fit(1)

def case_lr():  # the ranks' weights would drift apart while the reported (averaged) losses agree
    learn = make_learn(lr=0.01 if rank == 0 else 0.02)
    with learn.distrib_ctx(timeout=30): learn.fit(1)

def case_opt():
    learn = make_learn(opt_func=torch.optim.SGD if rank == 0 else torch.optim.Adam)
    with learn.distrib_ctx(timeout=30): learn.fit(1)

def case_loss():
    learn = make_learn(loss=nn.functional.mse_loss if rank == 0 else nn.functional.l1_loss)
    with learn.distrib_ctx(timeout=30): learn.fit(1)

def case_shuffle():  # the shards would overlap: some samples twice per epoch, others never
    learn = make_learn(shuffle=rank == 0)
    with learn.distrib_ctx(timeout=30): learn.fit(1)

def case_split():  # each rank draws its own random split (no seed): the same lengths, other items
    from torch.utils.data import random_split
    x = torch.randn(80, 3); y = x.sum(1, keepdim=True)
    torch.manual_seed(rank)   # what two processes do without a seed: torch seeds each from the OS
    train, valid = random_split(TensorDataset(x, y), [64, 16])
    learn = Learner(DataLoaders(DataLoader(train, batch_size=8, shuffle=True), DataLoader(valid, batch_size=8)),
                    nn.Linear(3, 1), nn.functional.mse_loss, opt_func=torch.optim.SGD, lr=0.01)
    learn.progress.enabled = False
    with learn.distrib_ctx(timeout=30): learn.fit(1)

def case_dtype():  # DDP's first broadcast of tensors of different sizes would abort the process (SIGABRT)
    learn = make_learn(model=nn.Linear(3, 1) if rank == 0 else nn.Linear(3, 1).double())
    with learn.distrib_ctx(timeout=30): learn.fit(1)

def case_valid_len():  # validate outside fit: metrics over a mix of two validation sets
    learn = make_learn(n_valid=16 if rank == 0 else 12)
    with learn.distrib_ctx(timeout=30): learn.validate()

def case_preds_len():  # get_preds outside fit: 14 predictions for 16 and 12 samples
    learn = make_learn(n_valid=16 if rank == 0 else 12)
    with learn.distrib_ctx(timeout=30): learn.get_preds()

class CancelEverywhere(Callback):
    "Cancels a batch, an epoch's training, then the fit, on every rank at the same points: agreed, not refused"
    def before_batch(self):
        l = self.learn
        if not l.training: return
        if l.epoch == 0 and l.iter == 1: raise CancelBatchException()
        if l.epoch == 0 and l.iter == 2: raise CancelTrainException()
        if l.epoch == 1 and l.iter == 0: raise CancelFitException()

def case_cancel_all():
    learn = make_learn()
    with learn.distrib_ctx(timeout=30): learn.fit(3, cbs=CancelEverywhere())
    assert learn.epoch == 1 and len(learn.recorder.values) == 1, (learn.epoch, learn.recorder.values)

def case_long_phase():  # rank 0 busy past the 1 s timeout, in rank0_first and in a declared long phase: no stall
    learn = make_learn()
    with learn.distrib_ctx(timeout=1):
        rank0_first(lambda: time.sleep(2.5) if rank == 0 else None)
        if rank == 0:
            with long_phase('evaluating on rank 0'): time.sleep(2.5)
        distrib_barrier()
        learn.fit(1)

def case_cuda():
    learn = make_learn()
    with learn.distrib_ctx(device='cuda', timeout=30): learn.fit(1)

cases = sys.argv[1:] or ['len_dl', 'split', 'params', 'grown', 'epochs', 'callback', 'local_only', 'tiny', 'nested', 'lr', 'opt',
                         'loss', 'shuffle', 'dtype', 'valid_len', 'preds_len', 'cancel_all', 'long_phase', 'cuda']
for name in cases:
    start = time.perf_counter()
    try:
        globals()[f'case_{name}']()
        res = 'OK'
    except Exception as e: res = f"{type(e).__name__}: {e}".replace('\n', ' | ')
    sys.stdout.write(f"CASE {name} rank {rank} {time.perf_counter()-start:.2f}s {res}\n")  # one write: lines of ranks never mix
    sys.stdout.flush()
