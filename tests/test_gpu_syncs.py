"""Host syncs in a training step (issue 39), on the GPUs that are there: `pytest -m gpu tests/test_gpu_syncs.py`.
tests/scripts/gpu_syncs.py trains `Learner` + DDP with `nn.CrossEntropyLoss()` and counts, step by step, what
`torch.cuda.set_sync_debug_mode('warn')` reports: none with the ranks' counts known equal, none with the count
all-reduced over NCCL (on the GPU), none with `GradientAccumulation('forced_sync')`, and with float16's `GradScaler`
its one read per step. With `DISTRIB_TEST_DEVICE=cpu` (CI), the same jobs run over gloo on CPU and count the
operations that would wait for a GPU (`.item()`, `bool()`, `nonzero`, ...): CUDA's answer substituted. The
two-process job needs two GPUs (NCCL takes one per rank); the one-process job fakes a second rank in the loader."""
import os
import pytest, torch
from conftest import launch, checked, SCRIPTS

DEVICE = os.environ.get('DISTRIB_TEST_DEVICE') or ('cuda' if torch.cuda.is_available() else None)
CPU = DEVICE == 'cpu'
N_GPU = torch.cuda.device_count() if DEVICE == 'cuda' else 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(DEVICE is None, reason='needs a CUDA GPU (torch.cuda.is_available() '
                                                  'is False); DISTRIB_TEST_DEVICE=cpu runs the checks that need no CUDA')]

def _job(mode:str, nproc:int):
    r = launch(SCRIPTS/'gpu_syncs.py', mode, nproc=nproc, timeout=300, fork=False,
               env={'DISTRIB_TEST_DEVICE': DEVICE, **({'OMP_NUM_THREADS': '1'} if CPU else {})})
    return r, r.stdout + r.stderr

@pytest.fixture(scope='module')
def one(): return _job('one', 1)
@pytest.fixture(scope='module')
def two(): return _job('two', 2)

CASES = ['syncs_known_equal', 'syncs_count_summed', 'syncs_forced_sync']

def _check(job, name):
    r, out = job
    assert checked(out, name), f"check {name} did not pass (exit code {r.returncode}):\n{out[-6000:]}"

@pytest.mark.parametrize('name', CASES)
def test_one_process(one, name): _check(one, name)

@pytest.mark.skipif(CPU, reason='needs CUDA itself (the GradScaler of float16)')
def test_fp16_grad_scaler_only(one): _check(one, 'syncs_fp16_grad_scaler_only')

@pytest.mark.skipif(not CPU and N_GPU < 2, reason=f'needs two GPUs ({N_GPU} visible)')
@pytest.mark.parametrize('name', CASES)
def test_two_processes(two, name): _check(two, name)
