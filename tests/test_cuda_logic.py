"""The device logic of the CUDA paths, on CPU: where it only asks torch about CUDA (`torch.cuda.is_available`,
`device_count`, the group's backends), CUDA's answers are substituted (monkeypatch), so that the decisions a GPU
machine would take are checked here; what only a GPU can run is in test_gpu.py (issue 34)."""
import datetime, os, re, socket, tempfile, threading, types
import pytest, torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from distrib import Learner, DataLoaders, Checkpoint, World
from distrib.runtime import group as G, collectives as CO
from distrib.strategies import ddp as D, dp as P, context as C
from distrib.model import model_device, move_model
from distrib import env as E
from distrib.launch import notebook as NB

@pytest.fixture
def gpus(monkeypatch):
    "Make torch answer as on a machine with `n` visible GPUs: `gpus(n)`; set_device calls are recorded in `.set`"
    calls = types.SimpleNamespace(set=[])
    def make(n:int):
        monkeypatch.setattr(torch.cuda, 'is_available', lambda: n > 0)
        monkeypatch.setattr(torch.cuda, 'device_count', lambda: n)
        monkeypatch.setattr(torch.cuda, 'set_device', lambda d: calls.set.append(torch.device(d)))
        monkeypatch.setattr(torch.cuda, 'current_device', lambda: 0)
        return calls
    return make

def cuda(i): return torch.device('cuda', i)

# item 4: the device of a rank
@pytest.mark.parametrize('n, local, device, want', [
    (4, 1, None, cuda(1)),      # every process sees the node's 4 GPUs: one each, by local rank
    (1, 3, None, cuda(0)),      # one GPU per task (Slurm --gpus-per-task=1, CUDA_VISIBLE_DEVICES per rank)
    (2, 3, None, cuda(1)),      # two GPUs per task: local rank modulo (torchtitan's rule)
    (4, 2, 'cuda', cuda(2)),    # 'cuda' without an index is this rank's GPU, not cuda:0 for all
    (4, 2, 'cuda:3', cuda(3)), (4, 2, 1, cuda(1)), (4, 2, 'cpu', torch.device('cpu')),
    (0, 2, None, None), (0, 0, 'cpu', torch.device('cpu'))])
def test_rank_device(gpus, n, local, device, want):
    gpus(n)
    w = World(local, 8, local, 4)
    assert G.rank_device(device, w) == want
    if device is None: assert E.local_device(w) == str(want or 'cpu')   # python -m distrib.env says the same

def test_rank_device_errors(gpus):
    gpus(2)
    with pytest.raises(ValueError, match=r'sees 2 GPU\(s\), cuda:0 to cuda:1'): G.rank_device('cuda:2', World())
    gpus(0)
    with pytest.raises(RuntimeError, match='torch.cuda.is_available'): G.rank_device('cuda', World())

def test_setup_and_trainer_use_rank_device(gpus, monkeypatch):
    "setup_distrib makes this rank's GPU current (also for device='cuda'); DDP's device is the same"
    calls = gpus(1)
    monkeypatch.setenv('LOCAL_RANK', '1')
    G._use_device(torch.device('cuda'), World(1, 2, 1, 2))
    assert calls.set == [cuda(0)]
    assert D.train_device(nn.Linear(1, 1), 'cuda') == cuda(0)

# item 2: a world of one trains on the GPU
def test_world_of_one_moves_to_the_gpu(gpus, monkeypatch):
    calls, moved = gpus(2), []
    monkeypatch.setattr(C, 'move_model', lambda m, opt, d: moved.append(d))
    learn = Learner(DataLoaders(DataLoader(TensorDataset(torch.zeros(4, 1), torch.zeros(4, 1)))), nn.Linear(1, 1),
                    F.mse_loss)
    with learn.distrib_ctx(): pass
    assert moved == [cuda(0)] and calls.set == [cuda(0)]
    moved.clear(); gpus(0)
    with learn.distrib_ctx(): pass   # no CUDA: stays where it is
    assert moved == []

