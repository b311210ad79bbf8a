"""GPU checks, several per job (GPU time is scarce): `python -m distrib.launch --nproc_per_node W gpu.py MODE OUT`
prints 'CHECK <name> OK' (rank 0) for every check that passed; a failed check raises, naming it.

The device is a parameter: `DISTRIB_TEST_DEVICE=cuda` (default) runs on the GPUs; `DISTRIB_TEST_DEVICE=cpu` runs,
on CPU over gloo, every check that does not need CUDA itself (the orders, references and tolerances of the suite are
then proven before a GPU is lent); the checks that need CUDA are skipped, and tests/test_gpu.py knows which
(`ONE_CUDA`, `TWO_CUDA`, `cuda_only`).

MODE:
- `one`: one process (W=1): a world of one trains on the device (no group); MixedPrecision float16 (skipped steps,
  the scale resumed) and bf16; Checkpoint resumed bit for bit; lr_find on the device; FSDP on one rank, and
  FSDPTrainer after a plain fit (on a GPU the Learner's model off the GPU meanwhile); on a GPU also a GPU checkpoint
  loaded on CPU and back, parallel_ctx from a CPU model.
- `two`: W=2 processes with the default backend ('cpu:gloo,cuda:nccl' on GPUs, one each, `device='cuda'`; gloo on
  CPU): torch's timeouts (NCCL's with distrib's grace); equal to one process with the global batch (and with compile=True); each comm hook against its own reference;
  SyncBatchNorm against the global batch's statistics; MixedPrecision under DDP; a Checkpoint resumed under DDP;
  get_preds and AccumMetric; FSDP, with cpu_offload and MixedPrecision on GPUs; DataParallel (rank 0, two GPUs).
- `share`: W=2 processes sharing GPU 0 over gloo: equal to one process with the global batch.
- `nccl`: W=2, backend='nccl' given explicitly (no CPU backend): collectives, FSDP's pre-flight, equal to one process.
- `place`: one process started with `--gpus 0` sees GPU 0 alone and trains there.
- `fail`: W >= 2 ranks over NCCL, a GPU each (an NCCL all-reduce first); rank W-1 raises in `before_batch` (the
  launcher must name it).
- `queued`: W=2, `backend='nccl'` on GPUs (gloo on CPU): a collective that returns once queued (issue 34's item 7)
  is followed by the watchdog: rank 1 holds until rank 0's heartbeat in the store says rank 0 waits in it, queued,
  its main thread gone on; it stops saying so once the collective is done. `all_reduce_sum` (on CPU a gloo
  `async_op=True` all-reduce with `mark_queued(done=work.is_completed)` stands for NCCL's), then DDP's backward.
"""
import copy, os, sys, tempfile, time
from pathlib import Path
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from distrib import (Learner, DataLoaders, Callback, Checkpoint, MixedPrecision, DistributedDL, AccumMetric,
                     set_seed, setup_distrib, ParamScheduler, SchedLin, all_reduce_sum, gather_object, broadcast_object,
                     rank_distrib, num_distrib, current_world, unwrap_model, shard_model)
from distrib.runtime.group import group_backend, distrib_timeout

os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')  # before cuBLAS starts: deterministic checks
DEV = os.environ.get('DISTRIB_TEST_DEVICE', 'cuda')
assert DEV in ('cuda', 'cpu'), f"DISTRIB_TEST_DEVICE={DEV!r}: 'cuda' or 'cpu'"
CUDA = DEV == 'cuda'
if not CUDA: torch.set_num_threads(1)
mode, out = sys.argv[1], Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
W, rank = num_distrib(), rank_distrib()
N, BS = 96, 16  # BS: the global batch; each rank reads BS // W

def ok(name:str):
    if rank == 0: print(f'CHECK {name} OK', flush=True)

def data(n=N, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x @ torch.randn(8, 1, generator=g)).squeeze(1) + 0.1*torch.randn(n, generator=g))

def make_dls(bs=BS):
    return DataLoaders(DataLoader(data(), batch_size=bs, shuffle=True), DataLoader(data(32, 1), batch_size=bs))

class Seq(nn.Sequential):
    "The model; `seen` collects the dtypes its first layer computed in (replicas of DataParallel share the set)"
    def forward(self, x):
        h = self[0](x)
        self.seen.add(h.dtype)
        for m in list(self)[1:]: h = m(h)
        return h.squeeze(-1)

def make_model(bn=False, dropout=0.):
    torch.manual_seed(0)
    layers = [nn.Linear(8, 16)] + ([nn.BatchNorm1d(16)] if bn else [])
    m = Seq(*layers, nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 1))
    m.seen = set()
    return m

def learner(model=None, bs=BS, dls=None, **kw):
    learn = Learner(dls or make_dls(bs), model if model is not None else make_model(), F.mse_loss, lr=1e-2, **kw)
    learn.logger = lambda *a: None
    learn.progress.enabled = False
    return learn

