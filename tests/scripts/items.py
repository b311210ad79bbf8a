"""Losses over items (issue 33) on W processes: a masked sequence model whose sequences have 1 to 12 real tokens
(targets -100 elsewhere), so that the ranks' token counts differ at every step, against one process with the global
batch, computed in the same worker (an independent Learner over the same order).
Run: python -m distrib.launch --nproc_per_node W tests/scripts/items.py <tmp dir>   (W = 2: every case; 3: the main ones)
Rank 0 prints one 'CHECK <name> OK <figures>' line per check, and 'ITEMS {json}' with the largest differences per
case (relative: max |a - b| / max |b|, over the weights, and over `recorder.values`); a violated property raises."""
import json, shutil, sys
from pathlib import Path
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from distrib import (Learner, DataLoaders, Callback, CancelFitException, DistributedDL, GradientAccumulation,
                     MixedPrecision, GradientClip, Checkpoint, gather_object, setup_distrib, teardown_distrib,
                     rank_distrib, num_distrib)
from _common import check_all as check, rel

tmp = Path(sys.argv[1])
torch.set_num_threads(1)
setup_distrib(timeout=60)
W, rank = num_distrib(), rank_distrib()
assert W in (2, 3)
FULL = W == 2                  # every case on 2 processes; the main ones on 3 (-m slow)
V, T, EPOCHS, LR = 6, 12, 3, 1.
B, MB = 8, 4                   # per rank: a batch, and an accumulated micro-batch
G, NACC = W*B, 2*W*MB          # the global batch, and the samples of an accumulated step (16 and 16 for W = 2)
N = {2: 64, 3: 72}[W]          # sequences: whole global batches and windows
res = {'world_size': W}

def seqs(n, seed):
    "Tokens x, targets (2x + 1) mod V on the first 1..12 positions, -100 after"
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, V, (n, T), generator=g)
    y = (2*x + 1) % V
    y[torch.arange(T)[None] >= torch.randint(1, T + 1, (n,), generator=g)[:, None]] = -100
    return x, y
x, y = seqs(N, 0)
xv, yv = seqs(41, 1)        # 41: the ranks' validation shards differ in size too

class Tiny(nn.Module):
    "A GRU over embeddings; logits (batch, vocab, time), as nn.CrossEntropyLoss takes them"
    def __init__(self):
        super().__init__()
        self.emb, self.rnn, self.out = nn.Embedding(V, 16), nn.GRU(16, 16, batch_first=True), nn.Linear(16, V)
    def forward(self, x): return self.out(self.rnn(self.emb(x))[0]).transpose(1, 2).contiguous()

class Plain(nn.Module):
    "Embeddings, tanh and a product-sum: nothing autocast computes in 16 bits, so MixedPrecision's scaler is exact"
    def __init__(self):
        super().__init__()
        self.emb, self.w, self.b = nn.Embedding(V, 16), nn.Parameter(torch.randn(16, V)/4), nn.Parameter(torch.zeros(V))
    def forward(self, x):
        return ((self.emb(x).tanh()[..., None]*self.w).sum(-2) + self.b).transpose(1, 2).contiguous()

class Classifier(nn.Module):
    "A plain classifier: one target per sample, none ignored"
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(T, 3)
    def forward(self, x): return self.lin(x.float())

torch.manual_seed(0)
INIT = {Tiny: Tiny().state_dict(), Plain: Plain().state_dict(), Classifier: Classifier().state_dict()}

def token_sum(pred, targ):
    return F.cross_entropy(pred, targ, ignore_index=-100, reduction='sum'), (targ != -100).sum()
def token_acc(pred, targ):
    ok = targ != -100
    return (pred.argmax(1) == targ)[ok].sum(), ok.sum()
def token_mean(pred, targ): return F.cross_entropy(pred, targ, ignore_index=-100)   # a batch mean, as before

class SetEpoch(Callback):
    "The single-process reference calls `set_epoch` itself (distrib_ctx does it)"
    def before_epoch(self):
        for dl in self.learn.dls.loaders:
            if isinstance(dl, DistributedDL): dl.set_epoch(self.learn.epoch)

def learner(train_dl, loss_func=token_sum, arch=Tiny, cbs=(), independent=False, opt_func=torch.optim.SGD,
            valid=(xv, yv), metrics=(token_acc,), **kw):
    m = arch(); m.load_state_dict(INIT[arch])
    dls = DataLoaders(train_dl, DataLoader(TensorDataset(*valid), batch_size=8))
    learn = Learner(dls, m, loss_func, opt_func=opt_func, lr=LR, cbs=list(cbs), metrics=list(metrics),
                    independent=independent, path=tmp, **kw)
    learn.progress.enabled, learn.logger = False, lambda *a: None
    return learn

