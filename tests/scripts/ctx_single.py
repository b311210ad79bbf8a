"One process, no distributed environment: distrib_ctx does nothing and fit runs as usual"
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from distrib import Learner, DataLoaders, pg_initialized

x = torch.randn(40, 3); y = x.sum(1, keepdim=True)
dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=8), DataLoader(TensorDataset(x, y), batch_size=8))
model = nn.Linear(3, 1)
learn = Learner(dls, model, nn.functional.mse_loss, opt_func=torch.optim.SGD, lr=0.1)
cbs = list(learn.cbs)
with learn.distrib_ctx():
    assert learn.model is model and learn.dls is dls and not pg_initialized()
    learn.fit(2)
assert learn.model is model and learn.dls is dls and learn.cbs == cbs
assert learn.recorder.values[-1][1] < learn.recorder.values[0][1]
print('OK')
