"""notebook_launch after CUDA was used (issue 34, item 8): `python tests/scripts/nb_cuda.py` (a fresh process, on a
machine with a GPU) calls `torch.cuda.is_available()`, as a notebook's first cell does, then: distrib sees that a
forked child could not use CUDA; a function defined in `__main__` gets the ValueError that says so; `notebook_launch`
of an importable function chooses spawn and its workers train on their GPUs. Prints 'CHECK <name> OK' per check."""
import os, sys
import torch

def train()->str:
    "A worker: one epoch under distrib_ctx; the device the model trained on"
    from torch import nn
    from torch.nn import functional as F
    from torch.utils.data import DataLoader, TensorDataset
    from distrib import Learner, DataLoaders
    x = torch.randn(64, 8); y = x.sum(1, keepdim=True)
    learn = Learner(DataLoaders(DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)), nn.Linear(8, 1),
                    F.mse_loss)
    learn.progress.enabled = False
    with learn.distrib_ctx(): learn.fit(1)
    return str(next(learn.model.parameters()).device)

if __name__ == '__main__':
    from distrib import notebook_launch
    from distrib.launch.notebook import _cuda_blocks_fork
    assert torch.cuda.is_available() and not torch.cuda.is_initialized()   # CUDA used, not initialised by torch
    assert _cuda_blocks_fork(), "is_available() was called, yet a forked child is not in torch's bad-fork state"
    print('CHECK cuda_blocks_fork OK', flush=True)
    def local(): return 1   # defined in __main__, as in a notebook's cell
    try: notebook_launch(local, nprocs=1, timeout=60); raise AssertionError('a __main__ function was launched')
    except ValueError as e: assert 'CUDA was used in this process already' in str(e), e
    print('CHECK notebook_fn_refused OK', flush=True)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from nb_cuda import train as importable   # what spawn needs: the workers import it
    device = notebook_launch(importable, nprocs=min(2, torch.cuda.device_count()), timeout=300)
    assert device == 'cuda:0', device
    print('CHECK notebook_launch_after_cuda OK', flush=True)
