"""One world: the process group lives as long as the process, and one module says where a process stands. Each
situation a user met, over 2 processes through the launcher, or with the environment a launcher would set."""
import os, re, time
import pytest
from conftest import launch, run_alone, run_forked, SCRIPTS

def test_one_world_script(together):
    """rank0_first first, fit refused without the context, the group outlives it, save readable at once, eval outside
    (tests/scripts/one_world.py, the first script of the shared job)"""
    out = together('one_world')
    for name in ['rank0_first_habit', 'fit_without_ctx_refused', 'world_in_ctx', 'group_outlives_ctx',
                 'save_after_ctx_readable', 'eval_outside_ctx_warns_once', 'eval_outside_ctx_equal']:
        assert sorted(re.findall(rf'^CHECK {name} OK rank (\d)', out, re.M)) == ['0', '1'], (name, out)

def test_rank_without_world_size_fails():
    r = run_alone(SCRIPTS/'ctx_single.py', {'RANK': '1'})
    assert r.returncode != 0
    assert 'RANK=1 is set but WORLD_SIZE is not' in r.stderr, r.stderr[-2000:]

SLURM4 = {'SLURM_PROCID': '1', 'SLURM_NTASKS': '4', 'SLURM_STEP_NUM_TASKS': '4', 'SLURM_STEP_ID': '0',
          'SLURM_LOCALID': '1', 'SLURM_NODEID': '0', 'SLURM_STEP_TASKS_PER_NODE': '4', 'SLURM_JOB_ID': '42'}

def test_slurm_four_tasks_never_four_worlds():
    "srun -n 4 without torch's variables: one world of 4 (which needs rank 0's address), never 4 worlds of one"
    r = run_alone(SCRIPTS/'ctx_single.py', SLURM4)
    assert r.returncode != 0
    assert 'slurm started this process as rank 1 of 4' in r.stderr and 'MASTER_ADDR' in r.stderr, r.stderr[-2000:]
    r = run_alone(SCRIPTS/'ctx_single.py', dict(SLURM4, RANK='0', WORLD_SIZE='1'))
    assert r.returncode != 0
    assert 'slurm started 4 tasks' in r.stderr and 'WORLD_SIZE=1' in r.stderr, r.stderr[-2000:]

@pytest.mark.parametrize('launcher', ['distrib.launch', pytest.param('torchrun', marks=pytest.mark.slow)])  # CI runs both
def test_exit_after_an_exception(launcher):
    "An uncaught exception after training, on rank 1 only: the job ends at once, the exit names it, no hang"
    if launcher == 'torchrun':
        r = run_forked(['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2',
                        SCRIPTS/'exit_after_error.py', '1'],
                       dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1'), timeout=120)
    else: r = launch(SCRIPTS/'exit_after_error.py', '1', nproc=2, timeout=120)
    end = time.time()
    assert r.returncode != 0 and 'failed after training on rank 1' in r.stderr, r.stderr[-3000:]
    at = [float(t) for t in re.findall(r'ERROR_AT ([\d.]+)', r.stdout)]
    assert len(at) == 2, r.stdout
    assert end - max(at) < 20, f"{end - max(at):.1f} s from the error to the job's end"
