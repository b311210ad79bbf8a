"""A fault in the middle of an epoch: `python -m distrib.launch fault.py MODE [TIMEOUT]`.

MODE, on rank 1 at training batch 3 unless said: `raise` (ValueError), `sigkill` (SIGKILL itself), `hang` (sleep
past the collective timeout: rank 0 waits in the gradient all-reduce), `barrier` (sleep before a barrier that rank
0 already waits in), `freeze` (SIGSTOP itself), `sigint` (SIGINT itself), `cancel_fit`, `cancel_epoch`,
`cancel_batch` (raise it on rank 1 only), `save0` (rank 0 calls `learn.save` alone, the `if rank == 0:` habit),
`exit0` (rank 1 exits with code 0 before set-up), `ignore_term` (rank 0 raises while rank 1, which ignores
SIGTERM, sleeps), `freeze_peer` (rank 0 raises while rank 1 is frozen), `reset0` (rank 0's own
ConnectionResetError in `rank0_first`'s function), `pipe0` (rank 0's own BrokenPipeError: a write to a closed pipe),
`caught_gather` (the model's branch runs on rank 0's data only at batch 3, so DDP raises on rank 1; the script
catches the error outside `distrib_ctx` and goes on to `gather_object` while rank 0 waits in the gradient
all-reduce), `caught_sleep` (the same, then rank 1 sleeps: it left the context by an exception), `stall_report`
(long but healthy phases: a 4 s `rank0_first` on rank 0, a 4 s first step on rank 1, a 4 s declared long phase on
rank 0 before a barrier after `fit`; and one stall: rank 1 sleeps 5 s in a callback at batch 3, then goes on; the job
ends well), `stall_end` (rank 1 sleeps 600 s in a callback: `DISTRIB_STALL_TIMEOUT` ends the job), `stall_worker`
(rank 1's DataLoader worker sleeps 5 s reading one item of epoch 0, then goes on: the job ends well),
`phase_report` (rank 0 sleeps 7 s in `rank0_first`'s function, a declared long phase; with `DISTRIB_STALL_REPORT=0.3`
it is reported at 3 s and 6 s; the job ends well after it), `phase_timeout` (rank 0 sleeps 600 s in `long_phase(...,
timeout=3)` inside `rank0_first`'s function: the phase ends the job),
`barrier_bcast` (rank 0 calls `distrib_barrier` while rank 1 calls `broadcast_object`), `skew` (rank 1
alone calls `all_reduce_mean` at `after_epoch`, of the Recorder's size: the ranks' collectives pair wrongly from then
on), `skew_abort` (the same, of another size: gloo aborts a process).
The rank at fault prints `FAULT_AT <time.time()>` just before the fault. Files go to `$FAULT_DIR` (default: a new
temporary directory).
"""
import os, sys, time, signal, tempfile
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from distrib import (Learner, DataLoaders, Callback, rank_distrib, distrib_barrier, setup_distrib, teardown_distrib,
                     rank0_first, gather_object, broadcast_object, long_phase, all_reduce_mean, CancelFitException,
                     CancelEpochException, CancelBatchException)

mode, timeout = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 60.
rank = int(os.environ['RANK'])
SKEW = 1000 if mode == 'skew_abort' else 3  # the size of the skewed all_reduce_mean (3: as the Recorder's)

def mark(): print(f"FAULT_AT {time.time()}", flush=True)

if mode == 'exit0' and rank == 1: mark(); sys.exit(0)  # before any set-up: the others wait for it in the rendezvous

def fault():
    if mode == 'freeze': time.sleep(1.5)  # its heartbeat says where it is first
    mark()
    if mode == 'raise': raise ValueError('bad batch on purpose')
    if mode == 'sigkill': os.kill(os.getpid(), signal.SIGKILL)
    if mode == 'freeze': os.kill(os.getpid(), signal.SIGSTOP)
    if mode == 'sigint': os.kill(os.getpid(), signal.SIGINT); time.sleep(5)
    if mode == 'stall_report': time.sleep(5); return  # STALL_LINE: the line a stall report shows
    if mode.startswith('cancel_'):
        raise {'fit': CancelFitException, 'epoch': CancelEpochException, 'batch': CancelBatchException}[mode[7:]]()
    time.sleep(600)  # 'hang', 'barrier': stuck far past the timeout

