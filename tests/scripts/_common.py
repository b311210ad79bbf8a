"""What the launched check scripts share: `check`, which prints the line a test looks for, and the differences they
measure (`diff`, `rel`). A script of tests/scripts imports them with `from _common import check, rel`: its own folder
is first on `sys.path` however it runs (`python script.py` puts it there, under distrib.launch or alone, and so do
`tests/forked.py` and together.py, itself a script of this folder)."""
import math, sys
import torch
from distrib import gather_object, rank_distrib

def say(line:str):
    "Print `line` in one write, so the ranks' lines, on the same pipe, never interleave within a line"
    sys.stdout.write(line + '\n'); sys.stdout.flush()

def check(name:str, cond, figures='', every_rank:bool=False):
    """Raise `AssertionError` naming check `name`, the rank and `figures` unless `cond`; then rank 0 prints
    'CHECK <name> OK <figures>', the line the tests look for (`conftest.checked`). With `every_rank`, the ranks'
    conditions are gathered first (`gather_object`: every rank must call it), so that every rank fails alike, naming
    the ranks where `cond` was false."""
    rank = rank_distrib()
    if every_rank:
        oks = gather_object(bool(cond))
        assert all(oks), f'{name} failed on ranks {[r for r, o in enumerate(oks) if not o]}: {figures}'
    else: assert cond, f'rank {rank}: {name} failed: {figures}'
    if rank == 0: say(f'CHECK {name} OK {figures}')

def diff(a, b)->float:
    """Largest absolute difference of `a` and `b` (tensors, numbers or nested lists), in float64; inf when their
    shapes differ, 0 when both are empty"""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if a.shape != b.shape: return math.inf
    return (a - b).abs().max().item() if a.numel() else 0.

def rel(a, b)->float:
    """Largest absolute difference of `a` and `b` relative to the largest magnitude of `b` (at least 1e-12), in
    float64; inf when their shapes differ, 0 when both are empty"""
    d = diff(a, b)
    return d if d in (0., math.inf) else d / torch.as_tensor(b, dtype=torch.float64).abs().max().clamp_min(1e-12).item()

def check_all(name:str, cond, figures=''):
    "`check(name, cond, figures, every_rank=True)`: every rank must call it"
    check(name, cond, figures, every_rank=True)
