"""fastai.distributed against distrib.fastai on CPU, 2 processes, gloo: the figures of the docs page "fastai's
Learner" (nbs/44_fastai.ipynb). Runs tests/scripts/fastai_job.py's `fit` case (2 epochs of Adam, batch 8 per rank;
the reference: fastai alone in one process with batch 16) under each library, then a CancelFitException on rank 1
alone under each, and prints one line per measure.
Usage: python bench/fastai_distributed.py   (in a venv with fastai 2.8: pip install -e ".[fastai]"; fastai.distributed
also needs Hugging Face's accelerate, which fastai imports from it: pip install accelerate)"""
import importlib.util, json, os, subprocess, sys, tempfile, time
from pathlib import Path
import torch
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT/'tests'/'scripts'))
import fastai_job as job   # noqa: the cases

# fastai.distributed as shipped calls .cuda() in DistributedDL._broadcast: on CPU, its rank 0's indices are broadcast
# through a CPU tensor instead (the smallest change that lets it run); `distrib_ctx(cpu=True)` skips its .cuda() model
RUN_FASTAI = """
import sys, json, time, torch
sys.path.insert(0, {scripts!r})
import fastai_job as job
from fastai.distributed import *
from fastai.distributed import DistributedDL
def _broadcast(self, t, rank):
    t = torch.LongTensor(t); torch.distributed.broadcast(t, rank); return t.tolist()
DistributedDL._broadcast = _broadcast
learn, out = job.learner(job.B), {{}}
try:
    with learn.distrib_ctx(cpu=True):
        learn.fit(2, 1e-2, cbs=[job.CancelOn(1)] if {cancel} else None)
        out['values'] = [[float(v) for v in r] for r in learn.recorder.values]
        out['weights'] = torch.cat([p.detach().flatten() for p in learn.model.parameters()]).tolist()
        try:
            p, t = learn.get_preds(); out['targs'] = t.tolist()
        except Exception as e: out['get_preds'] = f"{{type(e).__name__}}: {{e}}"
        out['timing'] = job.timed_fit(learn)   # per step of the fit (after it, fastai.distributed's dls.train is
                                               # the unsharded loader again: its len is not the steps taken)
finally: pass
import os
if os.environ['RANK'] == '0': open({path!r}, 'w').write(json.dumps(out))
"""

def launch(code:str, timeout:float)->tuple:
    "Run `code` on 2 processes under torchrun; (seconds, return code or None after `timeout`, output tail)"
    with tempfile.NamedTemporaryFile('w', suffix='.py', delete=False) as f: f.write(code)
    t0 = time.time()
    p = subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2', f.name],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try: out, rc = p.communicate(timeout=timeout)[0], p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9); out, rc = p.communicate()[0], None
    return time.time() - t0, rc, out

def diff(a, b)->float: return (torch.tensor(a, dtype=torch.float64) - torch.tensor(b, dtype=torch.float64)).abs().max().item()

if __name__ == '__main__':
    if importlib.util.find_spec('accelerate') is None:
        sys.exit("fastai.distributed imports accelerate's Accelerator, which this environment lacks: pip install accelerate")
    ref = job.run_case('fit', 2*job.B)
    d = tempfile.mkdtemp()
    secs, rc, out = launch(RUN_FASTAI.format(scripts=str(ROOT/'tests'/'scripts'), cancel=False, path=f'{d}/fa.json'), 300)
    fa = json.loads(Path(f'{d}/fa.json').read_text()) if rc == 0 else None
    r = subprocess.run([sys.executable, '-m', 'distrib.launch', '--nproc_per_node', '2',
                        ROOT/'tests'/'scripts'/'fastai_job.py', f'{d}/di.json', 'fit', 'timing'], capture_output=True,
                       text=True, timeout=300)
    res = json.loads(Path(f'{d}/di.json').read_text())
    di = res['fit']
    nan = dict.fromkeys(('step_ms', 'train_ms', 'main_cpu_ms', 'process_cpu_ms'), float('nan'))
    ft, dt = fa['timing'] if fa else nan, res['timing']
    print(f"ms per training step (2 processes x 8, 20 epochs of 6 steps and one validation each, a 200-parameter "
          f"model: the loop's own cost; fastai.distributed, distrib.fastai): with its share of the validations "
          f"{ft['step_ms']:.2f}, {dt['step_ms']:.2f}; the training passes alone {ft['train_ms']:.2f}, "
          f"{dt['train_ms']:.2f}; CPU of rank 0's main thread {ft['main_cpu_ms']:.2f}, {dt['main_cpu_ms']:.2f}, "
          f"of its process (gloo's threads too) {ft['process_cpu_ms']:.2f}, {dt['process_cpu_ms']:.2f}")
    for name, res in (('fastai.distributed', fa), ('distrib.fastai', di)):
        if res is None: print(f"{name}: did not run (exit code {rc}): {out[-300:]}"); continue
        acc = [v[2] for v in res['values']]
        print(f"{name}: weights vs 1 process x 16: {diff(res['weights'], ref['weights']):.1e}; valid values: "
              f"{diff(res['values'], ref['values']):.1e} (accuracy {acc[-1]:.4f}, 1 process {ref['values'][-1][2]:.4f}); "
              f"get_preds: {res.get('get_preds') or str(len(res['targs'])) + ' items'} of {job.N_VALID}, targets "
              f"{'in' if res.get('targs') == ref['targs'] else 'NOT in'} dataset order")
    secs, rc, out = launch(RUN_FASTAI.format(scripts=str(ROOT/'tests'/'scripts'), cancel=True, path=f'{d}/x.json'), 120)
    err = [l for l in out.splitlines() if 'Error' in l][-1:] or ['']
    print(f"fastai.distributed, CancelFitException on rank 1: "
          + (f"still running after {secs:.0f} s (killed)" if rc is None else f"ended in {secs:.0f} s, exit code {rc}")
          + f"; last error line: {err[0].strip()[:200]}")
    t0 = time.time()
    r = subprocess.run([sys.executable, '-m', 'distrib.launch', '--nproc_per_node', '2',
                        ROOT/'tests'/'scripts'/'fastai_job.py', '/dev/null', 'cancel_one'], capture_output=True,
                       text=True, timeout=300)
    cancel = [float(l.split()[-1]) for l in (r.stdout + r.stderr).splitlines() if l.startswith('CANCEL rank 1 at')]
    print(f"distrib.fastai, CancelFitException on rank 1: job ended {time.time() - cancel[0]:.1f} s after the cancel, "
          f"exit code {r.returncode}, naming rank 1: {'raised on rank 1' in r.stdout + r.stderr}")
