"""Rank 1 ends with exit code 0 by `os._exit(0)` (no exit handler runs, no goodbye) at PLACE: `python -m
distrib.launch early_exit.py PLACE`. PLACE: `top` (the script's first line, before `import distrib`), `import` (after
`import distrib`, before any distrib call), `collective` (after the process group is formed, as rank 0 enters its
first all-reduce). Rank 1 prints `FAULT_AT <time.time()>` just before it exits. `EARLY_TIMEOUT`: the process group's
timeout (default 120 s: far longer than the tests allow)."""
import os, sys, time
place, rank = sys.argv[1], int(os.environ['RANK'])

def leave():
    print(f"FAULT_AT {time.time()}", flush=True)
    os._exit(0)

if place == 'top' and rank == 1: leave()
import torch
from distrib import setup_distrib, all_reduce_sum
if place == 'import' and rank == 1: leave()
setup_distrib(timeout=float(os.environ.get('EARLY_TIMEOUT', 120)))  # rank 0 waits here for rank 1 (top, import)
if place == 'collective' and rank == 1: leave()
all_reduce_sum(torch.ones(1))
print(f"rank {rank} finished: the fault did not happen", flush=True)