def test_world_of_one_keeps_the_users_gpu(gpus, monkeypatch):
    "A model the script put on cuda:1 stays there (made current); device='cuda' asks for this rank's GPU: moved"
    calls, moved = gpus(2), []
    monkeypatch.setattr(C, 'move_model', lambda m, opt, d: moved.append(d))
    on1 = types.SimpleNamespace(parameters=lambda: iter([types.SimpleNamespace(device=cuda(1))]))
    monkeypatch.setattr(C, 'unwrap_model', lambda m: on1)
    learn = Learner(DataLoaders(DataLoader(TensorDataset(torch.zeros(4, 1), torch.zeros(4, 1)))), nn.Linear(1, 1),
                    F.mse_loss)
    with learn.distrib_ctx(): pass
    assert moved == [] and calls.set == [cuda(1)]
    with learn.distrib_ctx(device='cuda'): pass
    assert moved == [cuda(0)]

def test_move_model_moves_the_optimizer_state():
    m = nn.Linear(2, 1)
    opt = torch.optim.Adam(m.parameters())
    m(torch.ones(3, 2)).sum().backward(); opt.step()
    move_model(m, opt, torch.device('meta'))
    assert {p.device.type for p in m.parameters()} == {'meta'}
    assert {v.device.type for s in opt.state.values() for v in s.values() if v.dim()} == {'meta'}
    assert {v.device.type for s in opt.state.values() for v in s.values() if not v.dim()} == {'cpu'}  # step counts

# item 3: the backend for CUDA tensors, not the group's whole backend string
@pytest.fixture
def one_rank_group():
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()

@pytest.mark.parametrize('config, cpu, cuda_, ok', [('cpu:gloo,cuda:nccl', 'gloo', 'nccl', True),
                                                    ('cpu:gloo,cuda:gloo', 'gloo', 'gloo', False),
                                                    ('cuda:nccl', None, 'nccl', True)])
def test_bf16_hook_under_the_default_backend(one_rank_group, monkeypatch, config, cpu, cuda_, ok):
    "torch: dist.get_backend() is the whole string, 'cpu:gloo,cuda:nccl', for distrib's default group"
    monkeypatch.setattr(dist, 'get_backend_config', lambda group=None: config)
    monkeypatch.setattr(dist, 'get_backend', lambda group=None: config if ',' in config else config.split(':')[1])
    monkeypatch.setattr(torch.cuda, 'current_device', lambda: 0)
    assert (G.group_backend('cpu'), G.group_backend('cuda')) == (cpu, cuda_)
    assert CO.comm_device() == (torch.device('cpu') if cpu else cuda(0))   # NCCL alone: collectives on the GPU
    hooks = []
    fake = types.SimpleNamespace(process_group=None, register_comm_hook=lambda state, hook: hooks.append(hook))
    if ok: D._register_comm_hook(fake, 'bf16'); assert len(hooks) == 1
    else:
        with pytest.raises(TypeError, match="needs the NCCL backend"): D._register_comm_hook(fake, 'bf16')

def test_group_backend_of_a_real_group(one_rank_group):
    assert (G.group_backend('cpu'), G.group_backend('cuda')) == ('gloo', 'gloo')
    assert CO.comm_device() == torch.device('cpu')

# item 5: FSDP2 with CPU offload computes on its mesh's device
def test_model_device_of_offloaded_shards(monkeypatch):
    class Offloaded(nn.Module):   # a parameter as FSDP2 leaves it with CPUOffloadPolicy: a DTensor in CPU memory
        def parameters(self, recurse=True):
            yield types.SimpleNamespace(device=torch.device('cpu'), device_mesh=types.SimpleNamespace(device_type='cuda'))
    monkeypatch.setattr(torch.cuda, 'current_device', lambda: 3)
    assert model_device(Offloaded()) == cuda(3)      # batches, MixedPrecision's autocast and scaler go there
    assert model_device(nn.Linear(1, 1)) == torch.device('cpu')

