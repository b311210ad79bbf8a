"""DDP against FSDP, each eager and compiled: speed and memory per rank on a ~50M-parameter MLP.

    python bench/strategies.py                       # from the repository root: CPU, gloo, W=2 (a few minutes)
    python bench/strategies.py --device cuda         # one GPU per rank, NCCL (--ranks: at most the GPUs; default 2:
                                                     # with one GPU it says so and exits 0, measuring nothing)
    python bench/strategies.py --hidden 64 --layers 2 --steps 4 --warmup 1 --batch 2   # a quick check

Model: `--layers` Linear(hidden, hidden) layers with ReLUs between them (3 x 4096: 50,343,936 parameters), MSE on
synthetic data, Adam lr 1e-4, batches of `--batch` samples per rank, `--warmup` + `--steps` training steps in one
`fit` of a `Learner` under `distrib_ctx`. Configurations (`--configs`): `ddp`, `ddp_compiled` (`compile=True`),
`fsdp`, `fsdp_compiled` (`strategy='fsdp'`, one block per Linear). Each runs in its own job of `--ranks` processes
(`python -m distrib.launch`), so that each has its own peak memory.

Per configuration: steps/s over the steps after the warm-up (a step timed from `before_batch` to `after_batch`,
the slowest rank's, after a CUDA synchronize on GPUs; the first step, where compiling happens, is reported apart);
peak memory per rank from the start to the end of `fit` (CPU: the process's peak resident set, `ru_maxrss`, which
includes the Learner's own copy of the model under FSDP; CUDA: `torch.cuda.max_memory_allocated`; the JSON also
has the peak after leaving the context, where FSDP gathers the weights and optimizer state back into the
Learner's model and optimizer); and the bytes each rank holds of parameters,
gradients and optimizer state (`distrib.local_state_bytes`: local shards under FSDP), about 1/W of DDP's under
FSDP. Every configuration starts from the same weights and data, and must end with the same weights (the largest
difference from `ddp` is reported: the runs did the same work). The table is followed by one JSON line.
"""
import argparse, json, resource, subprocess, sys, tempfile, time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's distrib
from distrib import (Learner, DataLoaders, Callback, local_state_bytes, gather_object, rank_distrib, num_distrib,
                     local_rank_distrib)

CONFIGS = {'ddp': dict(), 'ddp_compiled': dict(compile=True),
           'fsdp': dict(strategy='fsdp', shard_classes=nn.Linear),
           'fsdp_compiled': dict(strategy='fsdp', shard_classes=nn.Linear, compile=True)}
MiB = 2**20

def make_model(hidden:int, layers:int)->nn.Module:
    torch.manual_seed(0)
    mods = []
    for i in range(layers): mods += [nn.Linear(hidden, hidden)] + ([nn.ReLU()] if i < layers - 1 else [])
    return nn.Sequential(*mods)

def sample(model:nn.Module, n:int=4096)->torch.Tensor:
    "A fixed sample of the model's weights (the same positions every run): enough to compare two runs' weights"
    flat = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
    return flat[torch.randperm(len(flat), generator=torch.Generator().manual_seed(0))[:n]]

class Probe(Callback):
    "Times every training step; measures what this rank holds after the first backward, and after the first step"
    order = 90
    def __init__(self, cuda:bool): self.cuda, self.times, self.state, self.stepped = cuda, [], None, False
    def _sync(self):
        if self.cuda: torch.cuda.synchronize()
    def before_batch(self): self._sync(); self.t = time.perf_counter()
    def after_backward(self):
        if self.state is None: self.state = local_state_bytes(self.learn.model)
    def after_step(self):
        if self.stepped: return
        self.state['optimizer'] = local_state_bytes(self.learn.model, self.learn.opt)['optimizer']
        self.stepped = True
    def after_batch(self): self._sync(); self.times.append(time.perf_counter() - self.t)
    def after_fit(self): self.peak = _peak(self.cuda)

def _peak(cuda:bool)->int:
    "Bytes: the most this process held so far (CPU: resident set; CUDA: tensors allocated on its GPU)"
    return torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss*1024

def worker(args):
    "One configuration on this rank: train, then rank 0 prints `RESULT {json}` with every rank's figures"
    torch.set_num_threads(args.threads)
    cuda = args.device == 'cuda'
    n = (args.warmup + args.steps)*args.batch*args.ranks
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(n, args.hidden, generator=g), torch.randn(n, args.hidden, generator=g)
    model = make_model(args.hidden, args.layers)
    learn = Learner(DataLoaders(DataLoader(TensorDataset(x, y), batch_size=args.batch)), model, F.mse_loss, lr=1e-4)
    learn.progress.enabled = False
    probe = Probe(cuda)
    device = f'cuda:{local_rank_distrib()}' if cuda else 'cpu'
    if cuda:
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats()
    with learn.distrib_ctx(device=device, **CONFIGS[args.worker]):
        learn.fit(1, cbs=probe)
    mine = dict(times=probe.times, peak=probe.peak, peak_exit=_peak(cuda), state=probe.state)
    ranks = gather_object(mine)
    if rank_distrib() == 0:
        times = [max(r['times'][i] for r in ranks) for i in range(len(probe.times))]   # the slowest rank's step
        timed = times[args.warmup:]
        res = dict(steps_per_s=len(timed)/sum(timed), first_step_s=times[0], peak_mib=[r['peak']/MiB for r in ranks],
                   peak_after_exit_mib=[r['peak_exit']/MiB for r in ranks],
                   state_mib=[{k: v/MiB for k, v in r['state'].items()} for r in ranks],
                   params=sum(p.numel() for p in model.parameters()), world_size=num_distrib(),
                   final_loss=learn.recorder.values[-1][0])
        torch.save(sample(learn.model), Path(args.out)/f'{args.worker}.pt')
        print('RESULT ' + json.dumps(res), flush=True)

