"""What fastai's MixUp costs per training step under distrib.fastai, whose draws pair items across ranks (one exchange
of a batch with one rank per step), on CPU, 2 processes, gloo: the figures of the docs page "fastai's Learner"
(nbs/44_fastai.ipynb, "MixUp and CutMix over the global batch"). Runs tests/scripts/fastai_job.py's model and data
(batch 8 per rank) under `distrib_ctx`, and times, alternated, `fit` without MixUp, with fastai's MixUp (distrib's
draws and exchange) and with a MixUp subclass that keeps fastai's own `before_batch` (each rank mixes within its own
batch: no exchange); then the draws alone and the exchange alone (a batch like the test's and a batch of 64 images
of 3 x 32 x 32), and a rank's draws and plan per step at world sizes up to 16,384; prints one line per measure
(medians).
Usage: python bench/fastai_mixup.py   (in a venv with fastai 2.8: pip install -e ".[fastai]")"""
import os, subprocess, sys, tempfile
from pathlib import Path
ROOT = Path(__file__).resolve().parent.parent

RUN = r"""
import sys, time, statistics, warnings, torch, numpy as np
sys.path.insert(0, {scripts!r})
import fastai_job as job
from fastai.callback.mixup import MixUp
from distrib.fastai import *
from distrib.fastai import mixup as df
class LocalMixUp(MixUp):
    "fastai's MixUp as it is on each rank (its own draws, within the rank's batch)"
    def before_batch(self): super().before_batch()
warnings.simplefilter('ignore')
rank = int(__import__('os').environ['RANK'])
learn = job.learner(job.B); learn.logger = lambda *a: None   # no table per fit
times = {{'no MixUp': [], 'MixUp, distrib (exchange)': [], 'MixUp, per rank (fastai, no exchange)': []}}
with learn.distrib_ctx():
    learn.fit(1, 1e-2, cbs=MixUp(.4))
    n = len(learn.dls.train)
    for rep in range(5):
        for k, cbs in zip(times, (None, MixUp(.4), LocalMixUp(.4))):
            t0 = time.perf_counter(); learn.fit(6, 1e-2, cbs=cbs)
            times[k].append((time.perf_counter() - t0) * 1000 / (6 * n))
    for k, v in times.items():
        rank or print(f"{{k}}: {{statistics.median(v):.2f}} ms per step (fit, validation included)")
    # the draws alone, per step: B weights and the pairing (a few draws)
    B, t = job.B, []
    for s in range(2000):
        t0 = time.perf_counter()
        df._beta_lams(.4, .4, 0, s, np.arange(B)*2 + rank); df._mix_pairing(0, s, 2*B)
        t.append(time.perf_counter() - t0)
    rank or print(f"draws (B={{B}} weights, the pairing): {{statistics.median(t)*1e6:.0f}} us per step")
    for name, shape in (('a batch of 8 x 8 floats and 8 targets', (8, 8)),
                        ('64 images of 3 x 32 x 32 and 64 targets', (64, 3, 32, 32))):
        x, y = torch.randn(*shape), torch.zeros(shape[0], dtype=torch.long)
        t = []
        for s in range(300):
            torch.distributed.barrier()
            t0 = time.perf_counter(); df._exchange_rows([x, y], 1 - rank, 1 - rank); t.append(time.perf_counter() - t0)
        rank or print(f"exchange of {{name}}: {{statistics.median(t)*1e6:.0f}} us")
"""

def per_rank_work():
    """A rank's draws and plan per step (the pairing, who sends what, B weights), at world sizes up to 16,384 (the
    last rank's; the other ranks need not exist for it): flat in the world size"""
    import time
    import numpy as np
    from distrib.fastai import mixup as df
    for W in (2, 64, 16384):
        for B in (8, 256):
            n, r, t0 = W*B, W - 1, time.perf_counter()
            for s in range(300):
                a, sh = df._mix_pairing(0, s, n)
                df._mix_plan(a, sh, n, r, W); df._beta_lams(.4, .4, 0, s, np.arange(B)*W + r)
            print(f"a rank's draws and plan, W = {W}, B = {B}: {(time.perf_counter() - t0)/300*1e6:.0f} us per step")

if __name__ == '__main__':
    per_rank_work()
    with tempfile.NamedTemporaryFile('w', suffix='.py', delete=False) as f:
        f.write(RUN.format(scripts=str(ROOT/'tests'/'scripts')))
    r = subprocess.run([sys.executable, '-m', 'distrib.launch', '--nproc_per_node', '2', f.name], capture_output=True,
                       text=True, timeout=600, env={**os.environ, 'PYTHONPATH': str(ROOT)})
    os.unlink(f.name)
    print(r.stdout[-3000:] if r.returncode == 0 else r.stdout[-3000:] + r.stderr[-5000:])