def weights(learn):
    "Every parameter, whole (a sharded one gathered), on CPU, in one flat tensor"
    ps = [p.full_tensor() if hasattr(p, 'full_tensor') else p for p in unwrap_model(learn.model).parameters()]
    return torch.cat([p.detach().float().cpu().flatten() for p in ps])

def sharded(learn)->bool:
    "Every parameter of the Learner's model is a shard (a DTensor): FSDP is on"
    return all(hasattr(p, 'full_tensor') for p in unwrap_model(learn.model).parameters())

def close(a, b, tol, name):
    d = (a - b).abs().max().item()
    assert d <= tol, f'{name}: max difference {d} > {tol}'

class Count(Callback):
    "The training batches of the fit: a resumed one has fewer than a fit from scratch"
    def before_fit(self): self.n = 0
    def after_batch(self): self.n += self.learn.training

class SetEpoch(Callback):
    "The one-process reference sets its DistributedDL's epoch itself (DistributedTrainer does under distrib_ctx)"
    def before_epoch(self):
        for dl in self.learn.dls.loaders:
            if isinstance(dl, DistributedDL): dl.set_epoch(self.learn.epoch)

def reference_dls(bs=BS):
    """The loaders of the one-process reference: the training order distrib_ctx gives W ranks (an epoch-seeded
    `DistributedDL`, seed 0), read whole by one process with the global batch (nbs/35_exactness.ipynb)"""
    dls = make_dls(bs)
    return DataLoaders(DistributedDL.from_dl(dls.train, rank=0, world_size=1), dls.valid)

def reference(bs=BS, n_epoch=2, device=DEV, model_kw={}, cbs=(), **kw):
    "The same fit in one plain process (no group, no context) on `device`, in distrib_ctx's data order"
    learn = learner(make_model(**model_kw).to(device), bs=bs, dls=reference_dls(bs), independent=True, **kw)
    learn.fit(n_epoch, cbs=[SetEpoch(), *cbs])
    return weights(learn), learn.recorder.values

def run_modes():
    if mode == 'one': one()
    elif mode in ('two', 'share', 'nccl'): several()
    elif mode == 'place': place()
    elif mode == 'fail': fail()
    elif mode == 'queued': queued()
    else: raise SystemExit(f'unknown mode {mode}')