def one_process(bs=G, cbs=(), epochs=EPOCHS, data=(x, y), **kw):
    "One process with batches of `bs`, the order of `DistributedDL` (that of the distributed runs)"
    learn = learner(DistributedDL(TensorDataset(*data), batch_size=bs, shuffle=True, rank=0, world_size=1),
                    cbs=[SetEpoch(), *cbs], independent=True, **kw)
    learn.fit(epochs)
    return learn

def distributed(bs, cbs=(), ctx=None, epochs=EPOCHS, data=(x, y), **kw):
    learn = learner(DataLoader(TensorDataset(*data), batch_size=bs, shuffle=True), cbs=cbs, **kw)
    with learn.distrib_ctx(**(ctx or {})): learn.fit(epochs)
    return learn

def weights_diff(a, b)->float:
    return max(rel(p.detach(), q.detach()) for p, q in zip(a.model.parameters(), b.model.parameters()))

def compare(name, learn, ref, wtol=1e-5, vtol=1e-6, steps=True):
    "Weights (every rank's the same) and recorder.values (and per-step losses, for the same micro-batches) against ref"
    ws = [p.detach() for p in learn.model.parameters()]
    w0 = gather_object([w.tolist() for w in ws])
    assert all(w == w0[0] for w in w0), f'{name}: the ranks have different weights'
    dw = weights_diff(learn, ref)
    dv = rel(learn.recorder.values, ref.recorder.values)
    ds = rel(learn.recorder.losses, ref.recorder.losses) if steps else 0.
    res[name] = dict(weights=float(f'{dw:.3g}'), values=float(f'{dv:.3g}'))
    if steps: res[name]['steps'] = float(f'{ds:.3g}')
    check(name, dw <= wtol and dv <= vtol and ds <= vtol, f'weights {dw:.2e} values {dv:.2e} step losses {ds:.2e}')

BATCH_EVENTS = {f'{w}_{e}' for w in ('before', 'after', 'after_cancel') for e in ('batch', 'backward', 'step')}
BATCH_EVENTS |= {'batch', 'backward', 'step', 'after_pred', 'after_loss'}

class CountAllReduces(Callback):
    """Record `(event, async_op)` of every torch.distributed.all_reduce in a training batch but the gradients' (DDP's
    own, in C++, or, with the count-carrying hook `sum_over_items`, in Python during the backward: not counted)"""
    def before_fit(self):
        self.calls, self.orig = [], dist.all_reduce
        def counted(*args, **kwargs):
            if self.learn.training and self.learn._event in BATCH_EVENTS - {'backward'}:
                self.calls.append((self.learn._event, kwargs.get('async_op', False)))
            return self.orig(*args, **kwargs)
        dist.all_reduce = counted
        self.learn.on_fit_exit(self._restore)
    def _restore(self): dist.all_reduce = self.orig

ref = one_process()
with torch.no_grad(): pv = ref.model(xv)
ok = yv != -100
true = [F.cross_entropy(pv, yv, ignore_index=-100).item(), (pv.argmax(1) == yv)[ok].float().mean().item()]
check('reference_token_means', rel(ref.recorder.values[-1][1:], true) <= 1e-6, f'{ref.recorder.values[-1]} {true}')

# The loss as a batch mean (each rank's token mean, averaged), in one process and on W ranks: the difference the fix
# removes (the one-process reference trains the same with either loss: one batch a step)
mean_ref = one_process(loss_func=token_mean)
acc = lambda: GradientAccumulation(NACC)
if FULL:
    for name, learn in (('mean_loss_ddp', distributed(B, loss_func=token_mean)),
                        ('mean_loss_one_process_accumulate', one_process(B, [acc()], loss_func=token_mean)),
                        ('mean_loss_accumulate', distributed(MB, [acc()], loss_func=token_mean))):
        dw, dv = weights_diff(learn, mean_ref), rel(learn.recorder.values, mean_ref.recorder.values)
        res[name] = dict(weights=float(f'{dw:.3g}'), values=float(f'{dv:.3g}'))
        check(name, dw > 1e-4 and dv > 1e-5, f'weights {dw:.2e} values {dv:.2e}: the bug the fix removes')
    dw = weights_diff(mean_ref, ref)
    check('mean_loss_one_process', dw <= 1e-6, f'{dw:.2e}')

