"""The CUDA paths, on the GPUs that are there: `pytest -m gpu tests` (skipped, with the reason, without CUDA; the
two-GPU cases skipped on one GPU). Every check runs in few launched jobs of tests/scripts/gpu.py, which print
'CHECK <name> OK'. With `DISTRIB_TEST_DEVICE=cpu`, the same jobs run on CPU over gloo every check that does not need
CUDA itself (CI does: the suite's orders, references and tolerances are proven before a GPU runs them); the checks
that need CUDA are skipped there, with the reason. Needs only torch (with CUDA for the GPU run), pytest and this
package (no nbdev): the Development page (nbs/90_development.ipynb, "The GPU check") says how to run them on a
machine without a package registry."""
import os, re, subprocess, sys
import pytest, torch
from conftest import launch, checked, SCRIPTS

DEVICE = os.environ.get('DISTRIB_TEST_DEVICE') or ('cuda' if torch.cuda.is_available() else None)
CPU = DEVICE == 'cpu'
N_GPU = torch.cuda.device_count() if DEVICE == 'cuda' else 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(DEVICE is None, reason='needs a CUDA GPU (torch.cuda.is_available() '
                                                  'is False); DISTRIB_TEST_DEVICE=cpu runs the checks that need no CUDA')]
cuda_only = pytest.mark.skipif(CPU, reason='needs CUDA itself (DISTRIB_TEST_DEVICE=cpu)')
two_gpus = pytest.mark.skipif(not CPU and N_GPU < 2, reason=f'needs two GPUs ({N_GPU} visible)')

def _job(tmp_path_factory, mode:str, nproc:int, launcher_args=()):
    d = tmp_path_factory.mktemp(mode)
    r = launch(SCRIPTS/'gpu.py', mode, d, nproc=nproc, launcher_args=launcher_args, timeout=600, fork=False,
               env={'DISTRIB_TEST_DEVICE': DEVICE, **({'OMP_NUM_THREADS': '1'} if CPU else {})})
    return r, r.stdout + r.stderr

@pytest.fixture(scope='module')
def one(tmp_path_factory): return _job(tmp_path_factory, 'one', 1)
@pytest.fixture(scope='module')
def two(tmp_path_factory): return _job(tmp_path_factory, 'two', 2)
@pytest.fixture(scope='module')
def share(tmp_path_factory): return _job(tmp_path_factory, 'share', 2)
@pytest.fixture(scope='module')
def nccl(tmp_path_factory): return _job(tmp_path_factory, 'nccl', 2)
@pytest.fixture(scope='module')
def queued(tmp_path_factory): return _job(tmp_path_factory, 'queued', 2)

def _check(job, name):
    r, out = job
    assert checked(out, name), f"check {name} did not pass (exit code {r.returncode}):\n{out[-6000:]}"

ONE = ['world_of_one', 'world_of_one_equals_plain', 'fp16_skipped_step_counted', 'fp16_scale_resumes', 'bf16',
       'checkpoint_exact', 'lr_find', 'fsdp_one_rank', 'fsdp_model_off_gpu']
ONE_CUDA = ['checkpoint_gpu_cpu_gpu', 'parallel_ctx_one_gpu']
TWO = ['default_backend', 'two_group_timeouts', 'two_equals_one_process', 'comm_hook_none', 'comm_hook_fp16',
       'comm_hook_bf16', 'comm_hook_powersgd', 'mixed_precision_ddp', 'checkpoint_ddp', 'get_preds_accum_metric',
       'fsdp', 'two_compile']
TWO_CUDA = ['sync_bn', 'fsdp_cpu_offload', 'fsdp_offload_mixed_precision', 'dataparallel_two_gpus']

@pytest.mark.parametrize('name', ONE)
def test_one_process(one, name): _check(one, name)

@cuda_only
@pytest.mark.parametrize('name', ONE_CUDA)
def test_one_gpu(one, name): _check(one, name)

@two_gpus
@pytest.mark.parametrize('name', TWO)
def test_two_processes(two, name): _check(two, name)

