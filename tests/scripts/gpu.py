"""GPU checks, several per job (GPU time is scarce): `python -m distrib.launch --nproc_per_node W gpu.py MODE OUT`
prints 'CHECK <name> OK' (rank 0) for every check that passed; a failed check raises, naming it.

MODE:
- `one`: one process (W=1), one GPU: NCCL group of one, MixedPrecision float16/bf16, Checkpoint on CUDA, a GPU
  checkpoint loaded on CPU and back, parallel_ctx, FSDP on one rank (the Learner's model off the GPU meanwhile),
  compile, lr_find.
- `share`: W=2 processes sharing GPU 0 over gloo: equal to one process with the global batch.
- `nccl`: W=2 processes, one GPU each, NCCL: equal to one process; sync_bn; DataParallel over two GPUs; DDP's
  fp16/bf16/PowerSGD hooks.
- `place`: one process started with `--gpus 0` sees GPU 0 alone and trains there.
- `fail`: rank W-1 raises in `before_batch` (the launcher must name it); NCCL when there is a GPU per rank.
"""
import os, sys, tempfile
from pathlib import Path
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from distrib import (Learner, DataLoaders, Callback, Checkpoint, MixedPrecision, set_seed, setup_distrib,
                     ParamScheduler, SchedLin,
                     all_reduce_sum, gather_object, broadcast_object, rank_distrib, num_distrib, current_world,
                     unwrap_model, shard_model)

os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')  # before cuBLAS starts: deterministic checks
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

def make_model(bn=False, dropout=0.):
    torch.manual_seed(0)
    layers = [nn.Linear(8, 16)] + ([nn.BatchNorm1d(16)] if bn else [])
    return Seq(*layers, nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 1))

class Seq(nn.Sequential):
    def forward(self, x): return super().forward(x).squeeze(-1)

def learner(model=None, bs=BS, **kw):
    learn = Learner(make_dls(bs), model if model is not None else make_model(), F.mse_loss, lr=1e-2, **kw)
    learn.logger = lambda *a: None
    learn.progress.enabled = False
    return learn

def weights(learn):
    "Every parameter, whole (a sharded one gathered), on CPU, in one flat tensor"
    ps = [p.full_tensor() if hasattr(p, 'full_tensor') else p for p in unwrap_model(learn.model).parameters()]
    return torch.cat([p.detach().float().cpu().flatten() for p in ps])

def close(a, b, tol, name):
    d = (a - b).abs().max().item()
    assert d <= tol, f'{name}: max difference {d} > {tol}'

def reference(bs=BS, n_epoch=2, device='cuda:0', **kw):
    "The same fit in one plain process (no group, no context) on `device`"
    learn = learner(make_model(**kw).to(device), bs=bs, independent=True)   # alone, also in a world of several
    learn.fit(n_epoch)
    return weights(learn), learn.recorder.values

