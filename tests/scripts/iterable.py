"""Iterable data under distrib_ctx, and DataLoaders that cannot be sharded by index. The same script runs on 2
processes (python -m distrib.launch) and in one (python iterable.py); each check prints `CHECK <name> OK`."""
import math
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset, WeightedRandomSampler
from distrib import Learner, DataLoaders, Callback, iter_shard, num_distrib, unwrap_model

N, B = 41, 4  # 2 ranks: shards of 21 and 20 items, 6 and 5 batches of 4
g = torch.Generator().manual_seed(0)
X = torch.randn(N, 3, generator=g); Y = X @ torch.tensor([[1.], [-2.], [.5]])

class Stream(IterableDataset):
    "The (x, y) pairs of this rank's shard, in stream order"
    def __iter__(self): return iter_shard(zip(X, Y))

class Steps(Callback):
    def before_fit(self): self.n = 0
    def after_step(self): self.n += 1

def learner(dls, **kw):
    torch.manual_seed(0)
    learn = Learner(dls, nn.Linear(3, 1), nn.functional.mse_loss, opt_func=torch.optim.SGD, lr=0.05, cbs=Steps(), **kw)
    learn.progress.enabled = False
    return learn

W = num_distrib()
learn = learner(DataLoaders(DataLoader(Stream(), batch_size=B), DataLoader(Stream(), batch_size=5)))
with learn.distrib_ctx(timeout=60): learn.fit(2)
m = min(math.ceil(len(range(r, N, W)) / B) for r in range(W))  # batches of the shortest shard
assert learn.steps.n == 2 * m, (learn.steps.n, m)
print("CHECK iterable_equal_steps OK", flush=True)

# one process, batch W*B, over the items the W ranks trained on: the same weights
ref = learner(DataLoaders(DataLoader(TensorDataset(X[:W*B*m], Y[:W*B*m]), batch_size=W*B)), independent=True)
ref.fit(2)
model = unwrap_model(learn.model)
assert torch.allclose(model.weight, ref.model.weight, atol=1e-6), (model.weight, ref.model.weight)
print("CHECK iterable_like_one_process OK", flush=True)

with torch.no_grad(): full = nn.functional.mse_loss(model(X), Y).item()  # every item once, every rank's shard
assert abs(learn.recorder.values[-1][1] - full) < 1e-6 * max(1., full), (learn.recorder.values[-1], full)
with learn.distrib_ctx(timeout=60): preds, targs = learn.get_preds()
assert torch.equal(targs, Y) and torch.allclose(preds, model(X).detach(), atol=1e-6), (preds.shape, targs.shape)
print("CHECK iterable_valid_exact OK", flush=True)

for dl, words in [(DataLoader(TensorDataset(X, Y), batch_size=None), 'batch_size=None'),
                  (DataLoader(TensorDataset(X, Y), batch_size=4, sampler=WeightedRandomSampler([1.]*N, N)),
                   'sampler=WeightedRandomSampler')]:
    learn = learner(DataLoaders(dl))
    try:
        with learn.distrib_ctx(timeout=60): learn.fit(1)
        assert W == 1, 'should have raised'  # one process: distrib_ctx does nothing, the loader trains as it is
    except ValueError as e:
        msg = str(e)
        assert f'dls[0] (the training DataLoader) was built with {words}' in msg and '_Infinite' not in msg, msg
        assert type(learn.model) is nn.Linear and learn.dls.train is dl  # the Learner is as it was
print("CHECK unshardable_loaders_named OK", flush=True)
