"""How much distrib's loop costs against hand-written ones: CPU, gloo, 1 thread per process.

    python bench/overhead.py            # from the repository root: a table, then one JSON line (about 4 minutes)
    python bench/overhead.py --reps 7 --sections ddp,dispatch   # a subset, more repetitions

A and B alternate (a b, then b a, ...) and medians are reported, so a drift of the machine's load hits both sides
alike; "B/A" is the ratio of the medians, "paired" the median of the ratios of adjacent A and B repetitions.
Every process runs with `torch.set_num_threads(1)` (and OMP_NUM_THREADS=1).

- ddp: an MLP 784-256-256-10 on synthetic data (8,192 train / 2,048 valid samples, batch 64 per process, 2 epochs,
  Adam lr 1e-3, the same init and the same shuffled order on both sides) on W=2 gloo processes, (a) by a
  hand-written DDP loop with `DistributedSampler`, (b) by `Learner` + `distrib_ctx`. Both validate every epoch,
  computing loss and accuracy over the validation set, all-reduced, and both record the epoch's training loss.
  Each repetition is a fresh `python -m distrib.launch` job for one side; in it, after an untimed warm-up fit,
  `--runs` fits are timed, from a barrier just before the first training step to the end of the last validation,
  on the slowest rank (process start-up and DDP construction are not timed). steps/s = training steps / that time.
  Both sides must end with the same losses and accuracy (checked: the comparison is of the same work).
- single: the same in one process: `Learner.fit` vs the plain loop, over the same `DataLoader`s.
- dispatch: a fit whose model, loss and optimizer do nothing (identity model, a loss whose backward is a no-op, a
  no-op optimizer) over 20,000 prebuilt batches: the Learner's time per batch minus the plain loop's doing the same
  calls is what its events and default callbacks (Recorder, ProgressCallback) cost per batch.
On the Learner side the progress bar is drawn (to a sink that says it is a terminal), as in an interactive run.
- data: iterating rank 0's shard (W=2, batch 64, shuffle) of the training set, 4 epochs: `DistributedDL` vs
  `DataLoader` + `DistributedSampler`, with num_workers 0 and 2 (persistent workers: worker start-up not timed).
  Both must give the same batches (checked).

The machine should be otherwise idle: check `uptime` (the load is printed in the table's title).
"""
import argparse, contextlib, datetime, gc, io, json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset, DistributedSampler

ROOT = Path(__file__).resolve().parent.parent
N_TRAIN, N_VALID, BS, EPOCHS, LR, W = 8192, 2048, 64, 2, 1e-3, 2
TARGETS = dict(ddp=0.98, single=0.98, data_nw0=1.0, data_nw2=1.0, dispatch_us=20.0)

def make_data():
    "Synthetic 10-class data: x ~ N(0, 1) in R^784, y = argmax of a fixed random projection (learnable)"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_TRAIN + N_VALID, 784, generator=g)
    y = (x @ torch.randn(784, 10, generator=g)).argmax(1)
    return TensorDataset(x[:N_TRAIN], y[:N_TRAIN]), TensorDataset(x[N_TRAIN:], y[N_TRAIN:])

def make_model():
    torch.manual_seed(0)  # the same init on both sides
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))

# ---------------------------------------------------------------------------------------------------------------
# The hand-written loops (A)

def raw_fit(model, train_dl, valid_dl, train_sampler=None):
    """A plain training loop: `EPOCHS` epochs of Adam steps, each followed by a validation pass computing loss and
    accuracy; the sums are all-reduced when a process group exists. `model` may be DDP-wrapped (validation then
    runs its `.module`, as the Learner does). Returns `[train_loss, valid_loss, accuracy]` of the last epoch."""
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    plain = getattr(model, 'module', model)
    ddp = dist.is_initialized()
    for epoch in range(EPOCHS):
        if train_sampler is not None: train_sampler.set_epoch(epoch)
        model.train()
        tl, tn = torch.zeros((), dtype=torch.float64), 0
        for x, y in train_dl:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            tl += loss.detach().double()*len(y); tn += len(y)
        if ddp:
            t = torch.stack([tl, torch.tensor(float(tn), dtype=torch.float64)]); dist.all_reduce(t); tl, tn = t[0], t[1]
        plain.eval()
        vl, vc, vn = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64), 0
        with torch.no_grad():
            for x, y in valid_dl:
                out = plain(x)
                vl += F.cross_entropy(out, y).double()*len(y)
                vc += (out.argmax(-1) == y).double().sum()
                vn += len(y)
        if ddp:
            t = torch.stack([vl, vc, torch.tensor(float(vn), dtype=torch.float64)]); dist.all_reduce(t); vl, vc, vn = t
        res = [float(tl/tn), float(vl/vn), float(vc/vn)]
    return res

