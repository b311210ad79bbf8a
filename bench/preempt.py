"""What `Checkpoint`'s agreement on stop signals costs per training step: 2 gloo processes, CPU, 1 thread each.

    python bench/preempt.py              # from the repository root: a table, then one JSON line (about 1 minute)
    python bench/preempt.py --reps 15

After an optimizer step, every `k` steps, the ranks all-reduce (max) `[signal received, k proposed by rank 0]`,
rank 0 choosing `k` so that this takes about 1 % of the time (`distrib.callback.preemption.StopSignals`). Measured:
- agreement alone: one such all-reduce, in a loop (its whole latency);
- MLP step: the step of bench/overhead.py (784-256-256-10, batch 64, forward, backward, Adam), followed (B) or not
  (A) by `StopSignals.at_step`; the last `k` rank 0 chose is reported;
- in `fit`: `Learner` + `distrib_ctx` training 1 epoch (64 steps per rank) with `Checkpoint(signals=('SIGTERM',))`
  (B) against `Checkpoint(signals=())` (A), neither writing a checkpoint in the timed epoch; whole fits
  alternate (A B, then B A, ...), each timed from `before_train` to `after_train` on its slowest rank. Also the
  time rank 0 spent in the agreements' all-reduces (`StopSignals.secs_agreed`) per step: the cost itself, which
  the A/B difference measures only to within the machine's noise.
For each, the median over `--reps` repetitions of B's time per step minus A's in the same repetition, and B/A.
The machine should be otherwise idle (the load is printed).
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path
import torch
import torch.distributed as dist
from torch.nn import functional as F
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's distrib
sys.path.insert(0, str(ROOT/'bench'))
from overhead import make_data, make_model, BS
from distrib import Learner, DataLoaders, Callback, Checkpoint, setup_distrib, current_world
from distrib.callback.preemption import StopSignals

def agreement()->StopSignals:
    "The agreement `Checkpoint` runs, between the ranks of the default group, no signal handler installed"
    a = StopSignals(('SIGTERM',))
    a.shared, a.rank, a.n_agreed, a.secs_agreed = True, current_world().rank, 0, 0.
    return a

def slowest(secs:float)->float:
    "The largest of the ranks' `secs`"
    t = torch.tensor([secs], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()

def alone(n:int)->float:
    "Microseconds per agreement, with nothing between post and wait"
    dist.barrier()
    t0 = time.perf_counter()
    a = agreement()
    for _ in range(n): a.now()
    return slowest(time.perf_counter() - t0)/n*1e6

def in_step(n:int, with_agreement:bool)->tuple:
    "Microseconds per MLP step followed by the agreement (or not), and the last `k` (0 without)"
    model, (xy, _) = make_model(), make_data()
    opt = torch.optim.Adam(model.parameters())
    x, y = xy.tensors[0][:BS], xy.tensors[1][:BS]
    a = agreement()
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(n):
        F.cross_entropy(model(x), y).backward()
        opt.step(); opt.zero_grad(set_to_none=True)
        if with_agreement: a.at_step(i + 1)
    return slowest(time.perf_counter() - t0)/n*1e6, (a.next - a.last[0] if with_agreement else 0)

class TrainTime(Callback):
    def before_train(self): self.t0 = time.perf_counter()
    def after_train(self): self.secs, self.steps = time.perf_counter() - self.t0, self.learn.n_iter

def in_fit(signals:tuple, tmp:Path)->tuple:
    """Microseconds per training step of a 1-epoch fit with Checkpoint(signals=signals), no checkpoint written; and
    rank 0's time in the agreements' all-reduces per step, and their number"""
    train, valid = make_data()
    learn = Learner(DataLoaders(DataLoader(train, batch_size=BS, shuffle=True), DataLoader(valid, batch_size=BS)),
                    make_model(), F.cross_entropy, path=tmp)
    learn.progress.enabled = False
    learn.logger = lambda *a: None
    tt = TrainTime()
    ck = Checkpoint(f'ck{len(signals)}', every_epoch=False, resume=False, signals=signals)
    with learn.distrib_ctx(): learn.fit(1, cbs=[ck, tt])
    s = ck.stop_signals
    return slowest(tt.secs)/tt.steps*1e6, s.secs_agreed/tt.steps*1e6, s.n_agreed

def worker(reps:int, out:str):
    torch.set_num_threads(1)
    setup_distrib(timeout=120)
    res = dict(alone=[], step_a=[], step_b=[], fit_a=[], fit_b=[], k=[], fit_agreeing=[], fit_n_agreed=[])
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)/str(current_world().rank)  # each rank its own (no file is written in the timed fits)
        in_step(20, True); in_fit((), d)         # warm-up
        for i in range(reps):
            res['alone'].append(alone(2000))
            for b in ((False, True) if i % 2 == 0 else (True, False)):
                us, k = in_step(300, b)
                res['step_b' if b else 'step_a'].append(us)
                if b: res['k'].append(k)
            for b in ((False, True) if i % 2 == 0 else (True, False)):
                us, agreeing, n = in_fit(('SIGTERM',) if b else (), d)
                res['fit_b' if b else 'fit_a'].append(us)
                if b: res['fit_agreeing'].append(agreeing); res['fit_n_agreed'].append(n)
    if current_world().rank == 0: Path(out).write_text(json.dumps(res))

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--reps', type=int, default=9, help='repetitions (>= 3)')
    p.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--out', help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker: return worker(a.reps, a.out)
    if a.reps < 3: p.error('--reps must be >= 3')
    load0, t0 = os.getloadavg()[0], time.time()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)/'out.json'
        env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1',
                   PYTHONPATH=str(ROOT) + (os.pathsep + os.environ['PYTHONPATH'] if 'PYTHONPATH' in os.environ else ''))
        r = subprocess.run([sys.executable, '-m', 'distrib.launch', '--nproc_per_node', '2', __file__, '--worker',
                            '--reps', str(a.reps), '--out', str(out)], capture_output=True, text=True, timeout=1200,
                           env=env, cwd=ROOT)
        if r.returncode != 0: sys.exit(f"benchmark job failed ({r.returncode})\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
        res = json.loads(out.read_text())
    med = statistics.median
    rows = {'agreement alone': (None, res['alone']), 'MLP step': (res['step_a'], res['step_b']),
            'Learner.fit step': (res['fit_a'], res['fit_b'])}
    print(f"\nCheckpoint's signal agreement, 2 gloo processes, torch {torch.__version__}, {a.reps} repetitions, load "
          f"{load0:.2f} -> {os.getloadavg()[0]:.2f} (1-min average), {time.time()-t0:.0f} s")
    print(f"{'us per step':<18} {'A: without':>11} {'B: with':>9} {'B-A':>8} {'B/A':>7}")
    summary = {}
    for name, (ra, rb) in rows.items():
        if ra is None:
            print(f"{name:<18} {'':>11} {med(rb):>9.1f} {med(rb):>+8.1f} {'':>7}")
            summary[name] = dict(b=med(rb), b_reps=rb)
            continue
        diff, ratio = med(b - a for a, b in zip(ra, rb)), med(b/a for a, b in zip(ra, rb))
        print(f"{name:<18} {med(ra):>11.1f} {med(rb):>9.1f} {diff:>+8.1f} {ratio:>7.3f}")
        summary[name] = dict(a=med(ra), b=med(rb), diff_us=diff, ratio=ratio, a_reps=ra, b_reps=rb)
    print(f"k (steps between two agreements) rank 0 chose at the end of the MLP steps: {res['k']}")
    print(f"Learner.fit, 64 steps: {med(res['fit_n_agreed']):g} agreements (median), rank 0's time in them "
          f"{med(res['fit_agreeing']):.1f} us per step (median; {min(res['fit_agreeing']):.1f} to "
          f"{max(res['fit_agreeing']):.1f}), {med(res['fit_agreeing'])/med(res['fit_a'])*100:.2f} % of a step")
    print(json.dumps(dict(torch=torch.__version__, reps=a.reps, load_start=load0, load_end=os.getloadavg()[0],
                          k=res['k'], fit_agreeing_us=res['fit_agreeing'], fit_n_agreed=res['fit_n_agreed'],
                          **summary)))

if __name__ == '__main__': main()
