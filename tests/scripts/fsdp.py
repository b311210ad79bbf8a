"""FSDP under W processes (2 or 3), against DDP with W processes and against one process.
Run: python -m distrib.launch --nproc_per_node W tests/scripts/fsdp.py <shared tmp dir>
The W=2 run leaves a sharded checkpoint and its reference state in <tmp>/w2 for the W=3 run and for one process.
Rank 0 prints one 'CHECK <name> OK <figures>' line per check; a violated property raises (non-zero exit).
Sections whose results do not depend on how the rows divide among the ranks (accumulation, mixed precision, the
Learner after the context, bad options, fastai's callbacks, block options) run on W=2 only: W=3 costs most."""
import gc, os, shutil, sys, warnings, weakref
from functools import partial
from pathlib import Path
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
import distrib
from distrib import (Learner, DataLoaders, Callback, GradientAccumulation, MixedPrecision, AccumMetric, accuracy,
                     shard_idxs, clip_grad_norm_, local_state_bytes, full_model_state, full_opt_state, gather_object,
                     setup_distrib, teardown_distrib, rank_distrib, num_distrib)
from _common import check, rel

tmp = Path(sys.argv[1])
torch.set_num_threads(1)
setup_distrib(timeout=120)
W, rank = num_distrib(), rank_distrib()
N, BS = 24*W, 4            # 6 steps per epoch on every world size

def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g)

x, y = data(N, 1)
xv, yv = data(4*W + 1, 2)     # a validation set the ranks cannot split evenly

def new_model(width=33):
    "33 rows divide by neither 2 nor 3; the last layer's 2 rows leave rank 2 of 3 an empty shard"
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 2))

def learner(model=None, valid=(xv, yv), opt_func=torch.optim.Adam, lr=1e-2, cbs=None, bs=BS, **kw):
    dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=bs, shuffle=True),
                      DataLoader(TensorDataset(*valid), batch_size=3))
    learn = Learner(dls, model or new_model(), F.cross_entropy, opt_func=opt_func, lr=lr, metrics=accuracy,
                    cbs=cbs, path=tmp, **kw)
    learn.progress.enabled = False
    return learn

FSDP = dict(strategy='fsdp', shard_classes=nn.Linear)

def fit(epochs=2, cbs=None, ctx=None, **kw):
    "A Learner trained `epochs` under distrib_ctx(**ctx) (DDP by default)"
    learn = learner(**kw)
    with learn.distrib_ctx(**(ctx or {})): learn.fit(epochs, cbs=cbs)
    return learn

def weights(m): return torch.cat([p.detach().flatten() for p in m.parameters()])
def max_diff(a, b): return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))

def same_on_all_ranks(t, what):
    ts = gather_object(t)
    assert all(torch.equal(o, ts[0]) for o in ts), f"{what} differs between ranks"

# 1. equivalence: FSDP with W ranks ends with DDP's weights after 2 epochs of Adam, whatever the blocks
ddp = fit()
variants = [('linear_blocks', FSDP), ('root_only', dict(strategy='fsdp'))]
if W == 2: variants += [('no_reshard_threshold', dict(strategy='fsdp', min_params=1000, reshard_after_forward=False)),
                        ('cpu_offload', dict(FSDP, cpu_offload=True))]
for name, ctx in variants:
    fsdp = fit(ctx=ctx)
    assert type(fsdp.model) is nn.Sequential and not any(type(p).__name__ == 'DTensor' for p in fsdp.model.parameters())
    same_on_all_ranks(weights(fsdp.model), 'the weights')
    d = rel(weights(fsdp.model), weights(ddp.model))
    dv = max(rel(a, b) for a, b in zip(fsdp.recorder.values, ddp.recorder.values))
    check(f'equivalence_{name}', d <= 1e-5 and dv <= 1e-5, f'max_rel_weights={d:.2e} max_rel_recorder={dv:.2e}')
assert not torch.equal(ddp.model[0].weight, new_model()[0].weight), 'the model did not train'

def rank_model():
    "Each rank's own initial weights: DDP starts from rank 0's, so must FSDP"
    torch.manual_seed(rank)
    return nn.Sequential(nn.Linear(4, 33), nn.ReLU(), nn.Linear(33, 33), nn.ReLU(), nn.Linear(33, 2))
