"""Fails on the first attempt, succeeds on the second (with `--max_restarts 1`): prints `attempt <n> rank <r> threads
<OMP_NUM_THREADS>`; rank 1 of attempt 0 exits with code 3."""
import os, sys
attempt, rank = os.environ['TORCHELASTIC_RESTART_COUNT'], os.environ['RANK']
print(f"attempt {attempt} rank {rank} threads {os.environ.get('OMP_NUM_THREADS')}", flush=True)
if attempt == '0' and rank == '1': sys.exit(3)
