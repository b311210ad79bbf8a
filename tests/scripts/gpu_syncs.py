"""Host syncs in a training step (issue 39): a step of `Learner` + DDP with `nn.CrossEntropyLoss()` waits for the
device nowhere, when the ranks' counts are known equal (no collective) and when the count is all-reduced (on the
GPU, over NCCL) or travels with the gradients (DDP's count-carrying hook, under `distrib_ctx`), with `GradientAccumulation('forced_sync')` too; with float16's `GradScaler`, its one read of
`found_inf` per optimizer step and nothing else.
Run: python -m distrib.launch --nproc_per_node N tests/scripts/gpu_syncs.py MODE   (DISTRIB_TEST_DEVICE=cuda or cpu)
- MODE two (N=2; one GPU each on CUDA): `distrib_ctx` under the default backend 'cpu:gloo,cuda:nccl'.
- MODE one (N=1; one GPU): a group of one rank under 'cpu:gloo,cuda:nccl', DDP over it, and a `DistributedDL` that
  says 2 ranks, so that `ItemMean` runs its all-reduce (over one rank: the figures are not a real run's, the
  syncs are).
Counted from the start of `before_batch` to the end of `after_batch` of every training step but the first two
(DDP's first steps build its buckets): on CUDA, what `torch.cuda.set_sync_debug_mode('warn')` reports; on CPU,
the same logic's operations that would wait for a GPU (tests/host_syncs.py's `HostReads`: reading a value back,
sizing a result by values, a copy to the host or across devices): CUDA's answer substituted.
Rank 0 prints 'CHECK <name> OK <figures>' per check; a failure raises."""
import os, sys
from pathlib import Path
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset
from distrib import (Learner, DataLoaders, Callback, DistributedDL, GradientAccumulation, MixedPrecision,
                     setup_distrib, teardown_distrib)
import distrib.losses as L
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/: the counter's module
from host_syncs import Syncs, StopSyncs  # noqa: E402
from _common import check, check_all  # noqa: E402

MODE, DEVICE = sys.argv[1], os.environ.get('DISTRIB_TEST_DEVICE', 'cuda')
CUDA = DEVICE == 'cuda'
torch.set_num_threads(1)
if MODE == 'one':   # a real group of one rank (setup_distrib leaves a world of one without a group)
    dist.init_process_group('cpu:gloo,cuda:nccl' if CUDA else 'gloo', timeout=__import__('datetime').timedelta(seconds=120))
    W, rank = 2, 0  # what the DistributedDL says
else:
    setup_distrib(device=int(os.environ['LOCAL_RANK']) if CUDA else 'cpu', timeout=120)
    W, rank = dist.get_world_size(), dist.get_rank()
dev = torch.device('cuda', torch.cuda.current_device() if MODE == 'one' else int(os.environ['LOCAL_RANK'])) \
      if CUDA else torch.device('cpu')
if CUDA: torch.cuda.set_device(dev)

if MODE == 'two': check = check_all   # else a group of one: nothing to gather

class Where(Callback):
    """The device each all-reduce of the step's count ran on (`start_sum`'s buffer), and the steps whose count
    travelled with the gradients instead (`carried`: DDP's count-carrying hook, `distrib.strategies.ddp.sum_over_items`)"""
    def before_fit(self):
        self.devices, self.carried, self._orig = [], 0, L.start_sum
        def start(n):
            work, buf = self._orig(n)
            self.devices.append(buf.device.type)
            return work, buf
        L.start_sum = start
        self.learn.on_fit_exit(self._restore)
    def _restore(self): L.start_sum = self._orig
    def before_backward(self):   # order 0: before ItemMean's, which reads and clears what it decided in before_batch
        early = getattr(self.learn.item_mean, '_early', None)
        if early is not None and isinstance(early[-1], str): self.carried += 1

torch.manual_seed(0)
N, BS, D = 256, 16, 8
x = torch.randn(N, D)
y = (x @ torch.randn(D, 4)).argmax(1)
y_ign = y.clone(); y_ign[::3] = -100   # ignored targets: the ranks' counts differ, the count is all-reduced

def learner(targets, cbs=(), bs=BS):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 32), nn.ReLU(), nn.Linear(32, 4)).to(dev)
    cbs = [stop := StopSyncs(), where := Where(), *cbs]
    if MODE == 'one':
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[dev] if CUDA else None)
        dl = DistributedDL(TensorDataset(x, targets), batch_size=bs, shuffle=True, rank=0, world_size=W)
        learn = Learner(DataLoaders(dl), ddp, nn.CrossEntropyLoss(), opt_func=torch.optim.SGD, lr=0.1, cbs=cbs)
    else:
        learn = Learner(DataLoaders(torch.utils.data.DataLoader(TensorDataset(x, targets), batch_size=bs,
                                                                  shuffle=True)),
                        model, nn.CrossEntropyLoss(), opt_func=torch.optim.SGD, lr=0.1, cbs=cbs)
    learn.progress.enabled, learn.logger = False, lambda *a: None
    stop.syncs = syncs = Syncs(learn, CUDA)
    return learn, syncs, where

def fit(learn):
    if MODE == 'one': learn.fit(2)
    else:
        with learn.distrib_ctx(device=dev): learn.fit(2)

def figures(syncs, where):
    n = sum(map(len, syncs.steps))
    first = next((s for s in syncs.steps if s), [])
    return n, f"{n} host syncs in {len(syncs.steps)} steps{': ' + repr(first[:2]) if first else ''}; " \
              f"count all-reduced on {sorted(set(where.devices)) or 'none'} {len(where.devices)}x, " \
              f"carried with the gradients {where.carried}x"

cases = [('syncs_known_equal', y, [], True), ('syncs_count_summed', y_ign, [], False),
         ('syncs_forced_sync', y_ign, [GradientAccumulation(2*W*BS//2, 'forced_sync')], False)]
for name, targets, cbs, known in cases:
    bs = BS//2 if cbs else BS
    learn, syncs, where = learner(targets, cbs, bs)
    fit(learn)
    n, figs = figures(syncs, where)
    on = {'cuda' if CUDA else 'cpu'}
    counted = (set(where.devices) == on and not where.carried) or (not where.devices and where.carried > 0)
    ok = (n == 0 and len(syncs.steps) > 0 and (learn.item_mean._known is not None) == known
          and (not where.devices and not where.carried if known else counted))
    check(name, ok, figs)

if CUDA:   # float16 with GradScaler: its found_inf read once per optimizer step, nothing else
    learn, syncs, where = learner(y_ign, [MixedPrecision('fp16')])
    fit(learn)
    per_step = [len(s) for s in syncs.steps]
    check('syncs_fp16_grad_scaler_only', per_step and all(k == 1 for k in per_step),
          f'{per_step[:8]} {syncs.steps[0] if syncs.steps else ""}')

if MODE == 'one': dist.destroy_process_group()
else: teardown_distrib()
