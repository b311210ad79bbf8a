"""FSDP (distrib_ctx(strategy='fsdp')) on 2 and 3 gloo processes: the same weights as DDP, exact metrics, 1/W of the
memory, accumulation, mixed precision, clipping, whole and sharded checkpoints (resharded from 2 ranks to 3 and to
one process). One script runs every check (tests/scripts/fsdp.py, in the shared jobs of 2 and 3 processes); each
test reads its lines. The job of 3 processes runs behind `-m slow` (CI runs it)."""
import pytest, torch
from torch import nn
from conftest import checked

@pytest.fixture(scope='module')
def runs(together):
    "fsdp.py in the shared job of 2 processes: (the script's directory, {2: output})"
    return together.dir/'fsdp', {2: together('fsdp')}

@pytest.fixture(scope='module')
def out3(together3):
    """fsdp.py in the shared job of 3 processes, which loads the sharded checkpoint the job of 2 wrote: its output
    (the tests that read it are behind `-m slow`, which CI runs: the job of 3 takes most of a minute)"""
    return together3('fsdp')

@pytest.fixture(params=[2, pytest.param(3, marks=pytest.mark.slow)], ids=['W2', 'W3'])
def out(request, runs): return runs[1][2] if request.param == 2 else request.getfixturevalue('out3')

@pytest.fixture
def out2(runs):
    "The W=2 job's output: the checks whose result does not depend on how the rows divide run there only"
    return runs[1][2]

@pytest.mark.parametrize('blocks', ['linear_blocks', 'root_only'])
def test_same_weights_as_ddp(out, blocks):
    "rtol 1e-5 after 2 epochs of Adam, layers of 33 and 2 rows (an empty shard on 3 ranks)"
    assert checked(out, f'equivalence_{blocks}'), out

@pytest.mark.parametrize('blocks', ['no_reshard_threshold', 'cpu_offload', 'rank0_weights'])
def test_same_weights_as_ddp_options(out2, blocks):
    "FSDP's options and each rank's own initial weights (FSDP starts from rank 0's, as DDP does)"
    assert checked(out2, f'equivalence_{blocks}'), out2

def test_exact_metrics_and_get_preds(out): assert checked(out, 'metrics_get_preds'), out
def test_memory_is_1_over_W(out): assert checked(out, 'memory_1_over_W'), out
def test_whole_model_held_on_rank0_only(out):
    "During the sharded fit the Learner's own model and Adam state take memory on rank 0 only (issue 49)"
    assert checked(out, 'whole_model_rank0_only'), out

def test_gradient_accumulation(out2):
    for name in ['single_auto_sync', 'multi_auto_sync', 'forced_sync_refused']:
        assert checked(out2, f'accumulate_{name}'), out2

def test_mixed_precision(out2):
    for name in ['bf16', 'late_warns', 'fp16_scaler', 'conflict']: assert checked(out2, f'mixed_precision_{name}'), out2

@pytest.mark.parametrize('norm_type', ['2.0', 'inf'])
def test_clip_sharded_gradients(out, norm_type): assert checked(out, f'clip_norm_{norm_type}'), out

def test_learner_after_context(out2): assert checked(out2, 'exit_restores_learner'), out2

def test_checkpoints(out):
    for name in ['save_layout', 'save_whole_format', 'load_whole', 'load_shards', 'load_shards_ddp', 'resume_sharded']:
        assert checked(out, name), out

def test_bad_options(out2):
    for name in ['comm_hook', 'shard_class', 'strategy', 'min_params', 'cpu_offload_without_gloo']:
        assert checked(out2, f'bad_option_{name}'), out2

@pytest.mark.slow
def test_sharded_checkpoint_reshards_2_to_3(out3): assert checked(out3, 'reshard_2_to_3'), out3

def _plain_learner(path, model_dir:str):
    "A Learner in this process, not distributed, with tests/scripts/fsdp.py's model (fresh weights) and Adam"
    from torch.utils.data import DataLoader, TensorDataset
    from distrib import Learner, DataLoaders
    dl = DataLoader(TensorDataset(torch.randn(4, 4), torch.zeros(4, dtype=torch.long)), batch_size=2)
    model = nn.Sequential(nn.Linear(4, 33), nn.ReLU(), nn.Linear(33, 33), nn.ReLU(), nn.Linear(33, 2))
    return Learner(DataLoaders(dl, dl), model, nn.functional.cross_entropy, opt_func=torch.optim.Adam, path=path,
                   model_dir=model_dir)

def test_sharded_checkpoint_loads_in_one_process(runs):
    "The directory 2 ranks wrote, into a plain Learner in this process, without a process group"
    from distrib import pg_initialized
    tmp = runs[0]
    ref = torch.load(tmp/'w2'/'ref.pt', weights_only=True)
    learn = _plain_learner(tmp, 'w2')
    model = learn.model
    learn.load('shards')
    assert not pg_initialized()
    for k, v in model.state_dict().items(): assert torch.equal(v, ref['model'][k]), k
    state = learn.opt.state_dict()['state']
    for i, s in ref['opt']['state'].items():
        for k, v in s.items(): assert torch.equal(state[i][k], v), (i, k)

@pytest.mark.parametrize('name', ['gradient_clip', 'gradient_clip_inf', 'fit_one_cycle', 'lr_find'])
def test_callbacks_as_under_ddp(out2, name):
    "GradientClip (2-norm and inf-norm), fit_one_cycle and lr_find under FSDP equal DDP"
    assert checked(out2, f'merged_{name}'), out2

def test_checkpoint_resumes_fsdp_mid_epoch(out):
    """Checkpoint under FSDP writes sharded directories by default (every rank its shards) and, with sharded=False,
    whole files gathered on rank 0; either resumes in the middle of an epoch to the uninterrupted fit, bit for bit"""
    for name in ['checkpoint_sharded_layout', 'ck_sharded_resume', 'checkpoint_whole_layout', 'ck_whole_resume']:
        assert checked(out, name), out

@pytest.mark.slow
def test_checkpoint_reshards_2_to_3(out3):
    """The W=2 Checkpoint directories on 3 ranks: the mid-epoch one refused, the epoch's one resumed (its state
    exactly, a warning on the global batch)"""
    for name in ['checkpoint_mid_epoch_other_world_refused', 'checkpoint_reshard_2_to_3']:
        assert checked(out3, name), out3

def test_checkpoint_directory_loads_in_one_process(runs):
    "A Checkpoint directory 2 ranks wrote, with learn.load in this process: the whole file of the same step's state"
    tmp = runs[0]
    whole = torch.load(tmp/'w2'/'step-6.pth', weights_only=True)
    learn = _plain_learner(tmp, 'w2/ck_one')
    model = learn.model
    learn.load('step-6')
    for k, v in model.state_dict().items(): assert torch.equal(v, whole['model'][k]), k
    state = learn.opt.state_dict()['state']
    for i, s in whole['opt']['state'].items():
        for k, v in s.items(): assert torch.equal(state[i][k], v), (i, k)