class _Nothing(nn.Module):
    def forward(self, x): return x

class _NoOpt:
    "An optimizer that does nothing"
    def __init__(self, params, lr=0.): self.param_groups = []
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

def _barrier_time(f):
    "Seconds `f()` takes, from a barrier to its end, on the slowest rank; and `f()`'s result"
    dist.barrier()
    t0 = time.perf_counter()
    res = f()
    t = torch.tensor(time.perf_counter() - t0, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item(), res

def worker_ddp(kind, runs):
    "One launched job (`kind` 'raw' or 'learner'): a warm-up fit then `runs` timed fits; rank 0 returns the figures"
    torch.set_num_threads(1)
    train_ds, valid_ds = make_data()
    steps = EPOCHS * (N_TRAIN // (W*BS))
    times, res = [], None
    if kind == 'raw':
        dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=120))
        for i in range(runs + 1):
            ddp = nn.parallel.DistributedDataParallel(make_model())
            ts = DistributedSampler(train_ds, shuffle=True, seed=0)
            train_dl = DataLoader(train_ds, batch_size=BS, sampler=ts)
            valid_dl = DataLoader(valid_ds, batch_size=BS, sampler=DistributedSampler(valid_ds, shuffle=False))
            t, res = _barrier_time(lambda: raw_fit(ddp, train_dl, valid_dl, ts))
            if i: times.append(t)
            del ddp
            gc.collect()  # free the DDP reducer now, as distrib_ctx does on exit (untimed on both sides)
    else:
        from distrib import Learner, DataLoaders, accuracy, setup_distrib
        setup_distrib(timeout=120)  # kept for every run: distrib_ctx then only wraps and unwraps
        for i in range(runs + 1):
            dls = DataLoaders(DataLoader(train_ds, batch_size=BS, shuffle=True), DataLoader(valid_ds, batch_size=BS))
            learn = Learner(dls, make_model(), F.cross_entropy, metrics=accuracy)
            with learn.distrib_ctx():
                t, _ = _barrier_time(lambda: _drawn(lambda: learn.fit(EPOCHS)))
            res = learn.recorder.values[-1]
            if i: times.append(t)
    out = dict(steps_per_s=[steps/t for t in times], result=res)
    dist.barrier()  # no collective in flight when the group goes: gloo may abort otherwise (pytorch#56297)
    dist.destroy_process_group()
    return out if dist_rank0() else None

def dist_rank0(): return int(os.environ.get('RANK', 0)) == 0