# DDP: W ranks x 8 against 1 x 8W, with (sum, count) and with nn.CrossEntropyLoss(ignore_index=-100); validate(). The
# count's all-reduce: one per step in before_backward for (sum, count); none for a loss whose targets give the count
# (it travels with the gradients in DDP's hook `sum_over_items`, which the trainer registered), nor for a batch mean
ddp = distributed(B, [cnt := CountAllReduces()])
compare('ddp_sum_count', ddp, ref)
calls_sum = cnt.calls
ce = distributed(B, [cnt := CountAllReduces()], loss_func=nn.CrossEntropyLoss(ignore_index=-100))
compare('ddp_cross_entropy_loss', ce, ref)
n_steps = EPOCHS*N//G
check('one_all_reduce_per_step', calls_sum == [('before_backward', True)]*n_steps and cnt.calls == []
      and ce.item_mean.n_items is not None and ce.item_mean._shares.hooked and ddp.item_mean._shares is None,
      f'{calls_sum[:2]} {cnt.calls[:2]} ({n_steps} steps)')
with ddp.distrib_ctx(): v = ddp.validate()
check('ddp_validate', rel(v, ref.validate()) <= 1e-6 and rel(v, true) <= 1e-6, f'{v} {true}')

# GradientAccumulation: W ranks x 4 samples, 8W per step, each sync strategy, against 1 x 8W (values; the step losses
# against 1 x 8 with the same accumulation: the same micro-batches)
ref8 = one_process(B, [acc()]) if FULL else None
if FULL: compare('one_process_accumulate', ref8, ref, steps=False)
for s in ('single_auto_sync', 'multi_auto_sync', 'forced_sync') if FULL else ('single_auto_sync',):
    learn = distributed(MB, [GradientAccumulation(NACC, s), cnt := CountAllReduces()])
    compare(f'accumulate_{s}', learn, ref, steps=False)
    if ref8 is not None:
        check(f'accumulate_{s}_step_losses', rel(learn.recorder.losses, ref8.recorder.losses) <= 1e-6)
    if s != 'forced_sync':   # forced_sync all-reduces the gradients itself
        check(f'accumulate_{s}_all_reduces', cnt.calls == [('before_backward', True)]*n_steps, f'{cnt.calls[:3]}')

# FSDP2, without (nn.CrossEntropyLoss: the count all-reduced during FSDP's forward) and with accumulation
compare('fsdp', distributed(B, ctx=dict(strategy='fsdp'), loss_func=nn.CrossEntropyLoss(ignore_index=-100)), ref)
compare('fsdp_accumulate', distributed(MB, [acc()], ctx=dict(strategy='fsdp')), ref, steps=False)

# A plain classifier (one target per sample, none ignored): nn.CrossEntropyLoss, now a loss over items, trains and
# reports as the batch mean F.cross_entropy did, to float rounding, with and without accumulation
xc, yc = torch.randn(N, T), torch.randint(0, 3, (N,))
for name, bs, cbs in (('classifier', B, lambda: []), ('classifier_accumulate', MB, lambda: [acc()])):
    a = distributed(bs, cbs(), data=(xc, yc), valid=(xc[:41], yc[:41]), arch=Classifier, metrics=(),
                    loss_func=nn.CrossEntropyLoss())
    b = distributed(bs, cbs(), data=(xc, yc), valid=(xc[:41], yc[:41]), arch=Classifier, metrics=(),
                    loss_func=F.cross_entropy)
    compare(name, a, b, wtol=1e-6)
    check(f'{name}_item_loss', a.loss_sum is not None and b.loss_sum is None)

# Counts known equal (issue 39): a classifier's nn.CrossEntropyLoss() over a TensorDataset whose targets hold no -100
# sums nothing (one rank's count times W), with and without accumulation, and trains as one process with the global
# batch; class weights or an ignored target: the count travels with the gradients (DDP's hook sum_over_items, which
# the trainer registers where the counts may differ: no all-reduce of its own); a callback that could change the
# targets before ItemMean: one all-reduce of the count per step; one process's weights again
def classifier(bs, cbs=(), loss=None, targets=yc, one=False):
    kw = dict(data=(xc, targets), valid=(xc[:41], targets[:41]), arch=Classifier, metrics=(),
              loss_func=loss or nn.CrossEntropyLoss())
    if one: return one_process(G, **kw), None
    return distributed(bs, [*cbs, cnt := CountAllReduces()], **kw), cnt
yi = yc.clone(); yi[::5] = -100
class Early(Callback):
    def before_batch(self): pass   # order 0: before ItemMean
