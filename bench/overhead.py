"""How much distrib's loop costs against hand-written ones: CPU, gloo, 1 thread per process (or a GPU).

    python bench/overhead.py            # from the repository root: a table, then one JSON line (about 2 minutes)
    python bench/overhead.py --reps 15 --sections ddp,single   # a subset, more repetitions
    python bench/overhead.py --device cuda   # on a GPU: ddp2 (two processes sharing GPU 0 over gloo, or one GPU
                                             # each over NCCL when there are two), single

On a shared machine the speed drifts by 10-30 % over seconds, far more than the few percent to be measured; so A
and B are measured side by side. ddp, single: the two loops run in lockstep in the same process(es), taking turns
every `--every` batches (default 1; `Turns`), each timing only its own turns; a repetition is one such pair of
fits, A going first in every other one. dispatch, data: whole runs alternate (a b, then b a, ...). For each side
the table gives the median over repetitions; "B/A" is the median over repetitions of B's figure over A's in the
same repetition (for dispatch, B's minus A's), the ratio the targets apply to: both sides of a pair saw the same
machine. "med/med" is the ratio of the two medians, which mixes repetitions (reported, not judged).
Every process runs with `torch.set_num_threads(1)` (and OMP_NUM_THREADS=1).

- ddp: an MLP 784-256-256-10 on synthetic data (8,192 train / 2,048 valid samples, batch 64 per process, 2 epochs,
  Adam lr 1e-3, the same init and the same shuffled order on both sides) on W=2 gloo processes, (a) by a
  hand-written DDP loop with a `DistributedSampler` (`SameOrderSampler`: its list of indices built at each epoch's
  start, in `DistributedDL`'s order, `index_shuffle`'s since issue 40), (b) by `Learner` + `distrib_ctx`. Both
  validate every epoch, computing loss and accuracy over the validation set, all-reduced, and both record the
  epoch's training loss.
  One `python -m distrib.launch` job runs an untimed warm-up pair then `--reps` pairs; a barrier lines the ranks up
  at every switch (untimed), and a side's time is its slowest rank's. Timed: from the first training step to the
  end of the last validation (process start-up and DDP construction are not). steps/s = training steps / time.
  Both sides must end with the same losses and accuracy, in every pair (checked: the comparison is of the same
  work). Each side reads its own copy of the data, so neither finds the other's batch in the cache.
- single: the same in one process: `Learner.fit` vs the plain loop, over `DataLoader`s with the same order.
- dispatch: a fit whose model, loss and optimizer do nothing (identity model, a loss whose backward is a no-op, a
  no-op optimizer) over 20,000 prebuilt batches: the Learner's time per batch minus the plain loop's doing the same
  calls is what its events and default callbacks (Recorder, ProgressCallback) cost per batch, with warm caches.
On the Learner side the progress bar is drawn (to a sink that says it is a terminal), as in an interactive run.
- data: iterating rank 0's shard (W=2, batch 64, shuffle) of the training set, 4 epochs: `DistributedDL` vs
  `DataLoader` + `DistributedSampler`, with num_workers 0 and 2 (persistent workers: worker start-up not timed).
  Each side in its own order (`torch.randperm`'s and `index_shuffle`'s): each must give the batches of its rank-0
  shard, in order (checked).
- ddp_ce: the ddp section with `nn.CrossEntropyLoss()` on the Learner's side (B), the hand-written loop (A) unchanged
  (`F.cross_entropy`, each rank's batch mean, DDP averaging): the comparison peers make, a loop as users write it
  against distrib's exact loss over items (issue 39). On a classifier every rank's count is its batch's rows, known
  equal on every rank without asking (`ItemMean`'s `known_equal`): no collective of the count, as A.
- ddp_items (not in the default sections): the ddp section with a loss over items on both sides (issue 33): A sums
  the loss, all-reduces the count of valid targets and divides by it before the backward (torchtitan's way, the
  all-reduce waited for at once); B is the Learner with `nn.CrossEntropyLoss()`, whose count travels with the
  gradients (DDP's hook `sum_over_items`, issue 47; before it, `ItemMean` started the count's all-reduce in
  `before_batch` and waited for it before the backward: B/A 0.998 to 1.002 in 3 alternated runs, against 1.019 to
  1.026 with the hook). One training target in 8 is -100 on both sides (`make_data(ignore=True)`), so that the ranks'
  counts are not known equal (without it, B's `ItemMean` knows them equal and sums no count: it measured nothing of
  the count's cost). The two sides' results then differ by 2.5e-4 to 4.9e-4 (DIFFER): 256 Adam steps of float
  rounding in a different order (B weighs each rank's batch mean, A scales the summed loss). Against the ddp section's ratio, it measures
  what the one extra all-reduce of one number per step costs distrib (the hand-written loop pays it too).

With `--device cuda` the model, the batches and the all-reduced sums are on the GPU (`cuda:<local rank>`, or
GPU 0 for every rank when there are fewer GPUs than ranks, over gloo then, since NCCL takes one GPU per rank); each
switch of turns synchronizes the GPU, so that neither side is timed for the other's queued kernels; the sections
are ddp2 (W=2) and single (one process: distrib_ctx in a world of one trains without DDP); dispatch and data
measure the CPU and are not run.

The machine should be otherwise idle: check `uptime` (the load is printed in the table's title).
"""
import argparse, contextlib, gc, io, json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset, DistributedSampler
from fastcore.basics import noop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's distrib
from distrib import Callback

