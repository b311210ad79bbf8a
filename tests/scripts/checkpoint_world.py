"""Resume in 1 process the checkpoints 2 processes wrote (`checkpoint_job.py restart` leaves them in DIR/ws):
`python checkpoint_world.py DIR`, no launcher. From the end of epoch 2, with the same global batch (8 = 2 x 4 before,
1 x 8 now), the run ends where the 2-process run ended, to float rounding; rank 0 prints `MAXDIFF world ...`. From the
middle of an epoch, every rank raises a ValueError that says why. Prints `CHECK <name> OK` lines."""
import shutil, sys
from pathlib import Path
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from fastcore.basics import noop
from distrib import Learner, DataLoaders, Checkpoint, set_seed, checkpoints

tmp = Path(sys.argv[1])
torch.set_num_threads(1)

def make_learner(bs):
    "The learner of checkpoint_job.py without dropout nor mixed precision, in one process"
    set_seed(0)
    x = torch.randn(64 + 24, 6); y = (x @ torch.randn(6, 3)).argmax(1)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.), nn.Linear(16, 3))
    dls = DataLoaders(DataLoader(TensorDataset(x[:64], y[:64]), batch_size=bs, shuffle=True),
                      DataLoader(TensorDataset(x[64:], y[64:]), batch_size=8))
    learn = Learner(dls, model, F.cross_entropy, lr=1e-2, path=tmp)
    learn.progress.enabled, learn.logger = False, noop
    return learn

def copy_to(folder, f):
    (tmp/folder).mkdir()
    shutil.copy(f, tmp/folder/f.name)

found = {(torch.load(f)['epoch'], torch.load(f)['batch']): f for _, f in checkpoints(tmp/'ws')}
copy_to('ws_epoch', found[(2, 0)])
learn = make_learner(bs=8)
ck = Checkpoint('ws_epoch')
learn.fit(4, cbs=ck)
assert ck.resumed_from.name == found[(2, 0)].name
final = torch.load(tmp/'ws_final.pth')
d = max((p - final['model'][k]).abs().max().item() for k, p in learn.model.state_dict().items())
dv = max(abs(u - v) for ru, rv in zip(learn.recorder.values, final['values']) for u, v in zip(ru, rv))
print(f"MAXDIFF world weights {d:.3g} values {dv:.3g}", flush=True)
assert len(learn.recorder.values) == 4 and d <= 1e-5 and dv <= 1e-5, (d, dv)
print("CHECK world_epoch OK", flush=True)

mid = next(f for (e, b), f in sorted(found.items()) if b)
copy_to('ws_mid', mid)
try:
    make_learner(bs=8).fit(4, cbs=Checkpoint('ws_mid'))
    raise AssertionError("a mid-epoch checkpoint of 2 processes resumed in 1")
except ValueError as e:
    assert 'in the middle of an epoch, which only the same number of processes can resume' in str(e), e
    assert 'resume with 2 processes' in str(e) and mid.name in str(e), e
print("CHECK world_mid_epoch OK", flush=True)