wt = torch.tensor([.5, 1., 2.])
cases = {'known_equal': (B, [], None, yc, True), 'known_equal_accumulate': (MB, [acc()], None, yc, True),
         'ignored_target': (B, [], None, yi, False), 'class_weights': (B, [], nn.CrossEntropyLoss(weight=wt), yc, False),
         'callback_before_item_mean': (B, [Early()], None, yc, False)}
for name, (bs, cbs, loss, targets, known) in cases.items():
    (learn, cnt), (one, _) = classifier(bs, cbs, loss, targets), classifier(bs, cbs, loss, targets, one=True)
    compare(name, learn, one, steps=False)
    hooked = learn.item_mean._shares is not None   # the trainer's count-carrying hook: counts that may differ
    want = [] if known or hooked else [('before_batch', True)]*n_steps
    check(f'{name}_all_reduces', cnt.calls == want and (learn.item_mean._known is not None) == known
          and hooked == (name in ('ignored_target', 'class_weights')),
          f'{cnt.calls[:2]} ({len(cnt.calls)}), known {learn.item_mean._known is not None}')

if FULL:
    # clipping after the rescaling; MixedPrecision: float16's GradScaler (its scale doubling every step) on a model
    # that autocast leaves in float32, exact; bfloat16 on the GRU, within bfloat16's rounding of one process's
    clip_ref = one_process(cbs=[GradientClip(0.1)])
    compare('clip_accumulate', distributed(MB, [acc(), GradientClip(0.1)]), clip_ref, steps=False)
    fp16 = lambda: MixedPrecision('fp16', init_scale=2.**4, growth_interval=1)
    mp_ref = one_process(cbs=[fp16()], arch=Plain)
    mp = distributed(MB, [acc(), fp16()], arch=Plain)
    compare('fp16_scaler_accumulate', mp, mp_ref, steps=False)
    check('fp16_scaler_steps', mp.mixed_precision.scaler.get_scale() == mp_ref.mixed_precision.scaler.get_scale()
          == 2.**(4 + n_steps), f'{mp.mixed_precision.scaler.get_scale()}')
    bf_ref = one_process(cbs=[MixedPrecision('bf16')])
    bf = distributed(B, [MixedPrecision('bf16')])
    dw = weights_diff(bf, bf_ref)
    res['bf16'] = dict(weights=float(f'{dw:.3g}'))
    check('bf16', dw <= 5e-2, f'weights {dw:.2e} (bfloat16 rounds the two runs differently)')

    # lr_find: each step's loss over its items
    a, b = learner(DistributedDL(TensorDataset(x, y), batch_size=G, shuffle=True, rank=0, world_size=1),
                   cbs=[SetEpoch()], independent=True), learner(DataLoader(TensorDataset(x, y), batch_size=B, shuffle=True))
    a.lr_find(num_it=10, show_plot=False, suggest_funcs=None)
    with b.distrib_ctx(): b.lr_find(num_it=10, show_plot=False, suggest_funcs=None)
    d = rel(b.recorder.losses, a.recorder.losses)
    res['lr_find'] = dict(values=float(f'{d:.3g}'))
    check('lr_find', len(a.recorder.losses) == 10 and d <= 1e-6, f'{d:.2e}')

# Checkpoint: accumulation of W x 4 to 8W, a checkpoint every 3 steps (4 steps an epoch), stopped after step 7
# (epoch 1, batch 6 of 8); a new Learner resumes from step 6 in the middle of epoch 1: bit for bit the uninterrupted
# run, and one process's weights and values
class StopAfter(Callback):
    order = 95
    def __init__(self, n): self.n, self.steps = n, 0
    def after_step(self):
        self.steps += 1
        if self.steps == self.n: raise CancelFitException(every_rank=True)
if FULL:
    if rank == 0: shutil.rmtree(tmp/'ck', ignore_errors=True)
    dist.barrier()
    full = distributed(MB, [acc()])
    distributed(MB, [acc(), Checkpoint('ck', every_n_steps=3), StopAfter(7)])
    ck = Checkpoint('ck', every_n_steps=3)
    resumed = distributed(MB, [acc(), ck])
    exact = (all(torch.equal(p, q) for p, q in zip(resumed.model.parameters(), full.model.parameters()))
             and resumed.recorder.values == full.recorder.values and resumed.recorder.losses == full.recorder.losses)
    check('checkpoint_resume_exact', ck.resumed_from.name == 'step-6.pth' and exact, f'{ck.resumed_from}')
    compare('checkpoint_resume', resumed, ref, steps=False)

if rank == 0: print('ITEMS ' + json.dumps(res), flush=True)
teardown_distrib()