N_TRAIN, N_VALID, BS, EPOCHS, LR, W = 8192, 2048, 64, 2, 1e-3, 2
TARGETS = dict(ddp=0.98, ddp_ce=0.98, ddp_items=0.98, single=0.98, data_nw0=1.0, data_nw2=1.0, dispatch_us=20.0)

def make_data(ignore:bool=False):
    """Synthetic 10-class data: x ~ N(0, 1) in R^784, y = argmax of a fixed random projection (learnable); `ignore`:
    one training target in 8 is -100 (ignored by the loss: the ranks' counts of a step differ)"""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_TRAIN + N_VALID, 784, generator=g)
    y = (x @ torch.randn(784, 10, generator=g)).argmax(1)
    if ignore: y[:N_TRAIN][torch.randperm(N_TRAIN, generator=g)[:N_TRAIN//8]] = -100
    return TensorDataset(x[:N_TRAIN], y[:N_TRAIN]), TensorDataset(x[N_TRAIN:], y[N_TRAIN:])

class SameOrderSampler(DistributedSampler):
    "A `DistributedSampler` whose epoch is `DistributedDL(shuffle=True)`'s order: its list built at each `iter`"
    def __iter__(self):
        from distrib import shard_idxs
        return iter(shard_idxs(len(self.dataset), self.rank, self.num_replicas, self.shuffle, self.seed,
                               self.epoch).tolist())

def seeded_loaders(train_ds, valid_ds):
    """A shuffling training loader with its own generator (seeded 0) and a validation loader: two calls give the same
    order, however their iterations interleave (the global RNG is not drawn from)"""
    return (DataLoader(train_ds, batch_size=BS, shuffle=True, generator=torch.Generator().manual_seed(0)),
            DataLoader(valid_ds, batch_size=BS))

def make_model():
    torch.manual_seed(0)  # the same init on both sides
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))

# ---------------------------------------------------------------------------------------------------------------
# The hand-written loops (A)