def worker_single(reps, runs):
    "Alternate `Learner.fit` and the plain loop in this process; steps/s per repetition (median of `runs` fits)"
    from distrib import Learner, DataLoaders, accuracy
    torch.set_num_threads(1)
    train_ds, valid_ds = make_data()
    steps = EPOCHS * (N_TRAIN // BS)
    def loaders(): return DataLoader(train_ds, batch_size=BS, shuffle=True), DataLoader(valid_ds, batch_size=BS)
    def plain():
        model = make_model()  # seeds: the shuffle order then is the same as the Learner's
        tdl, vdl = loaders()
        t0 = time.perf_counter(); res = raw_fit(model, tdl, vdl); return time.perf_counter() - t0, res
    def learner():
        model = make_model()
        learn = Learner(DataLoaders(*loaders()), model, F.cross_entropy, metrics=accuracy)
        learn.logger = lambda *a: None  # the epoch table would interleave with ours
        t0 = time.perf_counter(); _drawn(lambda: learn.fit(EPOCHS)); return time.perf_counter() - t0, learn.recorder.values[-1]
    return _alternate(dict(a=plain, b=learner), reps, runs, lambda t: steps/t)

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
    # the same batches on both sides
    sampler.set_epoch(1); loaders['b'].set_epoch(1)
    res['same_batches'] = all(torch.equal(x, y) for ba, bb in zip(loaders['a'], loaders['b']) for x, y in zip(ba, bb))
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

def bench_ddp(reps, runs, tmp):
    "Alternate launched jobs of the raw DDP loop (a) and of Learner + distrib_ctx (b)"
    out, results = {'a': [], 'b': []}, {}
    for r in range(reps):
        for k in (('a', 'b') if r % 2 == 0 else ('b', 'a')):
            f = Path(tmp)/f'ddp_{k}.json'
            _run([sys.executable, '-m', 'distrib.launch', '--nproc_per_node', str(W), __file__, '--out', str(f),
                  '--worker', 'ddp', '--kind', 'raw' if k == 'a' else 'learner', '--runs', str(runs)], 600)
            res = json.loads(f.read_text())
            out[k].append(statistics.median(res['steps_per_s']))
            results[k] = res['result']
    out['results'] = results
    return out

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--reps', type=int, default=5, help='A/B repetitions per comparison (>= 3)')
    p.add_argument('--runs', type=int, default=3, help='timed runs per repetition (median taken)')
    p.add_argument('--sections', default='ddp,single,dispatch,data', help='comma-separated subset to run')
    p.add_argument('--worker', help=argparse.SUPPRESS)
    p.add_argument('--kind', help=argparse.SUPPRESS)
    p.add_argument('--nw', type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument('--out', help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        res = dict(ddp=lambda: worker_ddp(a.kind, a.runs), single=lambda: worker_single(a.reps, a.runs),
                   dispatch=lambda: worker_dispatch(a.reps, a.runs), data=lambda: worker_data(a.reps, a.runs, a.nw))[a.worker]()
        if res is not None: Path(a.out).write_text(json.dumps(res))
        return
    if a.reps < 3: p.error('--reps must be >= 3')
    sections = a.sections.split(',')
    load0, t0 = os.getloadavg()[0], time.time()
    figs, rows = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        def job(*args): return _job([*args, '--reps', str(a.reps), '--runs', str(a.runs)], str(Path(tmp)/'out.json'))
        if 'ddp' in sections: figs['ddp'] = bench_ddp(a.reps, a.runs, tmp)
        if 'single' in sections: figs['single'] = job('--worker', 'single')
        if 'dispatch' in sections: figs['dispatch'] = job('--worker', 'dispatch')
        if 'data' in sections:
            for nw in (0, 2): figs[f'data_nw{nw}'] = job('--worker', 'data', '--nw', str(nw))
    summary, ok = {}, True
    names = dict(ddp=('DDP W=2, steps/s', 'raw DDP loop', 'Learner+distrib_ctx'),
                 single=('1 process, steps/s', 'plain loop', 'Learner.fit'),
                 data_nw0=('data nw=0, batches/s', 'DataLoader+DistributedSampler', 'DistributedDL'),
                 data_nw2=('data nw=2, batches/s', 'DataLoader+DistributedSampler', 'DistributedDL'),
                 dispatch=('dispatch, us/batch', 'plain no-op loop', 'Learner no-op fit'))
    print(f"\ndistrib overhead: torch {torch.__version__}, {os.cpu_count()} CPUs, {a.reps} A/B repetitions x {a.runs} runs, "
          f"load {load0:.2f} -> {os.getloadavg()[0]:.2f} (1-min average), {time.time()-t0:.0f} s")
    print(f"{'comparison':<22} {'A':<30} {'A median':>9} {'B':<20} {'B median':>9} {'B/A':>8} {'paired':>8} {'target':>10}")
    for k, (title, na, nb) in names.items():
        if k not in figs: continue
        ra, rb = figs[k]['a'], figs[k]['b']
        ma, mb = statistics.median(ra), statistics.median(rb)
        if k == 'dispatch':
            val, target = mb - ma, f"< {TARGETS[k+'_us']:g} us"
            paired = statistics.median(b - a for a, b in zip(ra, rb))
            good = val < TARGETS[k+'_us']
            cmp_, pcmp = f"{val:+.1f}us", f"{paired:+.1f}us"
        else:
            val, target = mb/ma, f">= {TARGETS[k]:.2f}"
            paired = statistics.median(b/a for a, b in zip(ra, rb))
            good = val >= TARGETS[k]
            cmp_, pcmp = f"{val:.3f}", f"{paired:.3f}"
        ok &= good
        print(f"{title:<22} {na:<30} {ma:>9.1f} {nb:<20} {mb:>9.1f} {cmp_:>8} {pcmp:>8} {target:>10} {'ok' if good else 'MISSED'}")
        summary[k] = dict(a=ma, b=mb, a_reps=ra, b_reps=rb, met=good,
                          **({'overhead_us': val, 'paired_overhead_us': paired} if k == 'dispatch' else {'ratio': val, 'paired_ratio': paired}))
    for k in ('ddp', 'single'):
        if k in figs:
            ra, rb = figs[k]['results']['a'], figs[k]['results']['b']
            same = max(abs(x - y) for x, y in zip(ra, rb)) < 1e-4
            summary[k].update(final_a=ra, final_b=rb, same_result=same)
            print(f"{names[k][0]}: last-epoch [train_loss, valid_loss, accuracy] A {[round(v, 5) for v in ra]}, "
                  f"B {[round(v, 5) for v in rb]}{'' if same else '  DIFFER'}")
            ok &= same
    for k in ('data_nw0', 'data_nw2'):
        if k in figs:
            summary[k]['same_batches'] = figs[k]['same_batches']; ok &= figs[k]['same_batches']
    print(json.dumps(dict(torch=torch.__version__, cpus=os.cpu_count(), reps=a.reps, runs=a.runs, load_start=load0,
                          load_end=os.getloadavg()[0], all_met=ok, **summary)))

if __name__ == '__main__': main()
