"""A full disk under `learn.save` and `Checkpoint`, on 2 gloo processes: `python -m distrib.launch disk_full.py DIR`,
DIR a small file system of its own (a 2 MB tmpfs, which `tests/test_files.py` mounts in a private mount namespace).
Rank 0 fills the disk with a file `filler` until a save no longer fits, then removes it. Prints `CHECK <name> OK`:
- save_disk_full: `learn.save` raises on rank 0 an OSError (errno ENOSPC) naming the file and 'No space left on
  device', on rank 1 a RuntimeError naming rank 0's; the previous file is unchanged, no temporary file is left;
- checkpoint_disk_full: a checkpoint that does not fit fails the same way on every rank, in `fit`; the previous
  checkpoint is kept, complete, and no temporary file is left;
- checkpoint_after_disk_full: with space again, the next fit resumes from that checkpoint and finishes.
"""
import errno, os, sys
from pathlib import Path
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from fastcore.basics import noop
from distrib import (Learner, DataLoaders, Checkpoint, set_seed, current_world, gather_object, distrib_barrier,
                     setup_distrib, load_file, checkpoints)

tmp = Path(sys.argv[1])
torch.set_num_threads(1)
setup_distrib(timeout=60)
rank = current_world().rank

def check(name, ok, detail=''):
    oks = gather_object(bool(ok))
    assert all(oks), f"CHECK {name} failed on ranks {[r for r, o in enumerate(oks) if not o]}: {detail}"
    if rank == 0: print(f"CHECK {name} OK", flush=True)

def fill(leave:int):
    "Rank 0 fills the file system of `tmp` but `leave` bytes"
    if rank == 0:
        st = os.statvfs(tmp)
        with open(tmp/'filler', 'wb') as f: f.write(b'\0' * max(0, st.f_bavail*st.f_frsize - leave))
    distrib_barrier()

def unfill():
    if rank == 0: (tmp/'filler').unlink()
    distrib_barrier()

def outcome(f):
    "What `f()` raised: (type name, errno, message), or None"
    try: f()
    except Exception as e: return type(e).__name__, getattr(e, 'errno', None), str(e)
    return None

def temps(folder): return [p.name for p in Path(folder).iterdir() if '.tmp.' in p.name]

set_seed(0)
x = torch.randn(64, 64); y = (x @ torch.randn(64, 4)).argmax(1)
learn = Learner(DataLoaders(DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True),
                            DataLoader(TensorDataset(x[:16], y[:16]), batch_size=8)),
                nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4)), F.cross_entropy, path=tmp)
learn.progress.enabled, learn.logger = False, noop
with learn.distrib_ctx():
    learn.fit(1)
    f = learn.save('model', with_opt=False)            # about 70 KB
    before = f.read_bytes()
    fill(leave=40_000)
    got = outcome(lambda: learn.save('model'))         # with the optimizer: about 200 KB
    unfill()
    if rank == 0: ok = got[:2] == ('OSError', errno.ENOSPC) and 'No space left on device' in got[2] and str(f) in got[2]
    else: ok = got[0] == 'PeerFailedError' and 'Rank 0 could not save' in got[2] and 'No space left on device' in got[2]
    check('save_disk_full', ok and f.read_bytes() == before and not temps(f.parent), got)

    learn.fit(1, cbs=Checkpoint('ck'))                 # one checkpoint, at the end of epoch 0
    (step, first), = checkpoints(tmp/'ck')
    fill(leave=40_000)
    got = outcome(lambda: learn.fit(2, cbs=Checkpoint('ck')))   # resumes, trains epoch 1, cannot write its checkpoint
    unfill()
    missing = str(tmp/'ck'/f'step-{2*step}.pth')
    if rank == 0:
        ok = got[:2] == ('OSError', errno.ENOSPC) and 'No space left on device' in got[2] and missing in got[2]
    else: ok = got[0] == 'PeerFailedError' and 'Rank 0 could not write the checkpoint' in got[2] and missing in got[2]
    kept = [p for _, p in checkpoints(tmp/'ck')] == [first] and load_file(first)['epoch'] == 1
    check('checkpoint_disk_full', ok and kept and not temps(tmp/'ck'), (got, os.listdir(tmp/'ck')))

    ck = Checkpoint('ck')
    learn.fit(2, cbs=ck)
    check('checkpoint_after_disk_full', ck.resumed_from == first and len(learn.recorder.values) == 2
          and [p.name for _, p in checkpoints(tmp/'ck')] == [first.name, f'step-{2*step}.pth'], os.listdir(tmp/'ck'))
