"""Preemption on Slurm: a small training with `Checkpoint(signals=('SIGUSR1',), auto_requeue=True)`, started as
`srun python slurm_requeue.py <dir>` in a batch job (`--requeue --open-mode=append`) by tests/test_clusters.py.
First run: steps of 20 ms; every rank prints READY at optimizer step 33 (epoch 1) and waits there for SIGUSR1 (what
`#SBATCH --signal=USR1@60` sends; the test sends it with `scancel --signal=USR1`); the ranks stop at the same step
with a checkpoint, rank 0 requeues the job and the tasks exit. The requeued run (`restart_count` 1) resumes from
the checkpoint, finishes, then trains the same fit again uninterrupted in the same process and prints the largest
difference of the weights and whether the recorded values are equal: 'FINAL ...'."""
import signal, sys, time
from pathlib import Path
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from distrib import Learner, DataLoaders, Callback, Checkpoint, current_world, set_seed

tmp, world = Path(sys.argv[1]), current_world()
torch.set_num_threads(1)

class WaitForSignal(Callback):
    """First run: steps of 20 ms, so that the ranks agree on a signal at least every 25 steps (`StopSignals` waits
    at most 0.5 s) and stop in the middle of the epoch; at optimizer step `at`: READY, then wait (at most 60 s)
    until this rank got SIGUSR1"""
    def __init__(self, at): self.at, self.n = at, 0
    def after_batch(self):
        if not self.learn.training or world.restart_count: return
        self.n += 1
        time.sleep(0.02)
        if self.n != self.at: return
        print(f"READY rank {world.rank} step {self.n}", flush=True)
        stop, end = self.learn.checkpoint.stop_signals, time.monotonic() + 60
        while not stop.received and time.monotonic() < end: time.sleep(0.02)

def learner(cbs=()):
    set_seed(0)
    x = torch.randn(128, 8); y = (x @ torch.randn(8, 3)).argmax(1)
    dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=2, shuffle=True),
                      DataLoader(TensorDataset(x[:32], y[:32]), batch_size=16))
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 3))
    learn = Learner(dls, model, F.cross_entropy, lr=1e-2, cbs=list(cbs), path=tmp)
    learn.progress.enabled = False
    return learn

if world.restart_count: print(f"RESTARTED rank {world.rank} restart_count {world.restart_count}", flush=True)
ck = Checkpoint('ck', signals=('SIGUSR1',), auto_requeue=True)
learn = learner([WaitForSignal(33)])     # 32 steps per epoch on 2 ranks: the stop is at step 34 to 58
with learn.distrib_ctx(): learn.fit(3, cbs=ck)
ref = learner()                           # the same fit, uninterrupted
with ref.distrib_ctx(): ref.fit(3)
d = max((p - q).abs().max().item() for p, q in zip(learn.model.parameters(), ref.model.parameters()))
if world.rank == 0:
    print(f"FINAL max_diff={d} values_equal={learn.recorder.values == ref.recorder.values} resumed_from="
          f"{ck.resumed_from.name if ck.resumed_from else None}", flush=True)