# item 6: DataParallel's replicas compute in the caller's autocast dtype, on the first device
def test_parallel_replicas_keep_the_autocast_dtype(monkeypatch):
    def torch_like_parallel_apply(modules, inputs, kwargs, devices):
        "as torch's: one thread per replica, autocast entered with `enabled` only (torch/nn/parallel/parallel_apply.py)"
        enabled, out = torch.is_autocast_enabled('cpu'), [None]*len(modules)
        def run(i):
            with torch.autocast('cpu', enabled=enabled): out[i] = modules[i](*inputs[i], **kwargs[i])
        ts = [threading.Thread(target=run, args=(i,)) for i in range(len(modules))]
        for t in ts: t.start()
        for t in ts: t.join()
        return out
    monkeypatch.setattr(P, 'parallel_apply', torch_like_parallel_apply)
    dp = P.ParallelModule(nn.Linear(2, 2))   # no GPU here: pretend it spans two CPU "devices"
    dp.src_device_obj, dp.device_ids = torch.device('cpu'), [0, 1]
    seen = lambda: torch.get_autocast_dtype('cpu')
    with torch.autocast('cpu', dtype=torch.float16):   # not CPU's default (bfloat16): a thread would lose it
        assert dp.parallel_apply([seen, seen], [(), ()], [{}, {}]) == [torch.float16]*2

def test_parallel_trainer_moves_the_model(monkeypatch):
    class OnMeta(P.ParallelModule):
        def __init__(self, module, device_ids=None):
            super().__init__(module, device_ids)
            self.device_ids, self.src_device_obj = [0], torch.device('meta')   # 'meta' stands for cuda:0
    monkeypatch.setattr(P, 'ParallelModule', OnMeta)
    learn = Learner(DataLoaders(DataLoader(TensorDataset(torch.zeros(4, 1), torch.zeros(4, 1)))), nn.Linear(1, 1),
                    F.mse_loss)
    learn.create_opt()
    learn.to_parallel()
    assert next(learn.model.module.parameters()).device.type == 'meta'
    learn.detach_parallel()

# item 1: a checkpoint resumed with the model on another device than the CPU
@pytest.mark.filterwarnings('ignore:for (weight|bias). copying from a non-meta')
def test_checkpoint_resumes_with_the_model_off_the_cpu(tmp_path):
    """'meta' stands for the GPU: before the fix, the file was read onto the model's device, and the random states
    (torch.set_rng_state wants a CPU ByteTensor: TypeError on a GPU) and callbacks' states failed to load"""
    x = torch.randn(32, 4); y = x.sum(1, keepdim=True)
    def learner(m):
        dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True), DataLoader(TensorDataset(x, y)))
        learn = Learner(dls, m, F.mse_loss, path=tmp_path)
        learn.logger, learn.progress.enabled = (lambda *a: None), False
        return learn
    learner(nn.Linear(4, 1)).fit(1, cbs=Checkpoint())
    learn = learner(nn.Linear(4, 1).to('meta'))
    learn.fit(1, cbs=(ck := Checkpoint()))      # resumes at the end: loads, restores the random states
    assert ck.resumed_from is not None

# item 8: notebook_launch and a CUDA already used
def test_cuda_blocks_fork_asks_a_forked_child(monkeypatch):
    monkeypatch.setattr(torch.cuda, '_is_compiled', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 1)
    for poisoned in (True, False):   # what torch's fork handler leaves in the child after is_available()
        monkeypatch.setattr(torch.cuda, '_is_in_bad_fork', lambda: poisoned)
        assert NB._cuda_blocks_fork() is poisoned

def test_notebook_launch_says_cuda_was_used(monkeypatch):
    monkeypatch.setattr(NB, '_cuda_blocks_fork', lambda: True)
    fn = lambda: 1
    fn.__module__ = '__main__'   # defined in the notebook
    with pytest.raises(ValueError, match='CUDA was used in this process already'): NB.notebook_launch(fn)
    with pytest.raises(RuntimeError, match="start_method='fork', but CUDA"): NB.notebook_launch(fn, start_method='fork')