@two_gpus
@cuda_only
@pytest.mark.parametrize('name', TWO_CUDA)
def test_two_gpus(two, name): _check(two, name)

@pytest.mark.skipif(not CPU, reason='on CPU only: on GPUs sync_bn itself is checked')
def test_sync_bn_check_can_fail(two):
    "Without SyncBatchNorm the ranks' statistics differ from the global batch's: the GPU check can fail"
    _check(two, 'sync_bn_reference')

@cuda_only
@pytest.mark.parametrize('name', ['share_equals_one_process', 'share_compile'])
def test_two_processes_share_a_gpu(share, name): _check(share, name)

@cuda_only
@two_gpus
@pytest.mark.parametrize('name', ['nccl_group_timeouts', 'nccl_equals_one_process', 'nccl_fsdp'])
def test_nccl_alone(nccl, name): _check(nccl, name)

@two_gpus
@pytest.mark.parametrize('name', ['queued_all_reduce', 'queued_ddp_reference' if CPU else 'queued_ddp_backward'])
def test_queued_collective_is_followed(queued, name):
    """Issue 34's item 7: while a collective rank 0 queued waits for rank 1, rank 0's heartbeat says it waits in it,
    queued, its main thread gone on, and stops once it is done: `all_reduce_sum`, then DDP's backward. On GPUs over
    NCCL (the host not blocked, the CUDA events queried only); on CPU `all_reduce_sum`'s part with gloo's async work
    standing for NCCL's, and DDP's part as the reference (gloo's backward blocks: the check of the host can fail)"""
    _check(queued, name)

@cuda_only
def test_gpus_option_places_the_rank(tmp_path):
    "`--gpus 0`: one process, on GPU 0 (CUDA_VISIBLE_DEVICES=0), and it trains"
    r = launch(SCRIPTS/'gpu.py', 'place', tmp_path, nproc=None, launcher_args=['--gpus', '0'], timeout=300, fork=False)
    assert r.returncode == 0 and checked(r.stdout, 'placed'), r.stdout[-3000:] + r.stderr[-3000:]

@cuda_only
@pytest.mark.skipif(N_GPU < 2, reason=f'needs two GPUs for two ranks over NCCL ({N_GPU} visible: one rank is a world '
                                      'of one, without a process group)')
def test_failing_rank_is_named_under_nccl(tmp_path):
    """The rank that raises is named, with its exception, when the group is NCCL's (its own watchdog aborts
    otherwise): 2 ranks, a GPU each, an NCCL all-reduce done first"""
    r = launch(SCRIPTS/'gpu.py', 'fail', tmp_path, nproc=2, timeout=300, fork=False)
    assert r.returncode != 0
    assert checked(r.stdout, 'fail_nccl_ran'), r.stdout[-3000:] + r.stderr[-3000:]
    first = next((l for l in r.stderr.splitlines() if l.startswith('distrib.launch: rank')), '')
    assert re.match(r'distrib.launch: rank 1 failed \(exit code 1\): ValueError: bad batch on purpose', first), \
        r.stderr[-4000:]

@cuda_only
def test_notebook_launch_after_cuda_was_used(tmp_path):
    """A fresh process calls torch.cuda.is_available(), as a notebook's first cell does: distrib sees that forked
    workers could not use CUDA, refuses a function defined in __main__ saying so, and spawns the workers of an
    importable one, which train on their GPUs (item 8)"""
    drop = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT', 'TORCHELASTIC_RUN_ID')
    env = {k: v for k, v in os.environ.items() if k not in drop}
    r = subprocess.run([sys.executable, str(SCRIPTS/'nb_cuda.py')], capture_output=True, text=True, timeout=600,
                       cwd=tmp_path, env=env)
    for name in ('cuda_blocks_fork', 'notebook_fn_refused', 'notebook_launch_after_cuda'):
        assert checked(r.stdout, name), f"check {name} did not pass (exit code {r.returncode}):\n{r.stdout[-3000:]}" \
                                        f"\n{r.stderr[-6000:]}"