def raw_fit(model, train_dl, valid_dl, train_sampler=None, every=0, device=None, items=False):
    """A plain training loop, written as a generator: `EPOCHS` epochs of Adam steps, each followed by a validation
    pass computing loss and accuracy; the sums are all-reduced when a process group exists. `model` may be
    DDP-wrapped (validation then runs its `.module`, as the Learner does). It pauses (yields) after every `every`-th
    batch, training and validation alike (never when `every` is 0), so that another loop can take turns with it
    (`Turns`). Its return value (`StopIteration.value`) is `[train_loss, valid_loss, accuracy]` of the last epoch.
    Sums are Python floats from `.item()`: on CPU the cheapest way (no device to wait for), as the Learner does.
    With `device` (a GPU), each batch is moved there first, and the sums are all-reduced there under NCCL. With
    `items`, the loss is a loss over items written by hand as torchtitan writes it (pytorch/torchtitan#2206): the sum
    of the batch's losses, divided by the number of valid targets over all ranks (one all-reduce of one number, before
    the backward), times the world size (DDP averages); the training loss is the mean over the valid targets."""
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    plain = getattr(model, 'module', model)
    ddp = dist.is_initialized()
    on = device if ddp and device is not None and dist.get_backend() == 'nccl' else None  # where the sums go
    n = 0
    for epoch in range(EPOCHS):
        if train_sampler is not None: train_sampler.set_epoch(epoch)
        model.train()
        tl, tn = 0., 0
        for x, y in train_dl:
            if device is not None: x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if items:
                s = F.cross_entropy(model(x), y, ignore_index=-100, reduction='sum')
                cnt = (y != -100).sum()
                total = cnt.to(on, copy=True)
                if ddp: dist.all_reduce(total)
                (s*(dist.get_world_size() if ddp else 1)/total.to(s.device)).backward()
                tl += s.item(); tn += cnt.item()
            else:
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                tl += loss.item()*len(y); tn += len(y)
            opt.step()
            opt.zero_grad(set_to_none=True)
            n += 1
            if n == every: n = 0; yield
        if ddp:
            t = torch.tensor([tl, tn], dtype=torch.float64, device=on); dist.all_reduce(t); tl, tn = t.tolist()
        plain.eval()
        vl, vc, vn = 0., 0., 0
        with torch.no_grad():
            for x, y in valid_dl:
                if device is not None: x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                out = plain(x)
                vl += F.cross_entropy(out, y).item()*len(y)
                vc += (out.argmax(-1) == y).sum().item()
                vn += len(y)
                n += 1
                if n == every: n = 0; yield
        if ddp:
            t = torch.tensor([vl, vc, vn], dtype=torch.float64, device=on); dist.all_reduce(t); vl, vc, vn = t.tolist()
        res = [tl/tn, vl/vn, vc/vn]
    return res

class Turns(Callback):
    """Makes the Learner's fit (B), which carries this callback, and a generator loop (A, e.g. `raw_fit`) take
    turns: after every `every` batches of B, A runs to its next pause. Each side's time is its own turns: `t_a` sums
    A's, `paused` is the time B spent waiting (A's turns and the switches), to subtract from B's wall time. `sync` (a
    barrier under DDP) lines the ranks up at every switch, untimed. Grad mode is per thread, not per loop, so it is
    swapped with the turns: A may pause inside its `torch.no_grad()` validation while B trains, and the other way
    round. After B's fit, `finish()` runs A to its end; its return value is then `result`."""
    order = 10_000  # after every other callback: B's batch is complete
    def __init__(self, loop, every:int, sync=noop):
        self.loop, self.every, self.sync = loop, every, sync
        self.n, self.t_a, self.paused, self.result, self._grad = 0, 0., 0., None, True
    def after_batch(self):
        self.n += 1
        if self.n == self.every: self.n = 0; self.turn()
    def turn(self):
        "Let A run to its next pause, or to its end"
        if self.loop is None: return
        t0 = time.perf_counter()
        grad_b = torch.is_grad_enabled()
        torch.set_grad_enabled(self._grad)
        self.sync()
        t1 = time.perf_counter()
        try: next(self.loop)
        except StopIteration as e: self.result, self.loop = e.value, None
        self.t_a += time.perf_counter() - t1
        self.sync()
        self._grad = torch.is_grad_enabled()
        torch.set_grad_enabled(grad_b)
        self.paused += time.perf_counter() - t0
    def finish(self):
        while self.loop is not None: self.turn()