def test_cuda_blocks_fork_only_with_a_gpu(monkeypatch):
    "A CUDA build on a machine without GPUs: is_available() poisons fork, but the child has no GPU to lose: fork"
    monkeypatch.setattr(torch.cuda, '_is_compiled', lambda: True)
    monkeypatch.setattr(torch.cuda, '_is_in_bad_fork', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 0)
    assert NB._cuda_blocks_fork() is False

# item 7 (the part outside the runtime's watchdog): NCCL's own watchdog is the backstop behind distrib's report
@pytest.mark.parametrize('config, grace', [('cpu:gloo,cuda:nccl', 60), ('cuda:nccl', 60), ('cpu:gloo,cuda:gloo', None)])
def test_nccl_backstop_gives_nccl_a_grace(monkeypatch, config, grace):
    set_to = {}
    backend = lambda d: types.SimpleNamespace(_set_default_timeout=lambda t: set_to.update({d.type: t}))
    group = types.SimpleNamespace(_get_backend=backend)
    monkeypatch.setattr(dist, 'get_backend_config', lambda group=None: config)
    G._nccl_backstop(datetime.timedelta(seconds=300), group)
    assert set_to == ({'cuda': datetime.timedelta(seconds=300 + grace)} if grace else {})
    G._nccl_backstop(datetime.timedelta(hours=2), group)   # 10 % beyond ten minutes
    if grace: assert set_to['cuda'] == datetime.timedelta(hours=2, minutes=12)

# item 1's sibling: learn.load reads onto the CPU too, so an optimizer's step counts stay there
@pytest.mark.filterwarnings('ignore:for (weight|bias). copying from a non-meta')
def test_load_keeps_step_counts_on_the_cpu(tmp_path):
    "'meta' stands for the GPU: mapped onto the model's device, Adam's step counts went there (a sync per step)"
    dls = DataLoaders(DataLoader(TensorDataset(torch.zeros(4, 1), torch.zeros(4, 1))))
    a = Learner(dls, nn.Linear(1, 1), F.mse_loss, path=tmp_path)
    a.create_opt()
    a.model(torch.ones(2, 1)).sum().backward(); a.opt.step()
    a.save('m')
    b = Learner(dls, nn.Linear(1, 1).to('meta'), F.mse_loss, path=tmp_path)
    b.load('m')
    steps = [s['step'] for s in b.opt.state.values()]
    assert steps and all(t.device.type == 'cpu' for t in steps), [t.device for t in steps]
    assert {s['exp_avg'].device.type for s in b.opt.state.values()} == {'meta'}   # the moments follow the parameters

# issue 39's item 3: what a cluster user meets first. setup_distrib of one rank with CUDA's answers substituted: the
# rendezvous gives a HashStore the calls share, init_process_group is recorded (with torch's signature), and the
# liveness the real group would start is left out
@pytest.fixture
def fake_setup(monkeypatch, gpus):
    store, calls, uuids = dist.HashStore(), [], {}
    def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None,
                           group_name='', pg_options=None, device_id=None):   # torch 2.8's parameters
        calls.append(dict(backend=backend, device_id=device_id))
        if setup.fail: raise RuntimeError('Gloo connectFullMesh failed')
    monkeypatch.setattr(dist, 'rendezvous', lambda url, rank, world_size, timeout: iter([(store, rank, world_size)]))
    monkeypatch.setattr(dist, 'init_process_group', init_process_group)
    for name in ('watch_stalls', 'start_liveness', 'set_group_state', '_nccl_backstop', 'queue_tracking'):
        monkeypatch.setattr(G, name, lambda *a, **k: None)
    monkeypatch.setattr(G._State, 'at_exit', True)
    monkeypatch.setattr(G._State, 'n_groups', 0)
    monkeypatch.setattr(dist, 'is_nccl_available', lambda: True)
    # the GPU's UUID: the same for every rank (they share the node's GPUs) unless `uuids` gives one per rank
    monkeypatch.setattr(torch.cuda, 'get_device_properties',
                        lambda d: types.SimpleNamespace(uuid=uuids.get(setup.rank, f'GPU-{torch.device(d).index}')))
    def setup(rank:int, world:int=2, n_gpus:int=1, **kw):
        setup.rank, G._State.n_groups = rank, 0   # each rank's first group, as in its own process
        gpus(n_gpus)
        return G.setup_distrib(world=World(rank, world, rank, world, env='env'), **kw)
    setup.fail, setup.calls, setup.uuids = False, calls, uuids
    return setup

