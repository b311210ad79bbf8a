"""Under 2 processes: the Recorder's per-step records against one process with the global batch, fastai's plots on
rank 0 only, and the experiment trackers (W&B offline, MLflow's file store): one run each for the job, holding every
epoch, continued by a restart that resumes from a Checkpoint (a new Learner with new callbacks in the same
processes, reading the checkpoint as a restarted job does). Rank 0 prints one 'CHECK <name> OK <figures>' line per
check. Usage: trackers.py <scratch dir shared by the ranks>"""
import os, sys, time
from pathlib import Path
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from distrib import (Learner, DataLoaders, Checkpoint, WandbCallback, MLflowCallback, offline_history, accuracy,
                     rank_distrib, num_distrib, setup_distrib, gather_object, distrib_barrier)
from _common import check, diff

N, BS, LR = 48, 6, 0.05          # 2 ranks x 6 = global batches of 12; 4 steps an epoch
SCRATCH = Path(sys.argv[1])
os.environ.update(WANDB_MODE='offline', WANDB_SILENT='true', MLFLOW_ALLOW_FILE_STORE='true',   # W&B's caches too:
                  **{f'WANDB_{k}_DIR': str(SCRATCH/f'wandb-{k.lower()}') for k in ('CACHE', 'DATA', 'CONFIG')})
torch.manual_seed(0)
x = torch.randn(N, 5); y = (x @ torch.randn(5, 1) > 0).long().squeeze(1)
init = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2)).state_dict()

def new_learner(bs, cbs=None, independent=False, path='.'):
    m = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2)); m.load_state_dict(init)
    dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=bs), DataLoader(TensorDataset(x, y), batch_size=bs))
    learn = Learner(dls, m, nn.functional.cross_entropy, lr=LR, cbs=cbs, independent=independent, path=path,
                    metrics=accuracy)
    learn.progress.enabled = False
    return learn


setup_distrib(timeout=60)
assert num_distrib() == 2
rank = rank_distrib()
lazy = [m for m in sys.modules if m.split('.')[0] in ('wandb', 'mlflow')]   # distrib imported, no tracker created
check('trackers_imported_lazily', not lazy, f'imported: {lazy[:3]}')

# 1. per-step records: the global batch's loss, as one process with batches of 12; the same on both ranks
a = new_learner(BS)
with a.distrib_ctx(timeout=60): a.fit_one_cycle(3)
r = new_learner(2*BS, independent=True); r.fit_one_cycle(3)
ra, rr = a.recorder, r.recorder
err = max(diff(ra.step_losses, rr.step_losses), diff(ra.losses, rr.losses))
same = gather_object((ra.step_losses, ra.losses, ra.lrs, ra.iters))
check('recorder_steps_global_batch', len(ra.step_losses) == 12 and ra.iters == [4, 8, 12] and err <= 1e-6
      and same[0] == same[1] and diff(ra.hps['lr'], rr.hps['lr']) <= 1e-12, f'steps=12 max_abs_diff={err:.1e}')

# 2. plots: rank 0 draws and saves, rank 1 draws nothing
import matplotlib; matplotlib.use('Agg')
import matplotlib.pyplot as plt
png = SCRATCH/'plot_loss.png'
ax = ra.plot_loss(skip_start=2)
if ax is not None: ax.figure.savefig(png)
axs, maxs = ra.plot_sched(), ra.plot_metrics()
drawn = gather_object((ax is not None, axs is not None, maxs is not None, len(plt.get_fignums())))
distrib_barrier()
check('plots_rank0_only', drawn == [(True, True, True, 3), (False, False, False, 0)] and png.stat().st_size > 5000
      and png.read_bytes()[:4] == b'\x89PNG', f'per rank: {drawn}, {png.name} {png.stat().st_size} bytes')
plt.close('all')

# 3. trackers: a job of 2 epochs, then a restart resuming from its checkpoint for a third: one run each
def tracked_fit(n_epoch, log_model=False):
    wb = WandbCallback(project='distrib-test', dir=SCRATCH/'wb', log_model=log_model)
    mf = MLflowCallback(f'file:{SCRATCH}/mlruns', experiment_name='test', log_model=log_model)
    learn = new_learner(BS, cbs=[wb, mf, Checkpoint(SCRATCH/'ck')])
    with learn.distrib_ctx(timeout=60): learn.fit(n_epoch)
    return learn, wb, mf
_, wb1, mf1 = tracked_fit(2)
learn, wb, mf = tracked_fit(3, log_model=True)
keys = gather_object((wb1.run_key, wb.run_key, mf1.run_id, mf.run_id, wb.run is None))
if rank == 0:
    vals = learn.recorder.values
    for _ in range(100):   # W&B's service may still be writing a run's file when finish() has returned
        runs = [offline_history(p) for p in sorted((SCRATCH/'wb'/'wandb').glob('offline-run-*'))]
        if all(run['id'] for run in runs): break
        time.sleep(0.2)
    rows = [row for run in runs for row in run['history']]
    epochs = [(row['epoch'], row['valid_loss'], row['accuracy']) for row in rows if 'epoch' in row]
    check('wandb_one_run_resumed', len(runs) == 2 and {run['id'] for run in runs} == {wb.run_key}
          and [row['_step'] for row in rows] == list(range(1, 13)) and [e[0] for e in epochs] == [0, 1, 2]
          and diff([e[1:] for e in epochs], [v[1:] for v in vals]) <= 1e-12
          and runs[0]['config']['world_size'] == 2 and runs[0]['config']['global_batch'] == 12
          and runs[1]['artifacts'] == [('model', 'model')], f'runs={[run["id"] for run in runs]} steps={len(rows)}')
    c = mf.MlflowClient(f'file:{SCRATCH}/mlruns')
    found = c.search_runs([c.get_experiment_by_name('test').experiment_id])
    hist = {k: sorted((m.step, m.value) for m in c.get_metric_history(mf.run_id, k)) for k in ('epoch', 'valid_loss', 'raw_loss')}
    check('mlflow_one_run_resumed', len(found) == 1 and found[0].info.run_id == mf.run_id
          and found[0].info.status == 'FINISHED' and hist['epoch'] == [(4, 0), (8, 1), (12, 2)]
          and diff([v for _, v in hist['valid_loss']], [v[1] for v in vals]) <= 1e-12
          and [s for s, _ in hist['raw_loss']] == list(range(1, 13)) and found[0].data.params['world_size'] == '2'
          and [f.path for f in c.list_artifacts(mf.run_id, 'model')] == ['model/model.pth'],
          f'runs={len(found)} epochs={len(hist["epoch"])}')
check('trackers_rank0_writes', keys[0][:4] == keys[0][:1]*2 + keys[0][2:3]*2 and keys[1][2:] == (None, None, True),
      f'wandb id {keys[0][0]}, mlflow id {keys[0][2]}')
