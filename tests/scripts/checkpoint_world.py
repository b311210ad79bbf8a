"""Resume in 1 process the checkpoints 2 processes wrote (`checkpoint_job.py restart` leaves them in DIR/ws):
`python checkpoint_world.py DIR`, no launcher. From the end of epoch 2, with the same global batch (8 = 2 x 4 before,
1 x 8 now), the run ends where the 2-process run ended, to float rounding; it prints `MAXDIFF world ...`. From the
middle of an epoch the same (`MAXDIFF world_mid`); with another global batch (1 x 4), a ValueError that says why,
before anything is loaded. Prints `CHECK <name> OK` lines."""
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
try:   # 1 process x 4: another global batch, refused before anything is loaded
    bad = make_learner(bs=4)
    w0 = [p.clone() for p in bad.model.parameters()]
    bad.fit(4, cbs=Checkpoint('ws_mid'))
    raise AssertionError("a checkpoint of global batch 8 resumed with a global batch of 4")
except ValueError as e:
    assert "with a global batch of 8 (2 processes x 4), and this run's is 4 (1 process x 4)" in str(e), e
    assert 'divides 8 (1, 2, 4, 8)' in str(e) and mid.name in str(e), e
    assert all(torch.equal(p, q) for p, q in zip(bad.model.parameters(), w0))
print("CHECK world_batch_refused OK", flush=True)
learn, lines = make_learner(bs=8), []
learn.logger = lines.append
ck = Checkpoint('ws_mid')
learn.fit(4, cbs=ck)
e, b = torch.load(mid)['epoch'], torch.load(mid)['batch']
assert ck.resumed_from.name == mid.name and lines[0].endswith(
    f"(epoch {e}, batch {b} of 8, written by 2 processes), now on 1 process, global batch 8 kept"), lines[:1]
d = max((p - final['model'][k]).abs().max().item() for k, p in learn.model.state_dict().items())
dv = max(abs(u - v) for ru, rv in zip(learn.recorder.values, final['values']) for u, v in zip(ru, rv))
print(f"MAXDIFF world_mid weights {d:.3g} values {dv:.3g}", flush=True)
assert len(learn.recorder.values) == 4 and d <= 1e-5 and dv <= 1e-5, (d, dv)
print("CHECK world_mid_epoch OK", flush=True)
