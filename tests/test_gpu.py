"""The CUDA paths, on the GPUs that are there: `pytest -m gpu tests` (skipped, with the reason, without CUDA; the
two-GPU cases skipped on one GPU). Every check runs in few launched jobs of tests/scripts/gpu.py, which print
'CHECK <name> OK'. Needs only torch with CUDA, pytest and this package (no nbdev): README's "GPU tests" says how to
run them on a machine without a package registry."""
import re
import pytest, torch
from conftest import launch, checked, SCRIPTS

N_GPU = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(N_GPU == 0, reason='needs a CUDA GPU (torch.cuda.is_available() is False)')]
two_gpus = pytest.mark.skipif(N_GPU < 2, reason=f'needs two GPUs ({N_GPU} visible)')

def _job(tmp_path_factory, mode:str, nproc:int, launcher_args=()):
    d = tmp_path_factory.mktemp(mode)
    r = launch(SCRIPTS/'gpu.py', mode, d, nproc=nproc, launcher_args=launcher_args, timeout=600, fork=False)
    return r, r.stdout + r.stderr

@pytest.fixture(scope='module')
def one(tmp_path_factory): return _job(tmp_path_factory, 'one', 1)
@pytest.fixture(scope='module')
def share(tmp_path_factory): return _job(tmp_path_factory, 'share', 2)
@pytest.fixture(scope='module')
def nccl(tmp_path_factory): return _job(tmp_path_factory, 'nccl', 2)

def _check(job, name):
    r, out = job
    assert checked(out, name), f"check {name} did not pass (exit code {r.returncode}):\n{out[-6000:]}"

@pytest.mark.parametrize('name', ['nccl_one_rank', 'fp16_skipped_step_counted', 'fp16_scale_resumes', 'bf16',
                                  'checkpoint_cuda_exact', 'checkpoint_gpu_cpu_gpu', 'parallel_ctx_one_gpu',
                                  'fsdp_one_rank', 'fsdp_model_off_gpu', 'lr_find'])
def test_one_gpu(one, name): _check(one, name)

@pytest.mark.parametrize('name', ['share_equals_one_process', 'share_compile'])
def test_two_processes_share_a_gpu(share, name): _check(share, name)

def test_gpus_option_places_the_rank(tmp_path):
    "`--gpus 0`: one process, on GPU 0 (CUDA_VISIBLE_DEVICES=0), and it trains"
    r = launch(SCRIPTS/'gpu.py', 'place', tmp_path, nproc=None, launcher_args=['--gpus', '0'], timeout=300, fork=False)
    assert r.returncode == 0 and checked(r.stdout, 'placed'), r.stdout[-3000:] + r.stderr[-3000:]

def test_failing_rank_is_named_under_nccl(tmp_path):
    "The rank that raises is named, with its exception, when the group is NCCL's (its own watchdog aborts otherwise)"
    n = 2 if N_GPU >= 2 else 1
    r = launch(SCRIPTS/'gpu.py', 'fail', tmp_path, nproc=n, timeout=300, fork=False)
    assert r.returncode != 0
    first = next((l for l in r.stderr.splitlines() if l.startswith('distrib.launch: rank')), '')
    assert re.match(rf'distrib.launch: rank {n-1} failed \(exit code 1\): ValueError: bad batch on purpose', first), \
        r.stderr[-4000:]

@two_gpus
@pytest.mark.parametrize('name', ['nccl_equals_one_process', 'nccl_compile', 'comm_hook_fp16', 'comm_hook_bf16',
                                  'comm_hook_powersgd', 'sync_bn', 'dataparallel_two_gpus'])
def test_two_gpus(nccl, name): _check(nccl, name)