if mode == 'one':
    assert W == 1
    torch.cuda.set_device(0)
    # a one-rank NCCL group: collectives on CUDA tensors, and a fit that equals one plain process
    setup_distrib(backend='nccl', timeout=60)
    assert torch.distributed.get_backend() == 'nccl'
    t = all_reduce_sum(torch.ones(3, device='cuda'))
    assert t.device.type == 'cuda' and t.tolist() == [1., 1., 1.]
    assert gather_object({'r': rank}) == [{'r': 0}] and broadcast_object(5) == 5
    ref_w, ref_v = reference()
    learn = learner(make_model().cuda())
    with learn.distrib_ctx(): learn.fit(2)
    close(weights(learn), ref_w, 1e-6, 'nccl one rank')
    assert learn.recorder.values == ref_v
    ok('nccl_one_rank')

    # float16: a scaler that starts too high skips its first steps; the schedule still moves once per step
    class Skips(Callback):
        order = 20
        def before_fit(self): self.taken = 0
        def after_step(self): self.taken += 1
        def after_cancel_step(self): self.taken -= 1
    learn = learner(make_model().cuda(), cbs=[MixedPrecision('fp16', init_scale=2.**40), Skips()])
    learn.fit(1, cbs=ParamScheduler({'lr': SchedLin(0.05, 0.)}))
    n = len(learn.dls.train)
    mp, lrs = learn.mixed_precision, learn.recorder.hps['lr']
    assert mp.autocast_dtype == torch.float16 and mp.scaler is not None
    assert learn.skips.taken < n, 'no step was skipped: raise init_scale'
    close(torch.tensor(lrs), torch.tensor([0.05*(1 - k/n) for k in range(n)]), 1e-12, 'schedule over skipped steps')
    ok('fp16_skipped_step_counted')
    with tempfile.TemporaryDirectory() as d:
        a = learner(make_model().cuda(), cbs=[MixedPrecision(), Checkpoint(d, every_n_steps=2)]); a.fit(1)
        scale = a.mixed_precision.scaler.get_scale()
        b = learner(make_model().cuda(), cbs=[MixedPrecision(), Checkpoint(d, every_n_steps=2)])
        b.fit(1)   # resumes from the end of epoch 0: nothing left to train, the state is loaded
        assert b.mixed_precision.scaler.get_scale() == scale, (b.mixed_precision.scaler.get_scale(), scale)
    ok('fp16_scale_resumes')
    learn = learner(make_model().cuda(), cbs=MixedPrecision('bf16'))
    learn.fit(1)
    assert learn.mixed_precision.autocast_dtype == torch.bfloat16 and learn.mixed_precision.scaler is None
    assert all(p.dtype == torch.float32 for p in learn.model.parameters())
    ok('bf16')

    # Checkpoint: killed mid-fit (CancelFitException at a batch), resumed: bit for bit, CUDA dropout included
    with tempfile.TemporaryDirectory() as d:   # the same loader (Checkpoint's) and random streams as below
        set_seed(0, reproducible=True)
        full = learner(make_model(dropout=0.3).cuda(), cbs=Checkpoint(d, every_n_steps=100)); full.fit(2)
    class Stop(Callback):
        def after_batch(self):
            if self.learn.epoch == 1 and self.learn.iter == 2: raise SystemExit('stop')
    with tempfile.TemporaryDirectory() as d:
        set_seed(0, reproducible=True)
        part = learner(make_model(dropout=0.3).cuda(), cbs=[Checkpoint(d, every_n_steps=1), Stop()])
        try: part.fit(2)
        except SystemExit: pass
        set_seed(123, reproducible=True)   # other random states: the checkpoint's must win
        rest = learner(make_model(dropout=0.3).cuda(), cbs=Checkpoint(d, every_n_steps=1)); rest.fit(2)
    assert torch.equal(weights(rest), weights(full)), (weights(rest) - weights(full)).abs().max()
    assert rest.recorder.values == full.recorder.values
    ok('checkpoint_cuda_exact')
    torch.use_deterministic_algorithms(False)

    # a checkpoint saved on GPU loads on CPU, and back
    with tempfile.TemporaryDirectory() as d:
        g = learner(make_model().cuda(), path=d); g.fit(1); g.save('m')
        c = learner(make_model(), path=d); c.load('m')
        assert next(c.model.parameters()).device.type == 'cpu'
        close(weights(c), weights(g), 0, 'gpu -> cpu')
        c.fit(1); c.save('m2')
        g2 = learner(make_model().cuda(), path=d); g2.load('m2')
        assert next(g2.model.parameters()).device.type == 'cuda'
        close(weights(g2), weights(c), 0, 'cpu -> gpu')
    ok('checkpoint_gpu_cpu_gpu')

    learn = learner(make_model().cuda())
    with learn.parallel_ctx(): learn.fit(2)
    close(weights(learn), ref_w, 1e-5, 'parallel_ctx on one GPU')
    assert isinstance(learn.model, nn.Module) and not isinstance(learn.model, nn.DataParallel)
    ok('parallel_ctx_one_gpu')

    # FSDP2 on one rank (distrib_ctx does nothing in a world of one: shard the model on the one-rank NCCL mesh)
    from torch.distributed.device_mesh import init_device_mesh
    m = make_model().cuda()
    shard_model(m, init_device_mesh('cuda', (1,)), shard_classes=(nn.Linear,))
    learn = learner(m); learn.fit(2)
    assert any(hasattr(p, 'full_tensor') for p in m.parameters()), 'not sharded'
    close(weights(learn), ref_w, 1e-5, 'fsdp one rank')
    ok('fsdp_one_rank')

    # FSDPTrainer (on the one-rank NCCL group): the Learner's model, on the GPU, waits in CPU memory with its Adam state
    # while the shards train, so the GPU never holds it whole beside them; after, it is back on the GPU, trained
    def wide():
        torch.manual_seed(0)
        return Seq(nn.Linear(8, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1)).cuda()
    plain = learner(wide()); plain.fit(2)
    m = wide(); learn = learner(m); learn.fit(1)
    P = sum(p.nbytes for p in m.parameters())
    before = torch.cuda.memory_allocated()   # the model, its Adam state (2 x P), maybe its gradients
    class During(Callback):
        def before_fit(self): self.peak, self.home = 0, next(m.parameters()).device
        def after_batch(self): self.peak = max(self.peak, torch.cuda.memory_allocated())
    learn.to_distributed(strategy='fsdp', shard_classes=nn.Linear)
    try: learn.fit(1, cbs=(d := During()))
    finally: learn.detach_distributed()
    assert d.home.type == 'cpu', f"the Learner's model stayed on {d.home} during fit"
    # shards + gradients + Adam state = 4 x P here; with the whole model and its state on the GPU too, 7 x P or more
    mib = lambda b: f'{b/2**20:.1f} MiB'
    assert d.peak < before + 2*P, f'peak {mib(d.peak)} during fit, {mib(before)} before, P={mib(P)}'
    assert next(m.parameters()).device.type == 'cuda' and learn.model is m
    assert all(v.device.type == 'cuda' for s in learn.opt.state.values() for v in s.values() if v.dim())
    close(weights(learn), weights(plain), 1e-5, 'fsdp trainer, model parked on CPU')
    ok('fsdp_model_off_gpu')

    learn = learner(make_model().cuda())
    s = learn.lr_find(num_it=30, show_plot=False)
    assert 1e-7 < s.valley < 10 and next(learn.model.parameters()).device.type == 'cuda'
    ok('lr_find')