def lockstep(learn, loop, every:int, lead:bool, sync=noop):
    """`learn.fit(EPOCHS)` (B, its progress bar drawn) and the generator loop `loop` (A) taking turns every `every`
    batches (`Turns`); A goes first when `lead`. Returns `(seconds of A, seconds of B, A's result, B's last
    Recorder values)`."""
    turns = Turns(loop, every, sync)
    sync()
    t0 = time.perf_counter()
    if lead: turns.turn()
    _drawn(lambda: learn.fit(EPOCHS, cbs=turns))
    turns.finish()
    t_b = time.perf_counter() - t0 - turns.paused
    return turns.t_a, t_b, turns.result, learn.recorder.values[-1]

def _pairs(pair, reps:int, steps:int)->dict:
    """One warm-up `pair(lead)`, then `reps` timed ones, A leading every other one: steps/s of each side per pair,
    the last pair's results and the largest difference between the two sides' results over all pairs"""
    pair(False)
    out, diff = {'a': [], 'b': []}, 0.
    for r in range(reps):
        t_a, t_b, ra, rb = pair(r % 2 == 1)
        out['a'].append(steps/t_a); out['b'].append(steps/t_b)
        diff = max(diff, *(abs(x - y) for x, y in zip(ra, rb)))
    out['results'], out['max_result_diff'] = dict(a=ra, b=rb), diff
    return out

class _Nothing(nn.Module):
    def forward(self, x): return x

class _NoOpt:
    "An optimizer that does nothing"
    def __init__(self, params, lr=0.): self.param_groups = [dict(params=[], lr=lr)]
    def step(self): pass
    def zero_grad(self, set_to_none=True): pass

class _FreeLoss(torch.Tensor):
    "A 0-d tensor whose `backward` does nothing: the loop still calls it, and reads the value, as for a real loss"
    __torch_function__ = torch._C._disabled_torch_function_impl  # plain tensor speed for everything else
    def backward(self, *args, **kwargs): pass

_LOSS = torch.zeros(()).as_subclass(_FreeLoss)
def _no_loss(pred, y): return _LOSS

def noop_plain(batches):
    "The plain loop doing nothing per batch but the calls a training step makes"
    model, opt = _Nothing(), _NoOpt(None)
    model.train()
    for x, y in batches:
        loss = _no_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

# ---------------------------------------------------------------------------------------------------------------
# Workers: each prints/writes its figures as JSON

class _Terminal(io.TextIOBase):
    "Says it is a terminal and discards what it is given: the Learner's progress bar is drawn as in an interactive run"
    def isatty(self): return True
    def writable(self): return True
    def write(self, s): return len(s)

def _drawn(f):
    "`f()` with `sys.stderr` a `_Terminal`, so tqdm draws the bar (it switches itself off when stderr is not a terminal)"
    with contextlib.redirect_stderr(_Terminal()): return f()

def gpu_for_rank(local_rank:int, world_size:int)->tuple:
    """`(device, backend)` of a rank on this machine's GPUs: its own GPU over NCCL when there is one per rank, else
    GPU 0, shared, over gloo (NCCL refuses two ranks on one GPU)"""
    n = torch.cuda.device_count()
    return (torch.device('cuda', local_rank), 'nccl') if world_size <= n else (torch.device('cuda', 0), 'gloo')

