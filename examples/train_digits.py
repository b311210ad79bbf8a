"""Train a small network on scikit-learn's digits (1,797 8x8 images, bundled: no download) on several processes.

    python -m distrib.launch --nproc_per_node 2 examples/train_digits.py   # 2 processes (gloo on CPU, NCCL on GPUs)
    python examples/train_digits.py                                        # the same script, one process
    srun -n 2 python examples/train_digits.py                              # Slurm (see examples/slurm/)
    mpirun -n 2 python examples/train_digits.py                            # Open MPI or MPICH

Rank 0 prepares the data first (`rank0_first`) and caches it; the other ranks read the cache. `distrib_ctx`
trains with DistributedDataParallel, each rank on its shard of every epoch; rank 0 prints the epoch table.

Every rank runs the whole script: what should happen once (a print, a file) goes under `if rank_distrib() == 0`.
With W processes, each step trains on W batches of `--bs` (the global batch is W * bs), so an epoch has W times
fewer steps. `--scale lr` multiplies the learning rate by W (the linear scaling rule of Goyal et al., 2017,
"Accurate, Large Minibatch SGD"); `--scale epochs` multiplies the epochs by W (the steps of one process, W times
the samples).
"""
import argparse, os, time
from pathlib import Path
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from distrib import Learner, DataLoaders, accuracy, rank0_first, rank_distrib, num_distrib

def prepare_digits(cache:Path)->dict:
    "Load digits, scale pixels to [0, 1], split 80/20 with a fixed seed; cached in `cache` (written atomically)"
    if not cache.exists():
        from sklearn.datasets import load_digits
        x, y = load_digits(return_X_y=True)
        x = torch.tensor(x, dtype=torch.float32) / 16.  # pixel values are 0..16
        y = torch.tensor(y, dtype=torch.long)
        perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(42))
        n_valid = len(x) // 5
        data = dict(x_train=x[perm[n_valid:]], y_train=y[perm[n_valid:]], x_valid=x[perm[:n_valid]], y_valid=y[perm[:n_valid]])
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f'.tmp{os.getpid()}')
        torch.save(data, tmp)
        os.replace(tmp, cache)
    return torch.load(cache)

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--epochs', type=int, default=12)
    p.add_argument('--bs', type=int, default=32, help='batch size per process (global batch: bs * world size)')
    p.add_argument('--lr', type=float, default=1e-2)
    p.add_argument('--data', type=Path, default=Path('data/digits.pt'), help='cache file for the prepared data')
    p.add_argument('--scale', choices=('none', 'lr', 'epochs'), default='none',
                   help='multiply the learning rate, or the epochs, by the world size (default: neither)')
    args = p.parse_args()
    w = num_distrib()
    lr, epochs = args.lr * (w if args.scale == 'lr' else 1), args.epochs * (w if args.scale == 'epochs' else 1)
    start = time.perf_counter()
    d = rank0_first(prepare_digits, args.data)  # rank 0 first, then the others (who find the cache)
    dls = DataLoaders(DataLoader(TensorDataset(d['x_train'], d['y_train']), batch_size=args.bs, shuffle=True),
                      DataLoader(TensorDataset(d['x_valid'], d['y_valid']), batch_size=2*args.bs))
    torch.manual_seed(0)  # DDP starts every rank from rank 0's weights anyway
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    learn = Learner(dls, model, nn.functional.cross_entropy, lr=lr, metrics=accuracy)
    with learn.distrib_ctx():
        learn.fit(epochs)
    valid_loss, acc = learn.recorder.values[-1][1:]
    if rank_distrib() == 0:  # every rank runs the whole script: print once
        print(f"world size {w}: lr {lr:g}, {epochs} epochs, global batch {w*args.bs}: valid accuracy {acc:.4f}, "
              f"valid loss {valid_loss:.4f}, {time.perf_counter()-start:.1f}s")

if __name__ == '__main__': main()
