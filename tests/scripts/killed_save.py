"""A save killed in the middle of its write: `python killed_save.py MODE DIR`, run by `tests/test_files.py` with a file
size limit (RLIMIT_FSIZE) below the size of what it writes, so the kernel kills it with SIGXFSZ inside the write.
MODE `save`: `save_file` of a 1 MB tensor to DIR/m.pth. MODE `fit`: `learn.fit(2)` with `Checkpoint('ck')` in DIR,
resuming from the checkpoint of epoch 0 and killed while writing epoch 1's (`make_learner`'s learner)."""
import signal, sys
from pathlib import Path
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from fastcore.basics import noop
from distrib import Learner, DataLoaders, Checkpoint, set_seed, save_file

def make_learner(path):
    set_seed(0)
    x = torch.randn(48, 6); y = (x @ torch.randn(6, 3)).argmax(1)
    learn = Learner(DataLoaders(DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True),
                                DataLoader(TensorDataset(x[:16], y[:16]), batch_size=8)),
                    nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 3)), F.cross_entropy,
                    path=path)
    learn.progress.enabled, learn.logger = False, noop
    return learn

if __name__ == '__main__':
    mode, tmp = sys.argv[1], Path(sys.argv[2])
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)   # Python ignores it: a write past the limit would only fail
    torch.set_num_threads(1)
    if mode == 'save': save_file({'v': torch.zeros(250_000)}, tmp/'m.pth')
    if mode == 'fit': make_learner(tmp).fit(2, cbs=Checkpoint('ck'))
    print(f"{mode}: not killed", flush=True)
