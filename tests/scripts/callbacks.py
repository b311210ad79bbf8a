"""Under 2 processes, the callbacks of schedule, lr_find, tracker, loggers and clip against the same run in one
process with the global batch (an `independent=True` Learner on each rank, batches of 12 = 2 ranks x 6), and the
one-rank NaN case. Rank 0 prints one 'CHECK <name> OK <figures>' line per check (or 'CHECK <name> SKIP <why>').
Usage: callbacks.py <scratch dir shared by the ranks>"""
import csv, math, sys
from functools import partial
from pathlib import Path
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from distrib import (Learner, DataLoaders, Callback, GradientAccumulation, MixedPrecision, ParamScheduler, SchedLin,
                     TerminateOnNaNCallback, EarlyStoppingCallback, CSVLogger, GradientClip, valley, minimum, steep,
                     rank_distrib, num_distrib, setup_distrib, gather_object)
from _common import say, check, diff, rel

N, BS, LR = 48, 6, 0.05          # 2 ranks x 6 = global batches of 12; 4 steps an epoch
SCRATCH = Path(sys.argv[1])
torch.manual_seed(0)
x = torch.randn(N, 5); y = x @ torch.randn(5, 1) + 0.1*torch.randn(N, 1)
init = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1)).state_dict()

def new_learner(bs, cbs=None, independent=False, opt_func=torch.optim.Adam, lr=LR, path='.'):
    "Same data, order (no shuffle: rank r of 2 reads positions r::2, the global batch is 12 consecutive samples)"
    m = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1)); m.load_state_dict(init)
    dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=bs), DataLoader(TensorDataset(x, y), batch_size=bs))
    learn = Learner(dls, m, nn.functional.mse_loss, opt_func=opt_func, lr=lr, cbs=cbs, independent=independent,
                    path=path)
    learn.progress.enabled = False
    return learn

def ddp(fit, cbs=None, bs=BS, **kw):
    "A Learner trained by `fit(learn)` under distrib_ctx"
    learn = new_learner(bs, cbs, **kw)
    with learn.distrib_ctx(timeout=60): fit(learn)
    return learn

def ref(fit, cbs=None, bs=2*BS, **kw):
    "The same run in this process alone, with the global batch"
    learn = new_learner(bs, cbs, independent=True, **kw)
    fit(learn)
    return learn

def flat(learn): return torch.cat([p.detach().flatten() for p in learn.model.parameters()])
def same_on_ranks(o): return all(v == o for v in gather_object(o))
def vals(learn): return torch.tensor(learn.recorder.values, dtype=torch.float64)


def one_cycle(pos, top, div=25., div_final=1e5, pct=0.25):
    "fastai's one-cycle curve from its formula: start + (1 + cos(pi*(1-p)))*(end-start)/2 on each phase"
    cos = lambda s, e, p: s + (1 + math.cos(math.pi*(1 - p)))*(e - s)/2
    return cos(top/div, top, pos/pct) if pos < pct else cos(top, top/div_final, (pos - pct)/(1 - pct))

setup_distrib(timeout=60)
assert num_distrib() == 2

# 6. schedules: fit_one_cycle under DDP, with and without accumulation, against one process; fastai's curve
fit = lambda l: l.fit_one_cycle(3)
a, r = ddp(fit), ref(fit)
lrs = a.recorder.hps['lr']
curve = [one_cycle(k/12, LR) for k in range(12)]
check('one_cycle_weights', diff(flat(a), flat(r)) <= 1e-6, f'max_abs_diff={diff(flat(a), flat(r)):.1e}')
check('one_cycle_lrs', len(lrs) == 12 and diff(lrs, curve) <= 1e-12 and same_on_ranks(lrs)
      and lrs == r.recorder.hps['lr'] and diff(a.recorder.hps['mom'], r.recorder.hps['mom']) == 0, f'steps={len(lrs)}')
check('one_cycle_values', rel(vals(a), vals(r)) <= 1e-6, f'max_rel_err={rel(vals(a), vals(r)):.1e}')
g = ddp(fit, cbs=GradientAccumulation(12), bs=3)   # micro-batches of 3 per rank, a step every 12 samples
check('one_cycle_accumulate', g.recorder.hps['lr'] == lrs and diff(flat(g), flat(r)) <= 1e-6,
      f'steps={len(g.recorder.hps["lr"])} max_abs_diff={diff(flat(g), flat(r)):.1e}')
