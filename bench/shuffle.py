"""A rank's shuffled shard of a data set of N samples (issue 40): `DistributedDL(shuffle=True)`, whose indices are
computed as they are read (`index_shuffle`), against `DataLoader` + torch's `DistributedSampler`, which draws
`torch.randperm(N)` on every rank at every epoch and keeps its shard as a list. CPU, 1 thread.

    python bench/shuffle.py                    # N = 1e6 .. 1e10, W = 8 and 16,384: a table, then one JSON line
    python bench/shuffle.py --n 1e6,1e7 --randperm-max 1e7 --world 8

Every figure comes from a fresh process (`--one SIDE N W`), rank W-1 of W, over a data set whose items are computed
from their index (`__getitem__` returns it: the indices are all that costs memory), batch size 32, epoch 1:
- first batch: seconds from building the loader (and `set_epoch`) to its first batch;
- resume: the same for a loader told to start in the middle of the epoch (`start_at(half the shard)`;
  `DistributedSampler` cannot, so it is not measured there: a hand-written resume rebuilds the list);
- memory: the process's peak resident memory (VmHWM, reset once the imports are done) minus its resident memory
  then, in MB;
- sampler indices/s: the ints the loader's sampler yields (what the DataLoader batches), over up to 10^6 of them
  after the first batch (the whole shard when smaller); batch indices/s: `get_idxs().batches(32)`, the int64
  batches the TensorDataset path reads.
`DistributedSampler` is measured only up to `--randperm-max` (default 1e8): at 1e9 its list alone needs about
40 GB per rank (8 bytes of pointer and 28 of int object per index, before the shard is sliced), and at 1e10 the
permutation itself needs 80 GB. The last lines check issue 40's target: at N = 1e10, on rank 7 of 8 and rank 16,383
of 16,384, the first batch within 1 s of building the loader, at most 0.1 GB above the import.
"""
import argparse, json, os, subprocess, sys, time

BS = 32

def _status(key:str)->int:
    "A `/proc/self/status` figure in bytes (VmRSS, VmHWM)"
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(key + ':'): return int(line.split()[1]) * 1024
    raise KeyError(key)

def one(side:str, n:int, W:int)->dict:
    "Measure one loader in this process: see the module docstring"
    import itertools
    import torch
    from torch.utils.data import DataLoader, Dataset, DistributedSampler
    from distrib import DistributedDL
    torch.set_num_threads(1)
    class Computed(Dataset):
        "`n` samples, sample `i` being `i`"
        def __len__(self): return n
        def __getitem__(self, i): return i
    ds, rank = Computed(), W - 1
    try:
        with open('/proc/self/clear_refs', 'w') as f: f.write('5')   # VmHWM := VmRSS
    except OSError: pass
    base = _status('VmRSS')
    t0 = time.perf_counter()
    if side == 'distrib':
        dl = DistributedDL(ds, batch_size=BS, shuffle=True, seed=0, rank=rank, world_size=W)
        dl.set_epoch(1)
        first = next(iter(dl))
    else:
        sampler = DistributedSampler(ds, num_replicas=W, rank=rank, shuffle=True, seed=0)
        sampler.set_epoch(1)
        dl = DataLoader(ds, batch_size=BS, sampler=sampler)
        first = next(iter(dl))
    t_first = time.perf_counter() - t0
    assert len(first) == min(BS, len(dl.get_idxs() if side == 'distrib' else sampler))
    res = dict(side=side, n=n, world_size=W, first_batch_s=t_first)
    # the sampler's ints, after the first batch
    it = iter(dl.dl.sampler if side == 'distrib' else sampler)
    k = min(10**6, len(dl.dl.sampler if side == 'distrib' else sampler))
    t0 = time.perf_counter()
    for _ in itertools.islice(it, k): pass
    res['sampler_idx_per_s'] = k / (time.perf_counter() - t0)
    if side == 'distrib':
        idxs = dl.get_idxs()
        t0 = time.perf_counter()
        got = sum(len(b) for b in itertools.islice(idxs.batches(BS), -(-k // BS)))
        res['batch_idx_per_s'] = got / (time.perf_counter() - t0)
        half = len(idxs) // 2
        t0 = time.perf_counter()
        dl.start_at(half)
        resumed = next(iter(dl))
        res['resume_first_batch_s'] = time.perf_counter() - t0
        assert torch.equal(resumed, idxs[half:half + BS])
    res['memory_mb'] = (_status('VmHWM') - base) / 2**20
    return res

def run_one(side:str, n:int, W:int, timeout:float=900)->dict:
    "`one(side, n, W)` in a fresh process; the error in words if it failed"
    r = subprocess.run([sys.executable, __file__, '--one', side, str(n), str(W)], capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS='1'))
    if r.returncode: return dict(side=side, n=n, world_size=W, error=(r.stderr.strip().splitlines() or ['?'])[-1])
    return json.loads(r.stdout.strip().splitlines()[-1])

def _fmt(x, spec:str)->str: return '-' if x is None else format(x, spec)

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--n', default='1e6,1e7,1e8,1e9,1e10', help='data set sizes, comma-separated')
    ap.add_argument('--world', default='8,16384', help='world sizes, comma-separated')
    ap.add_argument('--randperm-max', default='1e8', help='largest N measured with DistributedSampler')
    ap.add_argument('--one', nargs=3, metavar=('SIDE', 'N', 'W'), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one[0], int(float(a.one[1])), int(a.one[2]))))
        return
    ns, ws = [int(float(x)) for x in a.n.split(',')], [int(x) for x in a.world.split(',')]
    rows = []
    print(f"{'N':>7} {'W':>6} {'loader':<34} {'first batch':>11} {'resume':>8} {'memory':>10} "
          f"{'sampler idx/s':>14} {'batch idx/s':>12}")
    for n in ns:
        for W in ws:
            for side in ('distrib', 'torch'):
                if side == 'torch' and n > float(a.randperm_max):
                    r = dict(side=side, n=n, world_size=W, skipped=f'not measured: N > {a.randperm_max}')
                else: r = run_one(side, n, W)
                rows.append(r)
                name = 'DistributedDL(shuffle=True)' if side == 'distrib' else 'DataLoader + DistributedSampler'
                if 'error' in r or 'skipped' in r:
                    print(f"{n:>7.0e} {W:>6} {name:<34} {r.get('error') or r['skipped']}")
                    continue
                print(f"{n:>7.0e} {W:>6} {name:<34} {r['first_batch_s']:>10.3f}s "
                      f"{_fmt(r.get('resume_first_batch_s'), '>7.3f')}{'s' if 'resume_first_batch_s' in r else ' '} "
                      f"{r['memory_mb']:>7.1f} MB {r['sampler_idx_per_s']:>14,.0f} "
                      f"{_fmt(r.get('batch_idx_per_s'), '>12,.0f')}", flush=True)
    target = [r for r in rows if r['side'] == 'distrib' and r['n'] == 10**10 and r['world_size'] in (8, 16384)
              and 'error' not in r]
    for r in target:
        ok = r['first_batch_s'] <= 1 and r['memory_mb'] <= 100
        print(f"issue 40 target, N=1e10, rank {r['world_size']-1} of {r['world_size']}: first batch "
              f"{r['first_batch_s']:.3f} s (<= 1 s), {r['memory_mb']:.1f} MB above the import (<= 100): "
              f"{'met' if ok else 'NOT met'}")
    print(json.dumps(rows))

if __name__ == '__main__': main()
