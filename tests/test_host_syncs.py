"""The host-sync checks can fail (issue 49): on CPU, where CUDA's sync debug mode has nothing to see, `HostReads`
(tests/host_syncs.py, which tests/scripts/gpu_syncs.py counts with) catches each kind of synchronising call planted in
a `Learner`'s training step, names its line, and sees none in the step without one; the CUDA side's filter takes
torch's "called a synchronizing CUDA operation" warnings and not its one-time prototype notice."""
import warnings
import pytest, torch
from torch import nn
from torch.utils.data import TensorDataset, DataLoader
from distrib import Learner, DataLoaders, Callback
from host_syncs import Syncs, StopSyncs, HostReads, is_sync_warning

PLANTS = {   # a synchronising call on a CUDA tensor, and what CUDA would report it as
    'item': lambda l: l.loss.item(), 'float': lambda l: float(l.loss), 'bool': lambda l: bool(l.loss > 0),
    'cpu': lambda l: l.loss.cpu(), 'tolist': lambda l: l.pred.tolist(), 'numpy': lambda l: l.pred.detach().numpy(),
    'nonzero': lambda l: l.yb[0].nonzero(), 'mask': lambda l: l.pred[l.pred > 0],
    'blocking_copy': lambda l: l.loss.detach().to('meta'),   # a copy between devices, not non_blocking
}

class Plant(Callback):
    "Makes the planted call in `after_loss` of every training step"
    def __init__(self, call): self.call = call
    def after_loss(self):
        if self.learn.training: self.call(self.learn)

def _fit(cbs=()):
    torch.manual_seed(0)
    x = torch.randn(64, 4); y = (x.sum(1) > 0).long()
    learn = Learner(DataLoaders(DataLoader(TensorDataset(x, y), batch_size=8)),
                    nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), nn.CrossEntropyLoss(),
                    opt_func=torch.optim.SGD, lr=0.1, cbs=[stop := StopSyncs(), *cbs])
    learn.progress.enabled, learn.logger = False, lambda *a: None
    stop.syncs = syncs = Syncs(learn, cuda=False)
    learn.fit(1)
    return syncs.steps

def test_no_sync_without_a_plant():
    steps = _fit()
    assert len(steps) == 6 and all(s == [] for s in steps), steps

@pytest.mark.parametrize('name', list(PLANTS))
def test_planted_sync_is_caught(name):
    steps = _fit([Plant(PLANTS[name])])
    assert len(steps) == 6 and all(len(s) >= 1 for s in steps), f'{name}: {steps}'
    assert all('test_host_syncs.py' in s[0] for s in steps), steps[0]   # the planted line is named

def test_non_blocking_copy_is_not_a_sync():
    with HostReads() as h: torch.ones(3).to('meta', non_blocking=True)
    with HostReads() as h2: torch.ones(3).to('meta')
    assert h.seen == [] and len(h2.seen) == 1, (h.seen, h2.seen)

def _warned(*msgs):
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter('always')
        for m in msgs: warnings.warn(m, UserWarning)
    return [w for w in ws if is_sync_warning(w)]

def test_sync_warning_filter():
    "torch's one-time notice is not a sync; each TORCH_WARN of warn_or_error_on_sync is (with its C++ suffix)"
    notice = ('Synchronization debug mode is a prototype feature and does not yet detect all synchronizing '
              'operations (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:158.)')
    sync = 'called a synchronizing CUDA operation (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:179.)'
    assert len(_warned(notice)) == 0 and len(_warned(notice, sync, sync)) == 2