def worker_ddp(reps:int, every:int, cuda:bool=False, items:bool=False, module_loss:bool=False):
    """One launched job: lockstep pairs of the raw DDP loop (A) and Learner + distrib_ctx (B); rank 0 returns the
    figures. With `items`, both train with a loss over items: by hand (A, `raw_fit`), and `nn.CrossEntropyLoss()` (B),
    which the Learner's `ItemMean` weights over the ranks; with `module_loss`, only B does (A: the batch mean)"""
    from distrib import Learner, DataLoaders, accuracy, setup_distrib, current_world
    torch.set_num_threads(1)
    w = current_world()
    device, backend = gpu_for_rank(w.local_rank, w.world_size) if cuda else (None, 'gloo')
    if cuda: torch.cuda.set_device(device)
    setup_distrib(backend=backend, timeout=120)  # kept for every pair: distrib_ctx then only wraps and unwraps
    def sync():
        if cuda: torch.cuda.synchronize()
        dist.barrier()
    (train_a, valid_a), (train_b, valid_b) = make_data(items), make_data(items)  # see worker_single
    def pair(lead):
        ddp = nn.parallel.DistributedDataParallel(make_model().to(device), device_ids=[device] if cuda else None)
        ts = SameOrderSampler(train_a, shuffle=True, seed=0)
        loop = raw_fit(ddp, DataLoader(train_a, batch_size=BS, sampler=ts),
                       DataLoader(valid_a, batch_size=BS, sampler=DistributedSampler(valid_a, shuffle=False)), ts, every,
                       device, items)
        dls = DataLoaders(DataLoader(train_b, batch_size=BS, shuffle=True), DataLoader(valid_b, batch_size=BS))
        learn = Learner(dls, make_model(), nn.CrossEntropyLoss() if items or module_loss else F.cross_entropy,
                        metrics=accuracy)
        learn.logger = noop  # the epoch table would interleave with ours
        with learn.distrib_ctx(device=device):
            t_a, t_b, res_a, res_b = lockstep(learn, loop, every, lead, sync)
        t = torch.tensor([t_a, t_b], dtype=torch.float64, device=device if backend == 'nccl' else None)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's time
        del loop, ddp
        gc.collect()  # free the DDP reducer now, as distrib_ctx does on exit (untimed)
        return *t.tolist(), res_a, res_b
    out = _pairs(pair, reps, EPOCHS * (N_TRAIN // (w.world_size*BS)))
    dist.barrier()  # no collective in flight when the group goes: gloo may abort otherwise (pytorch#56297)
    dist.destroy_process_group()
    return out if int(os.environ.get('RANK', 0)) == 0 else None

def worker_single(reps:int, every:int, cuda:bool=False):
    "Lockstep pairs of the plain loop (A) and `Learner.fit` (B) in this process (on GPU 0 with `cuda`)"
    from distrib import Learner, DataLoaders, accuracy
    torch.set_num_threads(1)
    device = torch.device('cuda', 0) if cuda else None
    sync = torch.cuda.synchronize if cuda else noop
    # Each side reads its own copy of the data: the same samples in the same order, but a batch one side just read is
    # not in the cache for the other
    data = dict(a=make_data(), b=make_data())
    def pair(lead):
        loop = raw_fit(make_model().to(device), *seeded_loaders(*data['a']), every=every, device=device)
        learn = Learner(DataLoaders(*seeded_loaders(*data['b'])), make_model().to(device), F.cross_entropy,
                        metrics=accuracy)
        learn.logger = noop
        return lockstep(learn, loop, every, lead, sync)
    return _pairs(pair, reps, EPOCHS * (N_TRAIN // BS))

def worker_dispatch(reps, runs, n=20_000):
    "Alternate a no-op `Learner.fit` and the no-op plain loop over `n` batches; microseconds per batch"
    from distrib import Learner, DataLoaders
    torch.set_num_threads(1)
    batches = [(torch.zeros(BS, 1), torch.zeros(BS))] * n
    def plain():
        t0 = time.perf_counter(); noop_plain(batches); return time.perf_counter() - t0, None
    def learner():
        learn = Learner(DataLoaders(batches), _Nothing(), _no_loss, opt_func=_NoOpt)
        learn.logger = lambda *a: None
        t0 = time.perf_counter(); _drawn(lambda: learn.fit(1)); return time.perf_counter() - t0, None
    return _alternate(dict(a=plain, b=learner), reps, runs, lambda t: t/n*1e6)

def worker_data(reps, runs, nw, epochs=4):
    "Alternate iterating rank 0's shard with DataLoader + DistributedSampler and with DistributedDL; batches/s"
    from distrib import DistributedDL
    torch.set_num_threads(1)
    train_ds, _ = make_data()
    kw = dict(num_workers=nw, persistent_workers=True) if nw else {}
    sampler = DistributedSampler(train_ds, num_replicas=W, rank=0, shuffle=True, seed=0)
    loaders = dict(a=DataLoader(train_ds, batch_size=BS, sampler=sampler, **kw),
                   b=DistributedDL(train_ds, batch_size=BS, shuffle=True, seed=0, rank=0, world_size=W, **kw))
    n = epochs * len(loaders['a'])
    def run(dl):
        def f():
            t0 = time.perf_counter()
            for e in range(epochs):
                dl_ = loaders[dl]
                (sampler if dl == 'a' else dl_).set_epoch(e)
                for b in dl_: pass
            return time.perf_counter() - t0, None
        return f
    res = _alternate(dict(a=run('a'), b=run('b')), reps, runs, lambda t: n/t)
    # each side reads its rank-0 shard, in its order
    sampler.set_epoch(1); loaders['b'].set_epoch(1)
    x = train_ds.tensors[0]
    res['own_shard'] = (torch.equal(torch.cat([b[0] for b in loaders['a']]), x[list(sampler)]) and
                        torch.equal(torch.cat([b[0] for b in loaders['b']]), x[loaders['b'].get_idxs()[:]]))
    return res

def _alternate(fs, reps, runs, rate):
    """Run `fs['a']` and `fs['b']` (each returning `(seconds, result)`) once each to warm up, then `reps`
    repetitions of `runs` runs of each, alternating run by run (a b, b a, ...); per repetition, `rate(seconds)` of
    each side's median run"""
    out = {k: [] for k in fs}
    results = {k: f()[1] for k, f in fs.items()}
    for r in range(reps):
        ts = {k: [] for k in fs}
        for i in range(runs):
            for k in (('a', 'b') if (r*runs + i) % 2 == 0 else ('b', 'a')):
                t, results[k] = fs[k]()
                ts[k].append(t)
        for k in fs: out[k].append(rate(statistics.median(ts[k])))
    out['results'] = results
    return out

# ---------------------------------------------------------------------------------------------------------------
# The driver

def _child_env():
    "The environment of every job: this checkout's `distrib` first on the path, 1 thread"
    pp = os.environ.get('PYTHONPATH')
    return dict(os.environ, PYTHONPATH=str(ROOT) + (os.pathsep + pp if pp else ''), OMP_NUM_THREADS='1',
                PYTHONUNBUFFERED='1')

def _run(cmd, timeout):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_child_env(), cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"benchmark job failed ({r.returncode}): {' '.join(map(str, cmd))}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    return r

def _job(args, out, timeout=600):
    "Run this script's worker `args` in a fresh process; its JSON result"
    _run([sys.executable, __file__, '--out', out, *args], timeout)
    return json.loads(Path(out).read_text())

def bench_ddp(reps:int, every:int, tmp, world_size:int=W, device:str='cpu', worker:str='ddp')->dict:
    "One `python -m distrib.launch` job of `world_size` processes running the DDP lockstep pairs (of `worker`)"
    f = Path(tmp)/'ddp.json'
    _run([sys.executable, '-m', 'distrib.launch', '--nproc_per_node', str(world_size), __file__, '--out', str(f),
          '--worker', worker, '--reps', str(reps), '--every', str(every), '--device', device], 900)
    return json.loads(f.read_text())

def needs_cuda(script:str, device:str):
    "Exit with code 2 and one line when `device` is 'cuda' and torch sees no GPU"
    if device == 'cuda' and not torch.cuda.is_available():
        print(f"{script}: --device cuda needs a CUDA GPU, and torch {torch.__version__} sees none here "
              f"(torch.cuda.is_available() is False); run it on a GPU machine, or without --device cuda", file=sys.stderr)
        sys.exit(2)

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--reps', type=int, default=9, help='A/B repetitions per comparison (>= 3)')
    p.add_argument('--every', type=int, default=1, help='ddp, single: batches per turn of each side')
    p.add_argument('--runs', type=int, default=3, help='dispatch, data: timed runs per repetition (median taken)')
    p.add_argument('--sections', default=None,
                   help='comma-separated subset to run (default: ddp,ddp_ce,single,dispatch,data; with cuda: ddp2,single)')
    p.add_argument('--device', default='cpu', choices=['cpu', 'cuda'], help='where the ddp and single sections train')
    p.add_argument('--worker', help=argparse.SUPPRESS)
    p.add_argument('--nw', type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument('--out', help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        cuda = a.device == 'cuda'
        res = dict(ddp=lambda: worker_ddp(a.reps, a.every, cuda),
                   ddp_ce=lambda: worker_ddp(a.reps, a.every, cuda, module_loss=True),
                   ddp_items=lambda: worker_ddp(a.reps, a.every, cuda, items=True),
                   single=lambda: worker_single(a.reps, a.every, cuda),
                   dispatch=lambda: worker_dispatch(a.reps, a.runs), data=lambda: worker_data(a.reps, a.runs, a.nw))[a.worker]()
        if res is not None: Path(a.out).write_text(json.dumps(res))
        return
    needs_cuda('bench/overhead.py', a.device)
    if a.reps < 3: p.error('--reps must be >= 3')
    if a.every < 1 or a.runs < 1: p.error('--every and --runs must be >= 1')
    cuda = a.device == 'cuda'
    sections = (a.sections or ('ddp2,single' if cuda else 'ddp,ddp_ce,single,dispatch,data')).split(',')
    if 'ddp1' in sections: p.error('ddp1: one process has no process group, and distrib_ctx trains it without DDP: '
                                   'the single section measures it')
    if cuda and set(sections) & {'dispatch', 'data'}: p.error('dispatch and data measure the CPU: run them without --device cuda')
    load0, t0 = os.getloadavg()[0], time.time()
    figs = {}
    with tempfile.TemporaryDirectory() as tmp:
        def job(*args): return _job([*args, '--reps', str(a.reps), '--runs', str(a.runs), '--every', str(a.every),
                                     '--device', a.device], str(Path(tmp)/'out.json'))
        if 'ddp' in sections: figs['ddp'] = bench_ddp(a.reps, a.every, tmp)
        if 'ddp_ce' in sections: figs['ddp_ce'] = bench_ddp(a.reps, a.every, tmp, W, a.device, 'ddp_ce')
        if 'ddp_items' in sections: figs['ddp_items'] = bench_ddp(a.reps, a.every, tmp, W, a.device, 'ddp_items')
        if 'ddp2' in sections: figs['ddp2'] = bench_ddp(a.reps, a.every, tmp, 2, a.device)
        if 'single' in sections: figs['single'] = job('--worker', 'single')
        if 'dispatch' in sections: figs['dispatch'] = job('--worker', 'dispatch')
        if 'data' in sections:
            for nw in (0, 2): figs[f'data_nw{nw}'] = job('--worker', 'data', '--nw', str(nw))
    summary, ok = {}, True
    names = dict(ddp=('DDP W=2, steps/s', 'raw DDP loop', 'Learner+distrib_ctx'),
                 ddp_ce=('DDP W=2 CE module, steps/s', 'raw DDP loop', 'Learner+CrossEntropyLoss'),
                 ddp_items=('DDP W=2 items, steps/s', 'raw DDP loop, count all-reduce', 'Learner+distrib_ctx'),
                 ddp2=('GPU, DDP W=2, steps/s', 'raw DDP loop', 'Learner+distrib_ctx'),
                 single=('1 process, steps/s', 'plain loop', 'Learner.fit'),
                 data_nw0=('data nw=0, batches/s', 'DataLoader+DistributedSampler', 'DistributedDL'),
                 data_nw2=('data nw=2, batches/s', 'DataLoader+DistributedSampler', 'DistributedDL'),
                 dispatch=('dispatch, us/batch', 'plain no-op loop', 'Learner no-op fit'))
    gpu = f", {torch.cuda.get_device_name(0)} ({torch.cuda.device_count()} GPUs)" if cuda else ''
    print(f"\ndistrib overhead: torch {torch.__version__}{gpu}, {os.cpu_count()} CPUs, {a.reps} repetitions (ddp, single: "
          f"lockstep pairs, {a.every} batch(es) a turn; dispatch, data: {a.runs} runs a side each), "
          f"load {load0:.2f} -> {os.getloadavg()[0]:.2f} (1-min average), {time.time()-t0:.0f} s")
    print(f"{'comparison':<22} {'A':<30} {'A median':>9} {'B':<20} {'B median':>9} {'B/A':>8} {'med/med':>8} {'target':>10}")
    for k, (title, na, nb) in names.items():
        if k not in figs: continue
        ra, rb = figs[k]['a'], figs[k]['b']
        ma, mb = statistics.median(ra), statistics.median(rb)
        if k == 'dispatch':  # a cost: B minus A
            val, of_medians = statistics.median(b - a for a, b in zip(ra, rb)), mb - ma
            target, good = f"< {TARGETS[k+'_us']:g} us", val < TARGETS[k+'_us']
            shown = f"{val:+.1f}us", f"{of_medians:+.1f}us"
        else:
            val, of_medians = statistics.median(b/a for a, b in zip(ra, rb)), mb/ma
            t = TARGETS['ddp' if k.startswith('ddp') else k]
            target, good = f">= {t:.2f}", val >= t
            shown = f"{val:.3f}", f"{of_medians:.3f}"
        ok &= good
        print(f"{title:<22} {na:<30} {ma:>9.1f} {nb:<20} {mb:>9.1f} {shown[0]:>8} {shown[1]:>8} {target:>10} {'ok' if good else 'MISSED'}")
        summary[k] = dict(a=ma, b=mb, a_reps=ra, b_reps=rb, met=good,
                          **({'overhead_us': val, 'overhead_of_medians_us': of_medians} if k == 'dispatch'
                             else {'ratio': val, 'ratio_of_medians': of_medians}))
    for k in ('ddp', 'ddp_ce', 'ddp_items', 'ddp2', 'single'):
        if k in figs:
            ra, rb, diff = figs[k]['results']['a'], figs[k]['results']['b'], figs[k]['max_result_diff']
            same = diff < 1e-4  # over every pair
            summary[k].update(final_a=ra, final_b=rb, max_result_diff=diff, same_result=same)
            print(f"{names[k][0]}: last-epoch [train_loss, valid_loss, accuracy] A {[round(v, 5) for v in ra]}, "
                  f"B {[round(v, 5) for v in rb]}{'' if same else '  DIFFER'}")
            ok &= same
    for k in ('data_nw0', 'data_nw2'):
        if k in figs:
            summary[k]['own_shard'] = figs[k]['own_shard']; ok &= figs[k]['own_shard']
    print(json.dumps(dict(torch=torch.__version__, device=a.device, gpu=torch.cuda.get_device_name(0) if cuda else None,
                          cpus=os.cpu_count(), reps=a.reps, every=a.every, runs=a.runs, load_start=load0,
                          load_end=os.getloadavg()[0], all_met=ok, **summary)))

if __name__ == '__main__': main()