class Fault(Callback):
    def before_batch(self):
        first = self.learn.training and self.learn.iter == 0 and self.learn.epoch == 0
        if mode == 'stall_report' and rank == 1 and first: time.sleep(4)  # a slow first step (a compile): no stall
        if not self.learn.training or self.learn.iter != 3 or self.learn.epoch != 0: return
        if mode in ('ignore_term', 'freeze_peer'):
            if rank == 1:
                if mode == 'ignore_term': signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)
                os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(1)  # rank 1 sleeps (or is frozen) by now
            mark(); raise ValueError('bad batch on purpose')
        if mode.startswith('caught_'):  # rank 1's data does not reach the model's branch (Branchy.skip)
            if rank == 1: mark(); Branchy.skip = True
            return
        if rank == 1 and mode not in ('save0', 'pipe0', 'skew', 'skew_abort', 'stall_worker'): fault()
    def after_epoch(self):
        if mode.startswith('skew') and rank == 1 and self.learn.epoch == 0: mark(); all_reduce_mean(torch.ones(SKEW))
    def after_batch(self):
        if rank != 0 or not self.learn.training or self.learn.iter != 3 or self.learn.epoch != 0: return
        if mode == 'save0': mark(); self.learn.save('rank0_only')
        if mode == 'pipe0':
            r, w = os.pipe(); os.close(r)
            mark(); os.write(w, b'progress\n')  # EPIPE: the reader of the output is gone

def download():
    if rank == 0 and mode == 'reset0': mark(); raise ConnectionResetError(104, 'Connection reset by peer')
    if mode == 'stall_report' and rank == 0: time.sleep(4)  # a long download while rank 1 waits: no stall
    if mode == 'phase_report' and rank == 0: mark(); time.sleep(7)  # PHASE_LINE
    if mode == 'phase_timeout' and rank == 0:
        with long_phase('fetching the data set', timeout=3): mark(); time.sleep(600)  # PHASE_STUCK
    return 'data'

class Branchy(nn.Module):
    "A linear model with a branch that a batch may skip (`skip`): DDP then never reduces the branch's gradients"
    skip = False
    def __init__(self):
        super().__init__()
        self.lin, self.branch = nn.Linear(3, 1), nn.Linear(3, 1)
    def forward(self, x): return self.lin(x) if Branchy.skip else self.lin(x) + self.branch(x)

class SlowItem(TensorDataset):
    "On rank 1, the DataLoader worker reading the 17th item of the first epoch sleeps 5 s (once: a file marks it)"
    done = os.path.join(os.environ.get('FAULT_DIR') or tempfile.mkdtemp(), 'slept')
    seen = 0
    def __getitem__(self, i):
        SlowItem.seen += 1  # in the worker process: a new one each epoch
        if rank == 1 and SlowItem.seen == 17 and not os.path.exists(self.done):
            open(self.done, 'w').close(); mark(); time.sleep(5)  # WORKER_LINE
        return super().__getitem__(i)

x = torch.randn(800, 3, generator=torch.Generator().manual_seed(0)); y = x.sum(1, keepdim=True)
train = (DataLoader(SlowItem(x, y), batch_size=4, num_workers=1) if mode == 'stall_worker' else
         DataLoader(TensorDataset(x, y), batch_size=4))
dls = DataLoaders(train, DataLoader(TensorDataset(x, y), batch_size=8))
model = Branchy() if mode.startswith('caught_') else nn.Linear(3, 1)
learn = Learner(dls, model, nn.functional.mse_loss, path=os.environ.get('FAULT_DIR') or tempfile.mkdtemp())
learn.progress.enabled = False
# a short timeout also bounds the rendezvous: on a loaded machine one rank may start seconds after the other, so
# first meet in a group with a long timeout (its teardown is a barrier), then create the short-timeout group together
setup_distrib(timeout=120); teardown_distrib()
if mode == 'phase_report': setup_distrib(timeout=2)  # rank 1 looks at rank 0 every 2 s while it waits for it
if mode in ('reset0', 'stall_report', 'phase_report', 'phase_timeout'): rank0_first(download)
if mode == 'phase_report': print(f"rank {rank} finished: the fault did not happen", flush=True); sys.exit(0)
try:
    with learn.distrib_ctx(timeout=timeout):
        if mode == 'barrier':
            if rank == 1: fault()
            distrib_barrier()
        if mode == 'barrier_bcast':
            if rank == 1: mark(); broadcast_object('a broadcast that rank 0 never joins')
            else: distrib_barrier()
        learn.fit(2, cbs=Fault())
        if mode == 'stall_report':
            if rank == 0:
                with long_phase('writing a large state'): time.sleep(4)  # as Learner.save writes
            distrib_barrier()
except RuntimeError as e:  # a sweep, a retry loop, a batch-size finder: it goes on
    if not mode.startswith('caught_'): raise
    print(f"rank {rank} caught {type(e).__name__}: {str(e)[:60]}", flush=True)
    if mode == 'caught_gather': gather_object(rank)
    else: time.sleep(600)
print(f"rank {rank} finished: the fault did not happen", flush=True)
