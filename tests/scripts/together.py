"""Several check scripts in one job, one after another in the same processes (each process of a job imports torch
and builds DDP once: about 3 s of CPU saved per script and rank).
Run: python -m distrib.launch --nproc_per_node W tests/scripts/together.py OUT a.py [b.py ...]
Each script runs as `python a.py OUT/a` would: `__main__`, its own argv, the random states a new process starts
with, its warnings filters undone after it. What it prints (stdout and stderr) goes to OUT/a.w<W>.<rank>.txt; a
script that raises has its traceback and a last line 'SCRIPT FAILED' there, and the next one still runs; the exit
code is 1 when any failed."""
import contextlib, os, random, runpy, sys, time, traceback, warnings
from pathlib import Path
import torch

out, scripts = Path(sys.argv[1]), sys.argv[2:]
rank, world = os.environ['RANK'], os.environ['WORLD_SIZE']
fresh = torch.random.get_rng_state(), random.getstate()
failed, took = [], []
for script in scripts:
    name = Path(script).stem
    (out/name).mkdir(parents=True, exist_ok=True)
    torch.random.set_rng_state(fresh[0])
    random.setstate(fresh[1])
    log = open(out/f'{name}.w{world}.{rank}.txt', 'w')
    start = time.perf_counter(), time.process_time()
    with log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), warnings.catch_warnings():
        sys.argv = [script, str(out/name)]
        try: runpy.run_path(script, run_name='__main__')
        except SystemExit as e:
            if e.code not in (None, 0): failed.append(name); print(f'sys.exit({e.code!r})\nSCRIPT FAILED')
        except Exception:
            failed.append(name)
            traceback.print_exc()
            print('SCRIPT FAILED')
    took.append(f'{name} {time.perf_counter() - start[0]:.1f}/{time.process_time() - start[1]:.1f}')
print(f'rank {rank}: {len(scripts) - len(failed)} of {len(scripts)} scripts passed' +
      (f'; failed: {", ".join(failed)}' if failed else '') + f'; seconds (wall/CPU): {", ".join(took)}')
sys.exit(1 if failed else 0)