if W == 2:
    a, b = fit(model=rank_model()), fit(model=rank_model(), ctx=FSDP)
    same_on_all_ranks(weights(b.model), 'the weights')
    d = rel(weights(b.model), weights(a.model))
    check('equivalence_rank0_weights', d <= 1e-5, f'max_rel={d:.2e}')

# 2. exact metrics and get_preds: the sharded model's validation equals one process's, also for a validation set
#    smaller than the world (a rank without batches runs rank 0's to keep the all-gathers in step)
def median_err(preds, targs): return (preds.softmax(1).gather(1, targs[:, None]) - 1).abs().median()
diffs = []
for n_valid in [4*W + 1, 1]:
    valid = data(n_valid, 3)
    learn = learner(valid=valid)
    learn.metrics.append(AccumMetric(median_err, flatten=False))
    with learn.distrib_ctx(**FSDP):
        learn.fit(1)
        vals = learn.validate()
        preds, targs = learn.get_preds()
    with torch.no_grad(): ref = learn.model.eval()(valid[0])
    ref_vals = [F.cross_entropy(ref, valid[1]).item(), accuracy(ref, valid[1]).item(), median_err(ref, valid[1]).item()]
    diffs += [rel(v, r) for v, r in zip(vals, ref_vals)]
    diffs += [rel(learn.recorder.values[-1][1], ref_vals[0]), rel(preds, ref)]
    assert len(preds) == n_valid and torch.equal(targs, valid[1])
check('metrics_get_preds', max(diffs) <= 1e-6, f'max_rel={max(diffs):.2e}')

# 3. memory: the local shards of parameters, gradients and Adam's state are about 1/W of DDP's
class Bytes(Callback):
    order = 20
    def after_backward(self): self.bytes = local_state_bytes(self.learn.model, self.learn.opt)
    def after_step(self): self.bytes['optimizer'] = local_state_bytes(self.learn.model, self.learn.opt)['optimizer']
big = dict(model=new_model(width=256))
ddp_b, fsdp_b = Bytes(), Bytes()
fit(1, cbs=ddp_b, **big)
fit(1, cbs=fsdp_b, ctx=FSDP, model=new_model(width=256))
ratios = {k: fsdp_b.bytes[k]/ddp_b.bytes[k] for k in ddp_b.bytes}
check('memory_1_over_W', all(abs(r*W - 1) < 0.05 for r in ratios.values()),
      ' '.join(f'{k}={fsdp_b.bytes[k]}/{ddp_b.bytes[k]}B' for k in ratios))

""# 3b. host memory: rank 0 keeps the Learner's whole model (and its optimizer's state) during the fit, the other ranks
# free theirs (issue 49: one whole copy per job, not per rank); after the fit every rank has the trained model again
def held(m)->int:
    "Bytes of the distinct storages of `m`'s parameters and buffers"
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in [*m.parameters(), *m.buffers()]}.values())
m_held = new_model(width=256); P_held = held(m_held)
learn = learner(model=m_held)
with learn.distrib_ctx(): learn.fit(1)   # Adam's state exists before the sharded fit
plain_opt = learn.opt
class Held(Callback):
    order = 20
    def after_batch(self):
        self.during = (held(m_held), sum(v.untyped_storage().nbytes() for s in plain_opt.state.values()
                                         for v in s.values() if v.dim()))
with learn.distrib_ctx(**FSDP): learn.fit(1, cbs=(h := Held()))
after = held(m_held)
same_on_all_ranks(weights(m_held), 'the weights after the sharded fit')
want = (P_held, 2*P_held) if rank == 0 else (0, 0)
check('whole_model_rank0_only', h.during == want and after == P_held and len(plain_opt.state) == len(list(m_held.parameters())),
      f'rank {rank}: held {h.during} B (model, Adam state) during the fit, {after} B after; P={P_held} B')