elif mode in ('share', 'nccl'):
    n_gpu = torch.cuda.device_count()
    local = current_world().local_rank
    device = torch.device('cuda', 0 if mode == 'share' else local)
    torch.cuda.set_device(device)
    setup_distrib(backend='gloo' if mode == 'share' else 'nccl', timeout=60)
    ref_w, ref_v = reference(device=device)   # one process with the global batch, on this rank's GPU
    learn = learner(make_model().to(device), bs=BS // W)
    with learn.distrib_ctx(device=device): learn.fit(2)
    close(weights(learn), ref_w, 1e-5, f'{mode}: W={W} against one process')
    for a, b in zip(learn.recorder.values, ref_v): close(torch.tensor(a), torch.tensor(b), 1e-5, f'{mode} values')
    ok(f'{mode}_equals_one_process')
    learn = learner(make_model().to(device), bs=BS // W)
    with learn.distrib_ctx(device=device, compile=True): learn.fit(2)
    close(weights(learn), ref_w, 1e-4, f'{mode}: compile=True')
    ok(f'{mode}_compile')
    if mode == 'nccl':
        for hook in ('fp16', 'bf16', 'powersgd'):
            learn = learner(make_model().to(device), bs=BS // W)
            with learn.distrib_ctx(device=device, comm_hook=hook): learn.fit(1)
            ws = gather_object(weights(learn))
            assert all(torch.equal(ws[0], w) for w in ws), f'{hook}: ranks differ'
            assert torch.isfinite(ws[0]).all()
            ok(f'comm_hook_{hook}')
        learn = learner(make_model(bn=True).to(device), bs=BS // W)
        with learn.distrib_ctx(device=device, sync_bn=True): learn.fit(1)
        bn = unwrap_model(learn.model)[1]
        assert type(bn) is nn.BatchNorm1d   # reverted on exit
        stats = gather_object(torch.cat([bn.running_mean, bn.running_var]).cpu())
        assert all(torch.allclose(stats[0], s) for s in stats), 'SyncBatchNorm: running statistics differ'
        ok('sync_bn')
        if rank == 0:
            learn = learner(make_model().cuda(0), independent=True)
            with learn.parallel_ctx([0, 1]):
                assert isinstance(learn.model, nn.DataParallel) and learn.model.device_ids == [0, 1]
                learn.fit(2)
            close(weights(learn), reference(device='cuda:0')[0], 1e-5, 'DataParallel over two GPUs')
        ok('dataparallel_two_gpus')

elif mode == 'place':   # under `--gpus 0`: this process sees GPU 0 alone, and trains there
    seen = os.environ.get('CUDA_VISIBLE_DEVICES')
    assert seen == '0' and torch.cuda.device_count() == 1, seen
    learn = learner(make_model())
    with learn.distrib_ctx(): learn.fit(1)
    assert next(learn.model.parameters()).device == torch.device('cuda', 0)
    ok('placed')

elif mode == 'fail':
    n_gpu = torch.cuda.device_count()
    local = current_world().local_rank
    nccl = W <= n_gpu
    device = torch.device('cuda', local if nccl else 0)
    torch.cuda.set_device(device)
    setup_distrib(backend='nccl' if nccl else 'gloo', timeout=30)
    class Bad(Callback):
        def before_batch(self):
            if rank == W - 1 and self.learn.iter == 2: raise ValueError('bad batch on purpose')
    learn = learner(make_model().to(device), bs=BS // W, cbs=Bad())
    with learn.distrib_ctx(device=device): learn.fit(1)
