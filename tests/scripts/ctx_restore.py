"""Under 2+ processes: distrib_ctx trains distributed, and leaves the Learner exactly as before, also after an error;
the DDP wrapper is gone on exit (its own collection frees it: automatic collection is off here) and no object is left
frozen"""
import gc, weakref
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.nn.parallel import DistributedDataParallel
from distrib import (Learner, DataLoaders, Callback, DistributedDL, rank_distrib, num_distrib,
                     pg_initialized, setup_distrib, teardown_distrib)

x = torch.randn(60, 3, generator=torch.Generator().manual_seed(0)); y = x.sum(1, keepdim=True)
dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True), DataLoader(TensorDataset(x, y), batch_size=8))
model = nn.Linear(3, 1)
learn = Learner(dls, model, nn.functional.mse_loss, opt_func=torch.optim.SGD, lr=0.05)
before = dict(model=learn.model, dls=learn.dls, loaders=list(learn.dls.loaders), cbs=list(learn.cbs),
              logger=learn.logger, progress=learn.progress.enabled)

wrappers = []
FROZEN = gc.get_freeze_count()   # what the interpreter froze itself (Python 3.12 starts with some frozen)
class KeepRef(Callback):
    "A weak reference to the model fit trains (the DDP wrapper)"
    def before_fit(self): wrappers.append(weakref.ref(self.learn.model))

def check_restored():
    assert wrappers and wrappers[-1]() is None, 'the DDP wrapper outlived distrib_ctx'
    assert gc.get_freeze_count() == FROZEN
    assert learn.model is before['model'] and type(learn.model) is nn.Linear
    assert learn.dls is before['dls'] and learn.dls.loaders == before['loaders']
    assert learn.cbs == before['cbs'] and not hasattr(learn, 'distributed_trainer')
    assert learn.logger is before['logger'] and learn.progress.enabled == before['progress']

gc.disable()
with learn.distrib_ctx(timeout=60):
    assert pg_initialized() and num_distrib() == 2
    assert isinstance(learn.model, DistributedDataParallel)
    assert all(isinstance(dl, DistributedDL) for dl in learn.dls.loaders)
    assert learn.progress.enabled == (rank_distrib() == 0)
    learn.fit(2, cbs=KeepRef())
check_restored()
assert pg_initialized() and num_distrib() == 2, "the process group lives as long as the process"
assert learn.world is None

class Boom(Callback):
    def before_batch(self):
        if self.learn.iter == 2: raise RuntimeError('boom')
try:
    with learn.distrib_ctx(timeout=60): learn.fit(1, cbs=[Boom(), KeepRef()])
    raise AssertionError('fit should have raised')
except RuntimeError as e: assert 'boom' in str(e)
check_restored()

# a process group created by the caller (after destroying distrib's) is used, and left alone
teardown_distrib()
assert not pg_initialized()
setup_distrib(timeout=60)
with learn.distrib_ctx(): learn.fit(1, cbs=KeepRef())
assert pg_initialized()
check_restored()
teardown_distrib()
gc.enable()
print(f'rank {rank_distrib()} OK')