# 4. gradient accumulation: one process's steps with batches of n_acc; gradients reduce-scattered on the last
#    micro-batch only (single_auto_sync) or on every one (multi_auto_sync)
if W == 2:  # W=2 only
    def reference(global_bs, epochs=2, opt_func=torch.optim.Adam, lr=1e-2):
        m = new_model(); opt = opt_func(m.parameters(), lr=lr)
        for epoch in range(epochs):
            perm = shard_idxs(N, 0, 1, shuffle=True, seed=0, epoch=epoch)
            for i in range(0, N, global_bs):
                idx = perm[i:i+global_bs]
                F.cross_entropy(m(x[idx]), y[idx]).backward(); opt.step(); opt.zero_grad()
        return weights(m)

    # the name FSDP2 calls: torch 2.13 renamed reduce_scatter_tensor
    RS = 'reduce_scatter_single' if hasattr(dist, 'reduce_scatter_single') else 'reduce_scatter_tensor'
    class CountReduceScatter(Callback):
        "How many reduce-scatters (FSDP's gradient collective) each training micro-batch ran"
        order = 20
        def before_fit(self):
            self.per_batch, self.orig = [], getattr(dist, RS)
            def counting(*a, **k):
                self.n += 1
                return self.orig(*a, **k)
            setattr(dist, RS, counting)
        def before_batch(self): self.n = 0
        def after_batch(self):
            if self.learn.training: self.per_batch.append(self.n)
        def after_fit(self): setattr(dist, RS, self.orig)

    ref = reference(2*BS*W)
    # one reduce-scatter per Linear block; the root holds no parameter of its own here, so none for it
    for strategy, expected in [('single_auto_sync', [0, 3]), ('multi_auto_sync', [3, 3])]:
        cnt = CountReduceScatter()
        learn = fit(cbs=[GradientAccumulation(2*BS*W, strategy), cnt], ctx=FSDP)
        d = rel(weights(learn.model), ref)
        check(f'accumulate_{strategy}', d <= 1e-5 and cnt.per_batch == expected*(len(cnt.per_batch)//2),
              f'max_rel={d:.2e} reduce_scatters per micro-batch={cnt.per_batch[:4]}')
    try: fit(cbs=GradientAccumulation(2*BS*W, 'forced_sync'), ctx=FSDP); msg = ''
    except ValueError as e: msg = str(e)
    check('accumulate_forced_sync_refused', 'no FSDP counterpart' in msg, msg)

# 5. MixedPrecision maps to FSDP's MixedPrecisionPolicy: the blocks compute in its type, the weights stay float32,
#    and training follows DDP's with the same MixedPrecision
if W == 2:  # W=2 only
    class ComputeDtype(Callback):
        order = 20
        def before_fit(self):
            self.dtypes = set()
            self.learn.model[0].register_forward_pre_hook(lambda m, a: self.dtypes.add(m.weight.dtype))
    cd = ComputeDtype()
    learn = learner(cbs=[MixedPrecision('bf16'), cd])   # the Learner's: seen when the model is sharded
    with learn.distrib_ctx(**FSDP): learn.fit(2)
    ddp16 = fit(cbs=MixedPrecision('bf16'))
    d, d32 = rel(weights(learn.model), weights(ddp16.model)), rel(weights(learn.model), weights(ddp.model))
    check('mixed_precision_bf16', cd.dtypes == {torch.bfloat16} and learn.model[0].weight.dtype == torch.float32
          and d < 1e-2, f'compute dtypes={cd.dtypes} max_rel_vs_ddp_bf16={d:.2e} (vs fp32: {d32:.2e})')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        late = fit(cbs=[MixedPrecision('bf16'), cd], ctx=FSDP)  # given to fit: autocast only, and a warning says so
    d = rel(weights(late.model), weights(ddp16.model))
    check('mixed_precision_late_warns', cd.dtypes == {torch.float32} and d < 1e-2 and
          any('pass it to the Learner' in str(w.message) for w in caught), f'max_rel_vs_ddp_bf16={d:.2e}')
    mp = partial(MixedPrecision, 'fp16', init_scale=2.**4, growth_interval=1)
    learn, ddp16 = learner(cbs=mp()), fit(cbs=mp())
    with learn.distrib_ctx(**FSDP): learn.fit(2)
    scale, d = learn.mixed_precision.scaler.get_scale(), rel(weights(learn.model), weights(ddp16.model))
    same_on_all_ranks(torch.tensor(scale), 'the loss scale')
    check('mixed_precision_fp16_scaler', scale == 2.**(4 + 2*N//(BS*W)) and d < 1e-2,
          f'scale={scale} max_rel_vs_ddp_fp16={d:.2e}')
    learn = learner(cbs=MixedPrecision('bf16'))
    try:
        with learn.distrib_ctx(param_dtype='fp16', **FSDP): pass
        msg = ''
    except ValueError as e: msg = str(e)
    check('mixed_precision_conflict', 'MixedPrecision callback computes in torch.bfloat16' in msg, msg)

# 6. clipping sharded gradients: the norm of the whole gradients, as DDP's (an empty shard on W=3 for inf)
class Clip(Callback):
    order = 20
    def __init__(self, norm_type): self.norm_type, self.norms = norm_type, []
    def before_step(self):
        self.norms.append(clip_grad_norm_(self.learn.model.parameters(), 0.05, self.norm_type).item())
for norm_type in (2., float('inf')):
    a, b = Clip(norm_type), Clip(norm_type)
    dl, fl = fit(cbs=a), fit(cbs=b, ctx=FSDP)
    d, dn = rel(weights(fl.model), weights(dl.model)), rel(b.norms, a.norms)
    same_on_all_ranks(torch.tensor(b.norms), 'the gradient norms')
    check(f'clip_norm_{norm_type}', d <= 1e-5 and dn <= 1e-5 and max(a.norms) > 0.05,
          f'max_rel_weights={d:.2e} max_rel_norms={dn:.2e}')

# 7. the Learner after the context: its own model, trained, and a plain optimizer with the whole state; a second
#    context continues from there (Adam's state included); an exception leaves the model as it was on entry
if W == 2:  # W=2 only
    learn = learner()
    model = learn.model
    with learn.distrib_ctx(**FSDP): learn.fit(1)
    opt_state = learn.opt.state_dict()['state']
    assert learn.model is model and all(type(v) is torch.Tensor for s in opt_state.values() for v in s.values())
    with learn.distrib_ctx(**FSDP): learn.fit(2, start_epoch=1)
    d = rel(weights(learn.model), weights(ddp.model))
    w = weights(learn.model)
    frozen = gc.get_freeze_count()   # Python 3.12 starts with some objects frozen
    gc.disable()    # the sharded copy must be gone on exit through distrib_ctx's own collection
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter('always')
            with learn.distrib_ctx(**FSDP):
                sharded = weakref.ref(learn.model)
                learn.fit(1)
                raise KeyError('boom')
    except KeyError: pass
    gone = sharded() is None and gc.get_freeze_count() == frozen
    gc.enable()
    # rank 0 kept the model as it was on entry; the others freed theirs during the fit: NaN, and a warning says so
    nan = any('holds NaN' in str(x.message) for x in warned)
    as_entry = torch.equal(weights(learn.model), w) if rank == 0 else weights(learn.model).isnan().all().item() and nan
    check('exit_restores_learner', d <= 1e-5 and learn.model is model and as_entry and gone,
          f'max_rel_two_contexts_vs_ddp={d:.2e} sharded copy gone on exit={gone}')

# 8. checkpoints: whole (gathered on rank 0, the one-process format) and sharded (every rank its shards)
shutil.rmtree(tmp/'models', ignore_errors=True)
dist.barrier()
learn = learner()
with learn.distrib_ctx(**FSDP):
    learn.fit(1)
    whole, shards = learn.save('whole'), learn.save('shards', sharded=True)
    ref_model = full_model_state(learn.model, rank0_only=False)
    ref_opt = full_opt_state(learn.model, learn.opt, rank0_only=False)
files = sorted(p.name for p in (tmp/'models').iterdir())
shard_files = sorted(p.name for p in shards.iterdir())
check('save_layout', files == ['shards', 'whole.pth'] and
      shard_files == ['.metadata'] + [f'__{r}_0.distcp' for r in range(W)],
      f'{files} {shard_files}')
saved = torch.load(whole, weights_only=True)
check('save_whole_format', list(saved['model']) == list(new_model().state_dict()) and sorted(saved['opt']['state']) ==
      list(range(6)), f"keys {list(saved['model'])[:2]}...")

def state_diff(learn):
    "Largest difference between `learn`'s model and optimizer state and the saved one"
    m, o = full_model_state(learn.model, rank0_only=False), full_opt_state(learn.model, learn.opt, rank0_only=False)
    dm = max((m[k] - ref_model[k]).abs().max().item() for k in ref_model)
    do = max((o['state'][i][k] - ref_opt['state'][i][k]).abs().max().item() for i in ref_opt['state']
             for k in ref_opt['state'][i])
    return max(dm, do)

for name in ('whole', 'shards'):
    fresh = learner(model=nn.Sequential(nn.Linear(4, 33), nn.ReLU(), nn.Linear(33, 33), nn.ReLU(), nn.Linear(33, 2)))
    with fresh.distrib_ctx(**FSDP):
        fresh.load(name)
        d_fsdp = state_diff(fresh)
    plain = learner(model=nn.Sequential(nn.Linear(4, 33), nn.ReLU(), nn.Linear(33, 33), nn.ReLU(), nn.Linear(33, 2)))
    plain.load(name)    # not distributed: every rank reads it whole
    check(f'load_{name}', d_fsdp == 0 and state_diff(plain) == 0, f'fsdp={d_fsdp} plain={state_diff(plain)}')

# under DDP too: every rank holds the whole model, DCP writes each tensor once
learn = learner()
with learn.distrib_ctx():
    learn.fit(1)
    learn.save('ddp_shards', sharded=True)
fresh = learner(model=nn.Sequential(nn.Linear(4, 33), nn.ReLU(), nn.Linear(33, 33), nn.ReLU(), nn.Linear(33, 2)))
with fresh.distrib_ctx(): fresh.load('ddp_shards')
d = max(max_diff(a, b) for a, b in [(learn.model, fresh.model)])
do = max((fresh.opt.state[q]['exp_avg'] - learn.opt.state[p]['exp_avg']).abs().max().item()
         for p, q in zip(learn.model.parameters(), fresh.model.parameters()))
check('load_shards_ddp', d == 0 and do == 0, f'model={d} optimizer={do}')

# resume: fit(1), save sharded, load into a new Learner, fit(2, start_epoch=1) == fit(2)
full = fit(ctx=FSDP)
part = learner()
with part.distrib_ctx(**FSDP):
    part.fit(1)
    part.save('half', sharded=True)
resumed = learner(model=nn.Sequential(nn.Linear(4, 33), nn.ReLU(), nn.Linear(33, 33), nn.ReLU(), nn.Linear(33, 2)))
with resumed.distrib_ctx(**FSDP):
    resumed.load('half')
    resumed.fit(2, start_epoch=1)
d = rel(weights(resumed.model), weights(full.model))
check('resume_sharded', d <= 1e-6, f'max_rel={d:.2e}')

# for the W=3 run and one process: the W=2 sharded checkpoint and its state
if W == 2:
    if rank == 0:
        shutil.rmtree(tmp/'w2', ignore_errors=True)
        shutil.copytree(tmp/'models'/'shards', tmp/'w2'/'shards')
        torch.save({'model': ref_model, 'opt': ref_opt}, tmp/'w2'/'ref.pt')
    dist.barrier()
elif (tmp/'w2'/'ref.pt').exists():
    ref = torch.load(tmp/'w2'/'ref.pt', weights_only=True)
    ref_model, ref_opt = ref['model'], ref['opt']
    fresh = learner(model=nn.Sequential(nn.Linear(4, 33), nn.ReLU(), nn.Linear(33, 33), nn.ReLU(), nn.Linear(33, 2)))
    fresh.model_dir = 'w2'
    with fresh.distrib_ctx(**FSDP):
        fresh.load('shards')
        d = state_diff(fresh)
        rows = fresh.model[0].weight.to_local().shape[0]
    check('reshard_2_to_3', d == 0 and rows == 11, f'max_diff={d} rows on this rank={rows}')

# 9. bad options fail at entry, with the fix in the message
if W == 2:  # W=2 only
    learn = learner()
    for kw, err, text in [(dict(strategy='fsdp', comm_hook='fp16'), ValueError, "option(s) of strategy='ddp'"),
                          (dict(strategy='fsdp', shard_class=nn.Linear), TypeError, 'shard_classes'),
                          (dict(strategy='zero'), ValueError, "'ddp', 'fsdp'"),
                          (dict(strategy='fsdp', min_params=0), ValueError, 'min_params')]:
        try:
            with learn.distrib_ctx(**kw): pass
            msg = ''
        except err as e: msg = str(e)
        check(f'bad_option_{list(kw)[-1]}', text in msg, msg)
    import distrib.strategies.fsdp as fsdp_module   # a group without a CPU backend, as under backend='nccl' alone
    orig_backend = fsdp_module.group_backend
    fsdp_module.group_backend = lambda t, g=None: None if t == 'cpu' else orig_backend(t, g)
    try:
        with learn.distrib_ctx(strategy='fsdp', cpu_offload=True): pass
        msg = ''
    except ValueError as e: msg = str(e)
    finally: fsdp_module.group_backend = orig_backend
    check('bad_option_cpu_offload_without_gloo', "'cpu:gloo,cuda:nccl'" in msg and 'cpu_offload=False' in msg, msg)

# 10. fastai's callbacks and Learner methods: the same under FSDP as under DDP
if W == 2:  # W=2 only: section 6 clips an empty shard on W=3
    a, b = fit(cbs=distrib.GradientClip(0.05)), fit(cbs=distrib.GradientClip(0.05), ctx=FSDP)
    d = rel(weights(b.model), weights(a.model))
    check('merged_gradient_clip', d <= 1e-5, f'max_rel={d:.2e}')
    a, b = fit(cbs=distrib.GradientClip(0.05, norm_type=float('inf'))), \
           fit(cbs=distrib.GradientClip(0.05, norm_type=float('inf')), ctx=FSDP)   # rank 2 of 3: an empty shard
    d = rel(weights(b.model), weights(a.model))
    check('merged_gradient_clip_inf', d <= 1e-5, f'max_rel={d:.2e}')
    a, b = learner(), learner()
    with a.distrib_ctx(): a.fit_one_cycle(2)
    with b.distrib_ctx(**FSDP): b.fit_one_cycle(2)
    d = rel(weights(b.model), weights(a.model))
    check('merged_fit_one_cycle', d <= 1e-5, f'max_rel={d:.2e}')
    a, b = learner(), learner()
    with a.distrib_ctx(): sa = a.lr_find(num_it=20, show_plot=False)
    w0 = weights(b.model)
    with b.distrib_ctx(**FSDP): sb = b.lr_find(num_it=20, show_plot=False)
    check('merged_lr_find', rel(list(sb), list(sa)) <= 1e-6 and torch.equal(weights(b.model), w0), f'{sa} {sb}')

# 11. Checkpoint under FSDP: every 3 steps and at the end of each epoch (6 steps); stopped after step 10 (epoch 1,
# batch 4), a new Learner resumes from step 9 in the middle of epoch 1 and ends as the uninterrupted fit, bit for bit:
# sharded by default (directories step-N, every rank its shards), and whole files gathered on rank 0 (sharded=False)
class StopAfter(Callback):
    def __init__(self, n): self.n, self.steps = n, 0
    def after_step(self):
        self.steps += 1
        if self.steps == self.n: raise distrib.CancelFitException()

class Capture(Callback):
    "The whole model and optimizer state at the first epoch of the fit, after Checkpoint resumed (order 90)"
    order = 95
    state = None
    def before_epoch(self):
        if self.state is not None: return   # copies: Adam's `step` tensors are updated in place
        opt = full_opt_state(self.learn.model, self.learn.opt, rank0_only=False)
        self.state = ({k: v.clone() for k, v in full_model_state(self.learn.model, rank0_only=False).items()},
                      {'state': {i: {k: v.clone() for k, v in s.items()} for i, s in opt['state'].items()}})

def same_state(a:dict, b:dict)->float:
    "Largest difference between two (model, optimizer) whole states"
    diffs = [((a[0][k] - b[0][k]).abs().max().item(), k) for k in b[0]]
    diffs += [((a[1]['state'][i][k] - b[1]['state'][i][k]).abs().max().item(), (i, k)) for i in b[1]['state']
              for k in b[1]['state'][i]]
    return max(d for d, _ in diffs)

def fresh_learner(): return learner(model=nn.Sequential(nn.Linear(4, 33), nn.ReLU(), nn.Linear(33, 33), nn.ReLU(),
                                                        nn.Linear(33, 2)))
for name, sharded in (('ck_sharded', None), ('ck_whole', False)):
    if rank == 0: shutil.rmtree(tmp/name, ignore_errors=True)
    dist.barrier()
    fit(cbs=[distrib.Checkpoint(name, every_n_steps=3, sharded=sharded), StopAfter(10)], ctx=FSDP)
    listed = [p.name for _, p in distrib.checkpoints(tmp/name)]
    if sharded is None:
        files = sorted(p.name for p in (tmp/name/'step-9').iterdir())
        check('checkpoint_sharded_layout', listed == ['step-6', 'step-9'] and sorted(os.listdir(tmp/name)) == listed
              and files == ['.metadata'] + [f'__{r}_0.distcp' for r in range(W)], f'{listed} {files}')
    else:
        saved = torch.load(tmp/name/'step-9.pth', weights_only=True)
        check('checkpoint_whole_layout', listed == ['step-6.pth', 'step-9.pth'] and
              list(saved['model']) == list(new_model().state_dict()), f'{listed}')
    if W == 2 and rank == 0:   # for the W=3 run and one process, before the resumed fit replaces them
        if sharded is None:
            for d in ('ck', 'ck_one'): shutil.rmtree(tmp/'w2'/d, ignore_errors=True)
            shutil.copytree(tmp/name, tmp/'w2'/'ck')
            shutil.copytree(tmp/name/'step-6', tmp/'w2'/'ck_one'/'step-6')
        else: shutil.copy(tmp/name/'step-6.pth', tmp/'w2'/'step-6.pth')
    resumed, ck = fresh_learner(), distrib.Checkpoint(name, every_n_steps=3, sharded=sharded)
    with resumed.distrib_ctx(**FSDP): resumed.fit(2, cbs=ck)
    d = max_diff(resumed.model, full.model)
    check(f'{name}_resume', d == 0 and ck.resumed_from.name == listed[-1] and
          resumed.recorder.values == full.recorder.values, f'max_diff={d} from {ck.resumed_from}')

# for the W=3 run: the W=2 sharded checkpoints (step-9 in the middle of epoch 1, step-6 at its start) and the whole
# file of step 6 (the same training)
if W == 3 and (tmp/'w2'/'step-6.pth').exists():
    if rank == 0: shutil.rmtree(tmp/'w3_ck', ignore_errors=True); shutil.copytree(tmp/'w2'/'ck', tmp/'w3_ck')
    dist.barrier()
    try:
        with fresh_learner().distrib_ctx(**FSDP) as l: l.fit(2, cbs=distrib.Checkpoint('w3_ck'))
        msg = ''
    except ValueError as e: msg = str(e)
    check('checkpoint_mid_epoch_other_world_refused', "with a global batch of 8 (2 processes x 4), and this run's is "
          "12 (3 processes x 4)" in msg, msg)
    if rank == 0: shutil.rmtree(tmp/'w3_ck'/'step-9')
    dist.barrier()
    resumed, ck, cap = fresh_learner(), distrib.Checkpoint('w3_ck', allow_batch_change=True), Capture()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        with resumed.distrib_ctx(**FSDP): resumed.fit(2, cbs=[ck, cap])
    notes = [str(w.message) for w in caught if 'Resuming from' in str(w.message)]
    whole = torch.load(tmp/'w2'/'step-6.pth', weights_only=True)
    d = same_state(cap.state, (whole['model'], whole['opt']))
    ok_note = rank != 0 or any('global batch was 8 (2 processes) and is now 12 (3 processes)' in n for n in notes)
    check('checkpoint_reshard_2_to_3', d == 0 and ck.resumed_from.name == 'step-6' and ok_note and
          [p.name for _, p in distrib.checkpoints(tmp/'w3_ck')] == ['step-6', 'step-12'], f'max_diff={d} {notes}')
teardown_distrib()
print(f'rank {rank} done')