# ---------------------------------------------------------------------------------------------------------------
def one():
    assert W == 1
    # a world of one: no group; distrib_ctx moves a CPU model to this rank's GPU (cuda:0) and trains it there, equal to
    # one plain process; the collectives answer for one
    ref_w, ref_v = reference()
    learn = learner(make_model())
    with learn.distrib_ctx(): learn.fit(2)
    assert not dist.is_initialized(), 'a world of one created a process group'
    assert next(learn.model.parameters()).device.type == DEV, next(learn.model.parameters()).device
    assert all_reduce_sum(torch.ones(3)).tolist() == [1.]*3 and gather_object(1) == [1] and broadcast_object(5) == 5
    ok('world_of_one')
    learn = learner(make_model(), dls=reference_dls())
    with learn.distrib_ctx(): learn.fit(2, cbs=SetEpoch())
    close(weights(learn), ref_w, 1e-6, 'world of one against one plain process')
    assert learn.recorder.values == ref_v
    ok('world_of_one_equals_plain')

    if True:   # float16 (a GradScaler on CPU too): a scaler that starts too high skips its first steps; the schedule
        class Skips(Callback):   # moves once a step
            order = 20
            def before_fit(self): self.taken = 0
            def after_step(self): self.taken += 1
            def after_cancel_step(self): self.taken -= 1
        learn = learner(make_model().to(DEV), cbs=[MixedPrecision('fp16', init_scale=2.**40), Skips()])
        learn.fit(1, cbs=ParamScheduler({'lr': SchedLin(0.05, 0.)}))
        n = len(learn.dls.train)
        mp, lrs = learn.mixed_precision, learn.recorder.hps['lr']
        assert mp.autocast_dtype == torch.float16 and mp.scaler is not None
        assert learn.skips.taken < n, 'no step was skipped: raise init_scale'
        close(torch.tensor(lrs), torch.tensor([0.05*(1 - k/n) for k in range(n)]), 1e-12, 'schedule over skipped steps')
        ok('fp16_skipped_step_counted')
    with tempfile.TemporaryDirectory() as d:   # the loss scale resumes (a GradScaler on CPU too)
        big = dict(init_scale=2.**40)   # a's first steps overflow: its scale ends far below the initial one
        a = learner(make_model().to(DEV), cbs=[MixedPrecision('fp16', **big), Checkpoint(d, every_n_steps=2)]); a.fit(1)
        scale = a.mixed_precision.scaler.get_scale()
        b = learner(make_model().to(DEV), cbs=[MixedPrecision('fp16', **big), ck := Checkpoint(d, every_n_steps=2),
                                              cnt := Count()])
        b.fit(1)   # resumes from the end of epoch 0: nothing left to train, the state is loaded
        assert scale < big['init_scale'] and ck.resumed_from is not None and cnt.n == 0, (scale, ck.resumed_from, cnt.n)
        assert b.mixed_precision.scaler.get_scale() == scale, (b.mixed_precision.scaler.get_scale(), scale)
    ok('fp16_scale_resumes')
    learn = learner(make_model().to(DEV), cbs=MixedPrecision('bf16'))
    learn.fit(1)
    assert learn.mixed_precision.autocast_dtype == torch.bfloat16 and learn.mixed_precision.scaler is None
    assert all(p.dtype == torch.float32 for p in learn.model.parameters()) and torch.bfloat16 in learn.model.seen
    ok('bf16')

    # Checkpoint: stopped mid-fit, resumed: bit for bit, dropout included (on a GPU the file's random states are read
    # onto the CPU: item 1)
    with tempfile.TemporaryDirectory() as d:
        set_seed(0, reproducible=True)
        full = learner(make_model(dropout=0.3).to(DEV), cbs=Checkpoint(d, every_n_steps=100)); full.fit(2)
    class Stop(Callback):
        def after_batch(self):
            if self.learn.epoch == 1 and self.learn.iter == 2: raise SystemExit('stop')
    with tempfile.TemporaryDirectory() as d:
        set_seed(0, reproducible=True)
        part = learner(make_model(dropout=0.3).to(DEV), cbs=[Checkpoint(d, every_n_steps=1), Stop()])
        try: part.fit(2)
        except SystemExit: pass
        set_seed(123, reproducible=True)   # other random states: the checkpoint's must win
        rest = learner(make_model(dropout=0.3).to(DEV), cbs=[ck := Checkpoint(d, every_n_steps=1), cnt := Count()])
        rest.fit(2)
    assert ck.resumed_from is not None and 0 < cnt.n < 2 * (N // BS), (ck.resumed_from, cnt.n)   # it resumed
    assert torch.equal(weights(rest), weights(full)), (weights(rest) - weights(full)).abs().max()
    assert rest.recorder.values == full.recorder.values
    ok('checkpoint_exact')
    torch.use_deterministic_algorithms(False)

    class Where(Callback):   # where the predictions were computed
        def before_fit(self): self.devs = set()
        def after_pred(self): self.devs.add(self.learn.pred.device.type)
    learn = learner(make_model().to(DEV), cbs=[ParamScheduler({'lr': SchedLin(1e-3, 1e-2)}), where := Where()])
    s = learn.lr_find(num_it=30, show_plot=False)
    assert 1e-7 < s.valley < 10
    assert where.devs == {DEV} and next(learn.model.parameters()).device.type == DEV, (where.devs, DEV)
    ok('lr_find')
    if CUDA: one_gpu(ref_w)
    one_fsdp(ref_w)

def one_gpu(ref_w):
    "The checks of job `one` that need CUDA itself"

    with tempfile.TemporaryDirectory() as d:   # a checkpoint saved on GPU loads on CPU, and back
        g = learner(make_model().cuda(), path=d); g.fit(1); g.save('m')
        c = learner(make_model(), path=d); c.load('m')
        assert next(c.model.parameters()).device.type == 'cpu'
        close(weights(c), weights(g), 0, 'gpu -> cpu')
        c.fit(1); c.save('m2')
        g2 = learner(make_model().cuda(), path=d); g2.load('m2')
        assert next(g2.model.parameters()).device.type == 'cuda'
        close(weights(g2), weights(c), 0, 'cpu -> gpu')
    ok('checkpoint_gpu_cpu_gpu')

    learn = learner(make_model(), dls=reference_dls())   # a CPU model: parallel_ctx moves it to device_ids[0]
    with learn.parallel_ctx(): learn.fit(2, cbs=SetEpoch())
    close(weights(learn), ref_w, 1e-5, 'parallel_ctx on one GPU')
    assert next(learn.model.parameters()).device == torch.device('cuda', 0)
    ok('parallel_ctx_one_gpu')

def one_fsdp(ref_w):
    """FSDP2 on one rank: distrib_ctx does not wrap in a world of one, so shard the model on a one-rank mesh
    (init_device_mesh creates the one-rank group from torchrun's variables); last: the group stays"""
    from torch.distributed.device_mesh import init_device_mesh
    m = make_model().to(DEV)
    shard_model(m, init_device_mesh(DEV, (1,)), shard_classes=(nn.Linear,))
    learn = learner(m, dls=reference_dls()); learn.fit(2, cbs=SetEpoch())
    assert any(hasattr(p, 'full_tensor') for p in m.parameters()), 'not sharded'
    close(weights(learn), ref_w, 1e-5, 'fsdp one rank')
    ok('fsdp_one_rank')

    # FSDPTrainer (one-rank group) after a plain epoch: on a GPU the Learner's model waits in CPU memory with its Adam
    # state while the shards train. Like with like: the reference fits twice too, every fit in the trainer's order (a
    # one-rank DistributedDL at the fit's epoch 0: a fit starts at epoch 0), Adam's state carried across
    def wide():
        torch.manual_seed(0)
        m = Seq(nn.Linear(8, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1)).to(DEV)
        m.seen = set()
        return m
    plain = learner(wide(), dls=reference_dls())
    for _ in range(2): plain.fit(1, cbs=SetEpoch())
    m = wide(); learn = learner(m, dls=reference_dls()); learn.fit(1, cbs=SetEpoch())
    P = sum(p.nbytes for p in m.parameters())
    before = torch.cuda.memory_allocated() if CUDA else 0   # the model, its Adam state (2 x P), maybe its gradients
    class During(Callback):
        def before_fit(self): self.peak, self.home, self.n = 0, next(m.parameters()).device, 0
        def after_batch(self):
            self.n += self.learn.training
            if CUDA: self.peak = max(self.peak, torch.cuda.memory_allocated())
    learn.to_distributed(strategy='fsdp', shard_classes=nn.Linear)
    try: learn.fit(1, cbs=(d := During()))
    finally: learn.detach_distributed()
    assert d.n == len(learn.dls.train) and d.home.type == 'cpu', (d.n, d.home)   # on a GPU: parked in CPU memory
    mib = lambda b: f'{b/2**20:.1f} MiB'
    if CUDA: assert d.peak < before + 2*P, f'peak {mib(d.peak)} during fit, {mib(before)} before, P={mib(P)}'
    assert next(m.parameters()).device.type == DEV and learn.model is m
    assert all(v.device.type == DEV for s in learn.opt.state.values() for v in s.values() if v.dim())
    close(weights(learn), weights(plain), 1e-5, 'fsdp trainer after a plain fit')
    ok('fsdp_model_off_gpu')

# ---------------------------------------------------------------------------------------------------------------
class Grads(Callback):
    """At the `at`-th backward of the fit: the gradients DDP left (all-reduced through the comm hook) and the mean of
    the ranks' own gradients at the same weights and batches (each rank's recomputed with a plain copy of the model),
    both on CPU, by parameter name"""
    order = 12  # after DistributedTrainer
    def __init__(self, at=0): self.at, self.n, self.got, self.mean = at, 0, None, None
    def after_backward(self):
        self.n += 1
        if self.n - 1 != self.at: return
        inner = unwrap_model(self.learn.model)
        self.got = {k: p.grad.detach().float().cpu().clone() for k, p in inner.named_parameters()}
        plain = copy.deepcopy(inner)
        plain.zero_grad(set_to_none=True)
        F.mse_loss(plain(*self.learn.xb), *self.learn.yb).backward()
        mine = {k: p.grad.detach().float().cpu() for k, p in plain.named_parameters()}
        every = gather_object(mine)
        self.mean = {k: sum(g[k] for g in every) / len(every) for k in mine}

def bf16_like(state, bucket):
    "torch's bf16_compress_hook's arithmetic, for gloo (DDP refuses torch's own without NCCL): the check's reference on CPU"
    buf = bucket.buffer()
    fut = dist.all_reduce(buf.to(torch.bfloat16).div_(W), async_op=True).get_future()
    return fut.then(lambda f: buf.copy_(f.value()[0]))

def hook_grads(device, hook=None, state=None, at=0, manual=None):
    "`Grads` of a 1-epoch fit under comm hook `hook` (`manual`: a hook function registered on the DDP model directly)"
    learn = learner(make_model().to(device), bs=BS // W)
    g = Grads(at)
    with learn.distrib_ctx(device=device, comm_hook=hook, comm_hook_state=state):
        if manual is not None: learn.model.register_comm_hook(None, manual)
        learn.fit(1, cbs=g)
    return g

def check_rounded(g:Grads, dtype, name:str):
    """Every gradient is the mean of the ranks' gradients rounded to `dtype` (the hook divides by W and sums in
    `dtype`): exactly representable in `dtype`, and within a few of its rounding steps of the true mean"""
    eps = torch.finfo(dtype).eps
    for k, got in g.got.items():
        want = g.mean[k]
        assert torch.equal(got.to(dtype).float(), got), f'{name}: {k} is not rounded to {dtype}'
        tol = 4*eps*want.abs().max().item() + torch.finfo(dtype).tiny
        close(got, want, tol, f'{name}: {k} against the mean of the ranks\' gradients')

def several():
    local = current_world().local_rank
    backend = None if mode == 'two' else 'gloo' if mode == 'share' else 'nccl'
    if CUDA: device = torch.device('cuda', 0 if mode == 'share' else local)
    else: device = torch.device('cpu')
    setup_distrib(device=device if mode != 'two' else None, backend=backend, timeout=120)
    if mode == 'two':   # the default backend, and device='cuda' left to distrib (item 4)
        assert (group_backend('cpu'), group_backend('cuda')) == (('gloo', 'nccl') if CUDA else ('gloo', 'gloo'))
        ctx_device = 'cuda' if CUDA else None
        if CUDA: assert torch.cuda.current_device() == local
        ok('default_backend')
    else: ctx_device = device
    if mode != 'share':   # torch's timeouts: gloo's the group's, NCCL's with a grace, in distrib_timeout too (item 7)
        def timeouts():
            pg = dist.group.WORLD
            return {t: pg._get_backend(torch.device(t)).options._timeout.total_seconds() for t in ('cpu', 'cuda')
                    if group_backend(t)}
        grace = lambda t: max(60., t / 10)   # NCCL's backstop, as documented (08_runtime.group): max(60 s, 10 %)
        want = lambda t: {d: t + (grace(t) if group_backend(d) == 'nccl' else 0) for d in ('cpu', 'cuda')
                          if group_backend(d)}
        assert timeouts() == want(120), (timeouts(), want(120))
        with distrib_timeout(30): assert timeouts() == want(30), (timeouts(), want(30))
        assert timeouts() == want(120), (timeouts(), want(120))
        if CUDA: assert timeouts()['cuda'] == 180
        ok(f'{mode}_group_timeouts')
    ref_w, ref_v = reference(device=device)   # one process with the global batch, on this rank's device
    learn = learner(make_model().to(device), bs=BS // W)
    with learn.distrib_ctx(device=ctx_device): learn.fit(2)
    close(weights(learn), ref_w, 1e-5, f'{mode}: W={W} against one process')
    for a, b in zip(learn.recorder.values, ref_v): close(torch.tensor(a), torch.tensor(b), 1e-5, f'{mode} values')
    ok(f'{mode}_equals_one_process')
    if mode in ('share', 'two'):   # compile=True (on CPU too: inductor's C++ kernels, a few seconds)
        from torch._dynamo.utils import counters
        graphs = lambda: counters['stats'].get('unique_graphs', 0)
        learn, n0 = learner(make_model().to(device), bs=BS // W), graphs()
        with learn.distrib_ctx(device=ctx_device, compile=True): learn.fit(2)
        assert graphs() > n0, f'{mode}: compile=True compiled no graph'
        close(weights(learn), ref_w, 1e-4, f'{mode}: compile=True')
        ok(f'{mode}_compile')
    if mode == 'share': return
    if mode == 'nccl':   # FSDP's pre-flight with NCCL alone (no CPU backend): item 5
        learn = learner(make_model(), bs=BS // W)   # on the CPU: FSDPTrainer moves it
        with learn.distrib_ctx(device=device, strategy='fsdp', shard_classes=nn.Linear):
            learn.fit(2)
            assert sharded(learn), 'strategy=fsdp under backend nccl: the model is not sharded'
        close(weights(learn), ref_w, 1e-5, 'fsdp under backend nccl')
        ok('nccl_fsdp')
        return

    # comm hooks, each against its own reference (item 11)
    g = hook_grads(ctx_device)
    for k in g.got: close(g.got[k], g.mean[k], 1e-6, f'no hook: {k}')
    ok('comm_hook_none')
    g = hook_grads(ctx_device, 'fp16')
    check_rounded(g, torch.float16, 'fp16 hook')
    ok('comm_hook_fp16')
    if CUDA: g = hook_grads(ctx_device, 'bf16')
    else:    # gloo: distrib refuses comm_hook='bf16' (torch's hook needs NCCL); the check's reference, with torch's hook
        try: hook_grads(ctx_device, 'bf16'); raise AssertionError("comm_hook='bf16' not refused under gloo")
        except TypeError: pass
        g = hook_grads(ctx_device, manual=bf16_like)
    check_rounded(g, torch.bfloat16, 'bf16 hook')
    ok('comm_hook_bf16')
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2)
    g = hook_grads(ctx_device, 'powersgd', state, at=2)   # the third backward: the first compressed one
    sv, sv_ref = torch.linalg.svdvals(g.got['0.weight']), torch.linalg.svdvals(g.mean['0.weight'])
    assert sv[1] <= 1e-4*sv[0], f'powersgd: the 16x8 weight gradient has rank > 1 (singular values {sv.tolist()})'
    assert sv_ref[1] >= 1e-2*sv_ref[0], 'powersgd: the uncompressed gradient has rank 1 too: the check cannot fail'
    close(g.got['0.bias'], g.mean['0.bias'], 1e-5, 'powersgd: a vector (uncompressed) is the mean')
    ok('comm_hook_powersgd')

    # SyncBatchNorm: rank 0's running statistics after the first batch, before after_train copies them to every
    # rank, are the global batch's (item 11); without SyncBatchNorm (CPU) they are not: the check can fail
    class Stats(Callback):
        order = 60
        def after_batch(self):
            if self.learn.training and self.learn.iter == 0 and not hasattr(self, 'mean'):
                self.mean = unwrap_model(self.learn.model)[1].running_mean.detach().cpu().clone()
    ref = learner(make_model(bn=True).to(device), dls=reference_dls(), independent=True)
    ref.fit(1, cbs=[SetEpoch(), rs := Stats()])
    learn = learner(make_model(bn=True).to(device), bs=BS // W)
    with learn.distrib_ctx(device=ctx_device, sync_bn=CUDA): learn.fit(1, cbs=(st := Stats()))
    assert type(unwrap_model(learn.model)[1]) is nn.BatchNorm1d   # reverted on exit
    d = (st.mean - rs.mean).abs().max().item()
    if CUDA: assert d <= 1e-5, f'sync_bn: rank {rank} running mean differs from the global batch\'s by {d}'
    else: assert d > 1e-3, f'without SyncBatchNorm the local statistics equal the global ones ({d}): the check cannot fail'
    ok('sync_bn' if CUDA else 'sync_bn_reference')

    # MixedPrecision('fp16') under DDP: equal to one process under the same MixedPrecision. Like with like: a fixed
    # loss scale (no growth within the fit, low enough that no step overflows), so that both take every step; with
    # a dynamic scale starting at 2**16, W ranks of BS/W rows overflow at other steps than one process of BS rows
    fixed = dict(init_scale=2.**8, growth_interval=10**6)
    ref = learner(make_model().to(device), dls=reference_dls(), independent=True, cbs=MixedPrecision('fp16', **fixed))
    ref.fit(2, cbs=SetEpoch())
    learn = learner(make_model().to(device), bs=BS // W, cbs=MixedPrecision('fp16', **fixed))
    with learn.distrib_ctx(device=ctx_device): learn.fit(2)
    assert learn.mixed_precision.device_type == DEV and torch.float16 in unwrap_model(learn.model).seen
    for who, l in (('W ranks', learn), ('one process', ref)):   # a skipped step halves the scale
        assert l.mixed_precision.scaler.get_scale() == fixed['init_scale'], f'{who} skipped a step: the scale is ' \
            f'{l.mixed_precision.scaler.get_scale()}'
    close(weights(learn), weights(ref), 1e-3, "MixedPrecision('fp16') under DDP")
    ok('mixed_precision_ddp')

    # Checkpoint under DDP: stopped at a batch, resumed: equal to the uninterrupted fit (item 12)
    class Stop(Callback):
        def after_batch(self):
            if self.learn.epoch == 1 and self.learn.iter == 1: raise SystemExit('stop')
    d = broadcast_object(tempfile.mkdtemp(dir=out) if rank == 0 else None)
    learn = learner(make_model().to(device), bs=BS // W, cbs=[Checkpoint(d, every_n_steps=1), Stop()])
    try:
        with learn.distrib_ctx(device=ctx_device): learn.fit(2)
    except SystemExit: pass
    learn = learner(make_model().to(device), bs=BS // W, cbs=[ck := Checkpoint(d, every_n_steps=1), cnt := Count()])
    with learn.distrib_ctx(device=ctx_device): learn.fit(2)
    full = 2 * (N // BS)   # training batches of a whole fit, on each rank
    assert ck.resumed_from is not None and 0 < cnt.n < full, \
        f'not resumed: {cnt.n} training batches of {full} (resumed from {ck.resumed_from})'
    close(weights(learn), ref_w, 1e-5, 'checkpoint resumed under DDP')
    ok('checkpoint_ddp')

    # get_preds and AccumMetric: every sample once, in dataset order, as one process computes them
    med = lambda p, t: (p - t).abs().median()
    learn = learner(make_model().to(device), bs=BS // W, metrics=AccumMetric(med, flatten=False))
    with learn.distrib_ctx(device=ctx_device):
        learn.fit(1)
        preds, targs = learn.get_preds()
        vals = learn.validate()
    m = unwrap_model(learn.model).eval()
    x, y = data(32, 1).tensors
    with torch.no_grad(): want = m(x.to(m[0].weight.device)).float().cpu()
    assert torch.equal(targs.cpu(), y) and len(preds) == 32
    close(preds.float().cpu(), want, 1e-5, 'get_preds')
    close(torch.tensor(vals[1]), med(want, y), 1e-5, 'AccumMetric')
    ok('get_preds_accum_metric')

    # FSDP over the W ranks, equal to one process; on GPUs with cpu_offload and MixedPrecision too (item 5)
    learn = learner(make_model(), bs=BS // W)
    with learn.distrib_ctx(device=ctx_device, strategy='fsdp', shard_classes=nn.Linear):
        learn.fit(2)
        assert sharded(learn), 'strategy=fsdp: the model is not sharded'
    close(weights(learn), ref_w, 1e-5, 'fsdp')
    ok('fsdp')
    if CUDA:
        class Shards(Callback):   # during fit: where each shard is, where the batch computed
            order = 60
            def before_fit(self): self.shards, self.preds = set(), set()
            def after_pred(self): self.preds.add(self.learn.pred.device.type)
            def after_batch(self): self.shards |= {p.to_local().device.type for p in self.learn.model.parameters()}
        learn = learner(make_model(), bs=BS // W)
        with learn.distrib_ctx(device=ctx_device, strategy='fsdp', shard_classes=nn.Linear, cpu_offload=True):
            learn.fit(2, cbs=(sh := Shards()))
        assert sh.shards == {'cpu'} and sh.preds == {'cuda'}, f'shards on {sh.shards}, computed on {sh.preds}'
        close(weights(learn), ref_w, 1e-5, 'fsdp cpu_offload')
        ok('fsdp_cpu_offload')
        learn = learner(make_model(), bs=BS // W, cbs=MixedPrecision())
        with learn.distrib_ctx(device=ctx_device, strategy='fsdp', shard_classes=nn.Linear, cpu_offload=True):
            learn.fit(1)
            mp = learn.mixed_precision
            assert mp.device_type == 'cuda' and mp.autocast_dtype == torch.float16 and mp.scaler is not None, \
                (mp.device_type, mp.autocast_dtype, mp.scaler)
            assert sharded(learn) and torch.float16 in unwrap_model(learn.model).seen, unwrap_model(learn.model).seen
        ok('fsdp_offload_mixed_precision')

        # DataParallel over two GPUs, from a CPU model, under MixedPrecision('bf16') (item 6)
        if rank == 0:
            learn = learner(make_model(), dls=reference_dls(), independent=True, cbs=MixedPrecision('bf16'))
            with learn.parallel_ctx([0, 1]):
                assert isinstance(learn.model, nn.DataParallel) and learn.model.device_ids == [0, 1]
                learn.fit(2, cbs=SetEpoch())
            assert unwrap_model(learn.model).seen == {torch.bfloat16}, unwrap_model(learn.model).seen
            bf_w, _ = reference(cbs=[MixedPrecision('bf16')], device='cuda:0')
            close(weights(learn), bf_w, 1e-2, 'DataParallel over two GPUs, bf16')
        ok('dataparallel_two_gpus')

def place():   # under `--gpus 0`: this process sees GPU 0 alone, and trains there
    seen = os.environ.get('CUDA_VISIBLE_DEVICES')
    assert seen == '0' and torch.cuda.device_count() == 1, seen
    learn = learner(make_model())
    with learn.distrib_ctx(): learn.fit(1)
    assert next(learn.model.parameters()).device == torch.device('cuda', 0)
    ok('placed')

def fail():   # W >= 2 ranks, a GPU each: NCCL
    assert 2 <= W <= torch.cuda.device_count(), f'{W} ranks, {torch.cuda.device_count()} GPU(s): needs a GPU per rank'
    device = torch.device('cuda', current_world().local_rank)
    torch.cuda.set_device(device)
    setup_distrib(backend='nccl', timeout=30)
    t = torch.ones(1, device=device)
    dist.all_reduce(t)   # NCCL runs: a CUDA tensor, a group whose CUDA backend is NCCL
    assert group_backend('cuda') == 'nccl' and t.item() == W, (group_backend('cuda'), t.item())
    ok('fail_nccl_ran')
    class Bad(Callback):
        def before_batch(self):
            if rank == W - 1 and self.learn.iter == 2: raise ValueError('bad batch on purpose')
    learn = learner(make_model().to(device), bs=BS // W, cbs=Bad())
    with learn.distrib_ctx(device=device): learn.fit(1)

# ---------------------------------------------------------------------------------------------------------------
def until(pred, secs:float=30.):
    "`pred()`'s first true value, polled every 0.1 s for at most `secs` seconds; None after that"
    end = time.monotonic() + secs
    while time.monotonic() < end:
        if v := pred(): return v
        time.sleep(0.1)
    return None

def queued():
    """Issue 34's item 7: NCCL's collectives return once queued on the GPU; the watchdog shows the rank waiting in the
    oldest one not done (a CUDA event `query()`d from its thread, never synchronised) once `CheckMemory.hold` passed.
    Rank 1 holds (a store key it waits for, with a timeout: never a hang) while rank 0's collective is queued; what
    each rank finds wrong is gathered and raised on every rank at the end of each part. Assertions marked CUDA need
    NCCL; on CPU a gloo `async_op=True` all-reduce, `mark_queued(done=work.is_completed)`, stands for NCCL's."""
    from distrib.runtime.position import rank_state, doing, mark_queued, describe
    from distrib.runtime.liveness import running
    from distrib.runtime.schema import JobStore
    assert W == 2, W
    if CUDA:   # torch's blocking wait makes `Work.wait()` block the host until the peers came: nothing is queued
        blocking = [v for v in ('TORCH_NCCL_BLOCKING_WAIT', 'NCCL_BLOCKING_WAIT') if os.environ.get(v, '0') != '0']
        assert not blocking, f'{blocking} set: unset it (ProcessGroupNCCL then blocks the host in wait())'
        device = torch.device('cuda', current_world().local_rank)
        torch.cuda.set_device(device)
    else: device = torch.device('cpu')
    setup_distrib(device=device, backend='nccl' if CUDA else 'gloo', timeout=60)
    st = rank_state()
    assert running(), 'liveness does not run: no heartbeat to read'
    assert st.here.track_queued == CUDA, f'queue tracking is {st.here.track_queued} under {group_backend("cuda")}'
    store = dist.PrefixStore('gpu_test/queued/', st.job.store)   # the control keys, beside liveness's own
    hb = lambda r: JobStore(st.job.store).heartbeat(r)  # rank r's heartbeat as the peers read it
    errs = []
    def settle(name:str):   # every rank raises what any rank found; rank 0 prints the check
        bad = [e for es in gather_object(errs) for e in es]
        assert not bad, f'{name}: ' + '; '.join(bad)
        errs.clear()
        ok(name)
    # a first collective, done: NCCL's communicator (formed in setup_distrib, which gives it device_id) is warm
    all_reduce_sum(torch.ones(1, device=device))
    if CUDA: torch.cuda.synchronize()

    # 1. all_reduce_sum (64 MiB on a GPU): rank 0's main thread goes on while rank 1 holds
    n = (16 << 20) if CUDA else (1 << 16)
    x = torch.full((n,), float(rank + 1), device=device)
    def says_queued(h):
        p = h.pos
        if not (p.get('queued') and p.get('op') == 'collective' and p.get('name') == 'all_reduce_sum'): return None
        return h
    if rank == 0:
        if CUDA:
            y = all_reduce_sum(x)   # distrib's doing('collective') block records a CUDA event as it ends
            mine = torch.cuda.Event(); mine.record()   # queried only: done with the all-reduce (same stream)
            done = mine.query
        else:
            with doing('collective', 'all_reduce_sum'): work = dist.all_reduce(y := x.clone(), async_op=True)
            mark_queued('all_reduce_sum', done=work.is_completed, ident=st.here.colls)
            done = work.is_completed
        if store.check(['A/joining']): errs.append('the main thread was blocked in all_reduce_sum until rank 1 came')
        if done(): errs.append('the all-reduce is done before rank 1 joined it: nothing was queued')  # CUDA: on the GPU
        store.set('A/returned', '1')
        if not until(lambda: store.check(['A/joining']), 60): errs.append('rank 1 never joined')
        h = until(lambda: (h := hb(0)) and not h.pos.get('queued') and h)
        if h is None: errs.append('the heartbeat still says queued 30 s after rank 1 joined')
        elif not done(): errs.append(f'the heartbeat stopped saying queued before the all-reduce was done: {h}')
        if not CUDA: work.wait()
        if not bool((y == 3).all()): errs.append(f'the all-reduce summed to {y.unique().tolist()}, not 3')
    else:
        h = until(lambda: says_queued(hb(0)))
        if h is None: errs.append(f"rank 0's heartbeat never said it waits in all_reduce_sum, queued: {hb(0)}")
        else:
            where = describe(h.pos)
            if 'the collective all_reduce_sum, queued and not done (its main thread has gone on to its script' \
               not in where: errs.append(f'rank 0 is shown as {where!r}')
            if h.age < st.memo.hold - 0.05: errs.append(f"shown queued {h.age} s after it queued, before the hold")
            if not store.check(['A/returned']): errs.append("rank 0's main thread had not returned")
        store.set('A/joining', '1')   # joins whatever was found: rank 0 is never left waiting
        y = all_reduce_sum(x)
        if not bool((y == 3).all()): errs.append(f'the all-reduce summed to {y.unique().tolist()}, not 3')
    settle('queued_all_reduce')

    # 2. DDP's gradient all-reduce (distrib_ctx): rank 1 holds before its backward of training batch 1. On CUDA
    # rank 0's backward returns with it queued; on CPU gloo's backward blocks until rank 1 joins (the reference:
    # the check of the main thread can fail)
    at = lambda learn: learn.training and learn.epoch == 0 and learn.iter == 1
    def in_ddp(h):
        p = h.pos
        here = p.get('event') == 'backward' and p.get('sync') and p.get('batch') == 1 and p.get('training')
        return h if here and (p.get('queued') or not CUDA) else None
    class Hold(Callback):
        order = 12   # after DistributedTrainer (11), whose after_backward marks DDP's all-reduce queued
        def before_backward(self):
            if rank != 1 or not at(self.learn): return
            h = until(lambda: in_ddp(hb(0)))
            if h is None: errs.append(f"rank 0's heartbeat never said it waits in DDP's all-reduce: {hb(0)}")
            elif CUDA and 'after_backward (epoch 0, training batch 1)' not in h.pos.get('main', ''):
                errs.append(f"rank 0's main thread is shown at {h.pos.get('main')!r}")
            store.set('B/joining', '1')
        def after_backward(self):
            if rank != 0 or not at(self.learn): return
            came = store.check(['B/joining'])
            if not CUDA:
                if not came: errs.append("gloo's backward returned before rank 1 joined: the reference is wrong")
                return
            if came: errs.append("the main thread was blocked in DDP's backward until rank 1 came")   # CUDA
            mine = torch.cuda.Event(); mine.record()
            if mine.query(): errs.append("DDP's all-reduce is done before rank 1 joined: nothing was queued")
            if not until(lambda: store.check(['B/joining']), 60): errs.append('rank 1 never joined')
            h = until(lambda: (h := hb(0)) and not h.pos.get('queued') and h)
            if h is None: errs.append('the heartbeat still says queued 30 s after rank 1 joined')
            elif not mine.query(): errs.append(f'the heartbeat stopped saying queued before the all-reduce was done')
    learn = learner(make_model().to(device), bs=BS // W, cbs=Hold())
    with learn.distrib_ctx(device=device if CUDA else None): learn.fit(1)
    settle('queued_ddp_backward' if CUDA else 'queued_ddp_reference')

run_modes()