fit = lambda l: l.fit_flat_cos(2, 0.02)
a, r = ddp(fit), ref(fit)
check('flat_cos', a.recorder.hps['lr'] == r.recorder.hps['lr'] and a.recorder.hps['lr'][:6] == [0.02]*6
      and diff(flat(a), flat(r)) <= 1e-6, f'max_abs_diff={diff(flat(a), flat(r)):.1e}')

# a float16 scaler that starts too high skips its first steps; the schedule still moves once per step due
class Skips(Callback):
    order = 20
    def before_fit(self): self.taken = 0
    def after_step(self): self.taken += 1
    def after_cancel_step(self): self.taken -= 1
fit = lambda l: l.fit(2, cbs=ParamScheduler({'lr': SchedLin(0.05, 0.)}))
a = ddp(fit, cbs=[MixedPrecision('fp16', init_scale=2.**20), Skips()])
lrs, skipped = a.recorder.hps['lr'], 8 - a.skips.taken
check('schedule_counts_skipped_steps', skipped > 0 and diff(lrs, [0.05*(1 - k/8) for k in range(8)]) <= 1e-12
      and same_on_ranks((lrs, skipped)) and same_on_ranks(flat(a).tolist()), f'skipped={skipped} of 8')

# 7. lr_find: the same curve, stop and suggestion on every rank, those of one process; weights restored
funcs = (valley, minimum, steep)
find = lambda l: l.__setattr__('found', l.lr_find(1e-4, 10, num_it=40, show_plot=False, suggest_funcs=funcs))
sgd = partial(torch.optim.SGD, momentum=0.9)
a, r = ddp(find, opt_func=sgd), ref(find, opt_func=sgd)
curve = (a.recorder.lrs, a.recorder.losses)
check('lr_find_same_on_ranks', same_on_ranks((tuple(a.found), curve)), f'{a.found} steps={len(a.recorder.lrs)}')
loss_err = rel(a.recorder.losses[:20], r.recorder.losses[:20])
check('lr_find_one_process', tuple(a.found) == tuple(r.found) and len(a.recorder.lrs) == len(r.recorder.lrs)
      and loss_err <= 1e-6, f'steps={len(a.recorder.lrs)}/{len(r.recorder.lrs)} loss_rel_err={loss_err:.1e}')
init_flat = torch.cat([v.flatten() for v in init.values()])   # state_dict order is parameters() order here
check('lr_find_restores', torch.equal(flat(a), init_flat) and a.opt.param_groups[0]['lr'] == LR)

# lr_find plots on rank 0 only, when matplotlib is installed
try:
    import matplotlib; matplotlib.use('Agg')
    import matplotlib.pyplot as plt
except ImportError as e:
    if rank_distrib() == 0: say(f'CHECK lr_find_plot_rank0 SKIP matplotlib is not installed ({e})')
else:
    plt.close('all')
    a = ddp(lambda l: l.lr_find(1e-4, 10, num_it=40), opt_func=sgd)
    figs = gather_object(len(plt.get_fignums()))
    check('lr_find_plot_rank0', figs == [1, 0], f'figures per rank: {figs}')

# 8. GradientClip: the global gradient, once per step; with accumulation and with a float16 scaler
class Norms(Callback):
    "The norm the optimizer sees (after clipping) and the one GradientClip measured (before), at each step"
    order = 20
    def before_fit(self): self.norms, self.pre = [], []
    def before_step(self):
        self.norms.append(torch.cat([p.grad.flatten() for p in self.learn.model.parameters()]).norm().item())
        self.pre.append(self.learn.gradient_clip.norm.item())
fit = lambda l: l.fit(2)
opt = partial(torch.optim.SGD, momentum=0.9)
a = ddp(fit, cbs=[GradientClip(0.5), Norms()], opt_func=opt)
r = ref(fit, cbs=[GradientClip(0.5), Norms()], opt_func=opt)
check('clip_weights', diff(flat(a), flat(r)) <= 1e-6 and max(a.norms.norms) <= 0.5 + 1e-6
      and rel(a.norms.pre, r.norms.pre) <= 1e-6,
      f'max_abs_diff={diff(flat(a), flat(r)):.1e} norms_rel_err={rel(a.norms.pre, r.norms.pre):.1e}')
g = ddp(fit, cbs=[GradientAccumulation(12), GradientClip(0.5), Norms()], bs=3, opt_func=opt)
check('clip_accumulate', diff(flat(g), flat(r)) <= 1e-6 and len(g.norms.norms) == 8,
      f'max_abs_diff={diff(flat(g), flat(r)):.1e} clips={len(g.norms.norms)}')
