"distrib_ctx over several gloo processes"
import re
from conftest import launch, run_alone, SCRIPTS

def test_ctx_restores_learner(together):
    out = together('ctx_restore')
    assert sorted(re.findall(r'rank \d OK', out)) == ['rank 0 OK', 'rank 1 OK'], out

def test_ctx_single_process_is_noop():
    r = run_alone(SCRIPTS/'ctx_single.py')
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'OK' in r.stdout

def test_world_size_without_rendezvous_fails_loudly():
    "WORLD_SIZE > 1 but no MASTER_ADDR: an error, never a silent single-process run on all the data"
    r = run_alone(SCRIPTS/'ctx_single.py', dict(RANK='0', WORLD_SIZE='2', LOCAL_RANK='0'))
    assert r.returncode != 0
    assert 'MASTER_ADDR' in r.stderr

def test_rank_outside_world_fails():
    r = run_alone(SCRIPTS/'ctx_single.py', dict(RANK='2', WORLD_SIZE='2', LOCAL_RANK='0', MASTER_ADDR='127.0.0.1',
                                                MASTER_PORT='1'))
    assert r.returncode != 0
    assert 'Invalid rank 2' in r.stderr and '[0, 1]' in r.stderr

def test_teardown_never_hangs():
    """Destroying the gloo group right after collectives (pytorch#56297 class), 6 times in one job: by
    `teardown_distrib()` 5 times, then by the teardown at exit; the job ends under a timeout"""
    r = launch(SCRIPTS/'teardown.py', '6', timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert r.stdout.count('done') == 2*7, r.stdout  # 'round N done' 6 times and 'done', on both ranks