def test_more_processes_than_gpus_refused(fake_setup):
    "2 processes on a node with 1 GPU under NCCL: the second is refused in one line naming --nproc_per_node"
    assert fake_setup(0)
    with pytest.raises(ValueError, match=r'rank 1 would share GPU cuda:0 .* --nproc_per_node 1\)'): fake_setup(1)
    assert len(fake_setup.calls) == 1

def test_gpus_bound_one_per_task_pass(fake_setup):
    "Slurm's --gpus-per-task=1: each task sees its own GPU as cuda:0 (different UUIDs): not refused"
    fake_setup.uuids.update({0: 'GPU-a', 1: 'GPU-b'})
    assert fake_setup(0) and fake_setup(1)

def test_ranks_share_a_gpu_over_gloo(fake_setup):
    assert fake_setup(0, backend='gloo') and fake_setup(1, backend='gloo')
    assert [c['device_id'] for c in fake_setup.calls] == [None, None]   # gloo: no device_id either

def test_device_id_reaches_init_process_group(fake_setup):
    "One GPU per rank under the default backend: NCCL gets the rank's GPU (eager communicator), where torch has it"
    assert fake_setup(1, n_gpus=2)
    assert fake_setup.calls == [dict(backend='cpu:gloo,cuda:nccl', device_id=cuda(1))]

def test_no_device_id_on_a_torch_without_it(fake_setup, monkeypatch):
    monkeypatch.setattr(dist, 'init_process_group', lambda backend, **kw: fake_setup.calls.append(kw))
    assert fake_setup(1, n_gpus=2)
    assert 'device_id' not in fake_setup.calls[0]

@pytest.mark.parametrize('nccl, gloo, want', [('lo', None, 'lo'), ('=lo', None, 'lo'), ('^docker', None, None),
                                              ('lo', 'eth7', 'eth7')])
def test_gloo_socket_ifname_follows_nccl(fake_setup, monkeypatch, nccl, gloo, want):
    "GLOO_SOCKET_IFNAME defaults to NCCL_SOCKET_IFNAME's interface when only that is set (gloo: exact names)"
    monkeypatch.setenv('GLOO_SOCKET_IFNAME', 'x')   # restored (unset) after the test
    if gloo is None: monkeypatch.delenv('GLOO_SOCKET_IFNAME')
    else: monkeypatch.setenv('GLOO_SOCKET_IFNAME', gloo)
    monkeypatch.setenv('NCCL_SOCKET_IFNAME', nccl)
    assert fake_setup(0, n_gpus=2)
    assert os.environ.get('GLOO_SOCKET_IFNAME') == want

def test_init_error_names_both_interfaces(fake_setup, monkeypatch):
    monkeypatch.setenv('NCCL_SOCKET_IFNAME', '^docker')
    fake_setup.fail = True
    with pytest.raises(RuntimeError, match='connectFullMesh') as e: fake_setup(0, n_gpus=2)
    note = ' '.join(getattr(e.value, '__notes__', []))
    assert "GLOO_SOCKET_IFNAME=unset" in note and "NCCL_SOCKET_IFNAME='^docker'" in note, note

# issue 39's item 3: a CUDA event follows only a collective queued on a CUDA stream
def test_no_cuda_event_after_a_gloo_collective(monkeypatch):
    from distrib.runtime import position as PO
    marked = []
    monkeypatch.setattr(PO, 'mark_queued', lambda name=None, **kw: marked.append(name))
    PO.queue_tracking(True, 60.)
    try:
        for device in ('cpu', torch.device('cpu'), 'cuda', cuda(1), None):
            with PO.doing('collective', str(device), device=device): pass
        assert marked == ['cuda', 'cuda:1', 'None']
        # all_reduce_sum of the default backend: a CPU tensor through gloo, not followed
        monkeypatch.setattr(CO, '_world_size', lambda: 2)
        monkeypatch.setattr(CO, 'comm_device', lambda group=None: torch.device('cpu'))
        monkeypatch.setattr(dist, 'all_reduce', lambda t, op=None: None)
        CO.all_reduce_sum(torch.ones(2))
        assert marked == ['cuda', 'cuda:1', 'None']
    finally: PO.queue_tracking(False)