h = ddp(fit, cbs=[MixedPrecision('fp16', init_scale=2.**10), GradientClip(0.5), Norms()], opt_func=opt)
check('clip_fp16_after_unscale', max(h.norms.norms) <= 0.5 + 1e-3 and abs(h.norms.pre[0]/r.norms.pre[0] - 1) <= 1e-2,
      f'norm_before_clip={h.norms.pre[0]:.4f} fp32={r.norms.pre[0]:.4f}')

# 4. EarlyStoppingCallback: the same epoch on every rank, that of one process
fit = lambda l: l.fit(30)
es = lambda: EarlyStoppingCallback(min_delta=0.01, patience=2)
a, r = ddp(fit, cbs=es(), opt_func=opt), ref(fit, cbs=es(), opt_func=opt)
check('early_stopping', 2 < len(a.recorder.values) < 30 and len(a.recorder.values) == len(r.recorder.values)
      and same_on_ranks(len(a.recorder.values)) and rel(vals(a), vals(r)) <= 1e-6,
      f'epochs={len(a.recorder.values)} max_rel_err={rel(vals(a), vals(r)):.1e}')

# 4. TerminateOnNaNCallback: a NaN loss on rank 1 only stops the fit on both ranks at the same batch
class NaNOnRank1(Callback):
    order = 30
    def __init__(self, epoch, i, training=True): self.at, self.training = (epoch, i), training
    def after_loss(self):
        l = self.learn
        if rank_distrib() == 1 and l.training == self.training and (l.epoch, l.iter) == self.at:
            l.loss, l.loss_grad = l.loss*float('nan'), l.loss_grad*float('nan')
a = ddp(lambda l: l.fit(4), cbs=[TerminateOnNaNCallback(), NaNOnRank1(1, 2)])
stopped = a.terminate_on_na_n.stopped
check('nan_one_rank_train', stopped == (1, 2, 'train', [1]) and same_on_ranks(stopped) and len(a.recorder.values) == 1,
      str(stopped))
a = ddp(lambda l: l.fit(4), cbs=[TerminateOnNaNCallback(), NaNOnRank1(2, 1, training=False)])
stopped = a.terminate_on_na_n.stopped
check('nan_one_rank_valid', stopped == (2, 1, 'valid', [1]) and same_on_ranks(stopped), str(stopped))

# 5. CSVLogger on rank 0 only (a second writer would double the lines), the values of one process
csv_dir, ref_dir = SCRATCH/'csv', SCRATCH/f'csv_ref{rank_distrib()}'
fit = lambda l: l.fit(3)
a, r = ddp(fit, cbs=CSVLogger(), path=csv_dir), ref(fit, cbs=CSVLogger(), path=ref_dir)
gather_object(None)   # both ranks are past the fit
rows = list(csv.reader(open(csv_dir/'history.csv')))
got = torch.tensor([[float(v) for v in row[1:3]] for row in rows[1:]], dtype=torch.float64)
check('csv_logger', rows[0] == ['epoch', 'train_loss', 'valid_loss', 'time'] and len(rows) == 4
      and rel(got, vals(r)) <= 1e-6, f'lines={len(rows)} max_rel_err={rel(got, vals(r)):.1e}')

# 5. TensorBoard on rank 0 only (the logger added on rank 0 alone: local_only), the values of one process
from distrib import TensorBoardCallback
try: from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as e:
    TensorBoardCallback = None
    if rank_distrib() == 0: say(f'CHECK tensorboard SKIP tensorboard is not installed ({e})')
else:
    tb = SCRATCH/'tb'
    a = ddp(fit, cbs=TensorBoardCallback(tb))
    gather_object(None)
    ea = EventAccumulator(str(tb)); ea.Reload()
    got = [e.value for e in ea.Scalars('valid_loss')]
    files = list(tb.glob('events.out.tfevents*'))
    check('tensorboard', len(files) == 1 and [e.step for e in ea.Scalars('valid_loss')] == [4, 8, 12]
          and rel(got, vals(r)[:, 1]) <= 1e-6 and len(ea.Scalars('lr_0')) == 12,
          f'files={len(files)} max_rel_err={rel(got, vals(r)[:, 1]):.1e}')

# loggers added on rank 0 alone (local_only: the pre-flight check does not compare them)
only0 = [CSVLogger('only0.csv')] + ([TensorBoardCallback(SCRATCH/'tb0')] if TensorBoardCallback else [])
a = ddp(fit, cbs=only0 if rank_distrib() == 0 else None, path=SCRATCH)
gather_object(None)
rows = list(csv.reader(open(SCRATCH/'only0.csv')))
check('loggers_on_rank0_only', len(rows) == 4, f'lines={len(rows)}')
say(f'rank {rank_distrib()} done')