def run(name:str, args)->dict:
    "Launch configuration `name` on `--ranks` processes; its result"
    cmd = [sys.executable, '-m', 'distrib.launch', '--nproc_per_node', str(args.ranks), __file__, '--worker', name]
    for k in ('device', 'hidden', 'layers', 'steps', 'warmup', 'batch', 'ranks', 'threads', 'out'):
        cmd += [f'--{k}', str(getattr(args, k))]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
    if r.returncode != 0: sys.exit(f"{name} failed (exit code {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}")
    line = next(l for l in r.stdout.splitlines() if l.startswith('RESULT '))
    return json.loads(line[len('RESULT '):])

def table(results:dict, args)->str:
    ref = results.get('ddp')
    rows = [f"DDP vs FSDP on {args.device}, W={args.ranks}, MLP {args.layers} x Linear({args.hidden}, {args.hidden}) = "
            f"{next(iter(results.values()))['params']:,} parameters, batch {args.batch} per rank, "
            f"{args.steps} timed steps",
            f"{'config':>14} {'steps/s':>8} {'first step s':>12} {'peak MiB/rank':>14} {'after exit':>10} "
            f"{'params+grads+opt MiB/rank':>26}"
            f" {'vs ddp':>7} {'max |w - ddp w|':>15}"]
    for name, r in results.items():
        st = max(sum(s.values()) for s in r['state_mib'])
        ratio = st/max(sum(s.values()) for s in ref['state_mib']) if ref else float('nan')
        rows.append(f"{name:>14} {r['steps_per_s']:8.2f} {r['first_step_s']:12.2f} {max(r['peak_mib']):14.0f} "
                    f"{max(r['peak_after_exit_mib']):10.0f} "
                    f"{st:26.1f} {ratio:7.2f} {r.get('max_weight_diff', float('nan')):15.1e}")
    return '\n'.join(rows)

def main(args):
    with tempfile.TemporaryDirectory() as d:
        args.out = d
        results = {name: run(name, args) for name in args.configs.split(',')}
        if 'ddp' in results:
            ref = torch.load(Path(d)/'ddp.pt')
            for name, r in results.items():
                r['max_weight_diff'] = (torch.load(Path(d)/f'{name}.pt') - ref).abs().max().item()
    print(table(results, args))
    print(json.dumps(dict(device=args.device, world_size=args.ranks, hidden=args.hidden, layers=args.layers,
                          batch=args.batch, steps=args.steps, results=results)))

def cuda_ranks(ranks:int|None, # --ranks as given; None: the default
               n_gpus:int,      # GPUs visible
              )->int|None:      # the world size; None: the default cannot run here (fewer than 2 GPUs)
    """The world size of `--device cuda`: NCCL runs one rank per GPU and the strategies need 2 ranks, so the default
    is 2, or None on a machine with one GPU (the caller says so and measures nothing). Raises `ValueError` for an
    explicit `ranks` above `n_gpus`"""
    if ranks is None: return 2 if n_gpus >= 2 else None
    if ranks > n_gpus: raise ValueError(f"--ranks {ranks} with --device cuda needs {ranks} GPUs (NCCL: one per rank); "
                                        f"{n_gpus} visible")
    return ranks

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    p.add_argument('--hidden', type=int, default=4096)
    p.add_argument('--layers', type=int, default=3)
    p.add_argument('--steps', type=int, default=10, help='timed steps, after the warm-up')
    p.add_argument('--warmup', type=int, default=2, help='untimed steps first (compiling happens in the first)')
    p.add_argument('--batch', type=int, default=8, help='samples per rank and step')
    p.add_argument('--ranks', type=int, default=None, help='processes (the world size W); default 2 (cuda: up to 2 GPUs)')
    p.add_argument('--threads', type=int, default=1, help='torch threads per process')
    p.add_argument('--configs', default=','.join(CONFIGS))
    p.add_argument('--timeout', type=float, default=1800, help='seconds per configuration')
    p.add_argument('--worker', help=argparse.SUPPRESS)
    p.add_argument('--out', help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.device == 'cuda':
        if not torch.cuda.is_available():
            print(f"bench/strategies.py: --device cuda needs a CUDA GPU, and torch {torch.__version__} sees none here "
                  "(torch.cuda.is_available() is False); run it on a GPU machine, or without --device cuda", file=sys.stderr)
            sys.exit(2)
        n = torch.cuda.device_count()
        try: ranks = cuda_ranks(args.ranks, n)
        except ValueError as e: p.error(str(e))
        if ranks is None and not args.worker:
            print(f"bench/strategies.py: --device cuda compares DDP with FSDP on 2 ranks, one GPU each (NCCL), and {n} "
                  "GPU is visible here: nothing to measure (bench/overhead.py --device cuda runs on one GPU)",
                  file=sys.stderr)
            sys.exit(0)
        args.ranks = ranks
    if args.ranks is None: args.ranks = 2
    if args.ranks < 2 and not args.worker:
        p.error(f"--ranks {args.ranks}: one process trains without DDP or FSDP (distrib_ctx in a world of one), so the "
                "configurations would not differ; the strategies need 2 ranks (with --device cuda, 2 GPUs)")
    worker(args) if args.worker else main(args)