# issue 39's item 3: compile=True on a machine without a compiler says what to install, before the first step
@pytest.mark.parametrize('device, says', [(None, 'C++ compiler'), ('cuda', "C compiler for Triton's GPU kernels")])
def test_compile_needs_a_compiler(monkeypatch, device, says):
    from distrib.strategies import compiling as CP
    for v in ('CC', 'CXX'): monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr(CP.shutil, 'which', lambda name: None)
    if device: monkeypatch.setattr(CP, 'model_device', lambda m: cuda(0))   # the model on the GPU
    learn = Learner(DataLoaders(DataLoader(TensorDataset(torch.zeros(4, 1), torch.zeros(4, 1)))), nn.Linear(1, 1),
                    F.mse_loss)
    with pytest.raises(RuntimeError, match=re.escape(says) + r".*apt-get install gcc g\+\+"):
        with learn.distrib_ctx(compile=True): pass
    assert 'forward' not in learn.model.__dict__   # nothing left compiled
    with learn.distrib_ctx(compile={'backend': 'aot_eager'}): pass

# issue 39's item 3: FSDP keeps one whole copy of the model in host memory (the Learner's), not a deep copy beside it
class Scaled(nn.Module):
    "Two layers sharing a weight (a tie), and a buffer outside the state dict"
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.b.weight = self.a.weight
        self.register_buffer('scale', torch.tensor(3.), persistent=False)
    def forward(self, x): return self.b(torch.relu(self.a(x))).sum(-1, keepdim=True) * self.scale

def test_fsdp_copy_holds_no_memory(one_rank_group, monkeypatch):
    from distrib.strategies import fsdp as FS
    shard, sharded_on = FS.shard_model, []
    def spy(model, *a, **kw):
        sharded_on.extend(t.device.type for t in [*model.parameters(), *model.buffers()])
        return shard(model, *a, **kw)
    monkeypatch.setattr(FS, 'shard_model', spy)
    x = torch.randn(32, 4); y = x.sum(1, keepdim=True)
    def learner():
        torch.manual_seed(0)
        learn = Learner(DataLoaders(DataLoader(TensorDataset(x, y), batch_size=8)), Scaled(), F.mse_loss)
        learn.logger, learn.progress.enabled = (lambda *a: None), False
        return learn
    plain = learner(); plain.fit(2)
    learn = learner()
    learn.to_distributed(strategy='fsdp')   # the root alone: torch shards a tie in one group
    try: learn.fit(2)
    finally: learn.detach_distributed()
    assert sharded_on and set(sharded_on) == {'meta'}, sharded_on   # the copy was sharded before it held anything
    for k, v in plain.model.state_dict().items(): torch.testing.assert_close(learn.model.state_dict()[k], v)
    assert learn.model.b.weight is learn.model.a.weight and learn.model.scale.item() == 3.

# issue 39's item 3: the Performance page's GPU benchmark line on a machine with one GPU does not fail (exit code 2)
def test_strategies_bench_on_one_gpu():
    import importlib.util
    from conftest import ROOT
    spec = importlib.util.spec_from_file_location('bench_strategies', ROOT/'bench'/'strategies.py')
    bench = importlib.util.module_from_spec(spec); spec.loader.exec_module(bench)
    assert [bench.cuda_ranks(None, n) for n in (1, 2, 8)] == [None, 2, 2]   # one GPU: nothing to measure, said
    assert bench.cuda_ranks(4, 8) == 4
    with pytest.raises(ValueError, match='--ranks 4 with --device cuda needs 4 GPUs'): bench.cuda_ranks(4, 2)
