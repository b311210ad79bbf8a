"distrib_ctx over several gloo processes"
import os, re, subprocess, sys
from conftest import launch, SCRIPTS, ROOT

def test_ctx_restores_learner():
    r = launch(SCRIPTS/'ctx_restore.py', nproc=2)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(re.findall(r'rank \d OK', r.stdout)) == ['rank 0 OK', 'rank 1 OK']

def test_ctx_single_process_is_noop():
    env = {k: v for k, v in os.environ.items() if k not in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK')}
    r = subprocess.run([sys.executable, str(SCRIPTS/'ctx_single.py')], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'OK' in r.stdout

def test_world_size_without_rendezvous_fails_loudly():
    "WORLD_SIZE > 1 but no MASTER_ADDR: an error, never a silent single-process run on all the data"
    env = {k: v for k, v in os.environ.items() if not k.startswith('MASTER_')}
    env.update(RANK='0', WORLD_SIZE='2', LOCAL_RANK='0')
    r = subprocess.run([sys.executable, str(SCRIPTS/'ctx_single.py')], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert r.returncode != 0
    assert 'MASTER_ADDR' in r.stderr

def test_rank_outside_world_fails():
    env = dict(os.environ, RANK='2', WORLD_SIZE='2', LOCAL_RANK='0', MASTER_ADDR='127.0.0.1', MASTER_PORT='1')
    r = subprocess.run([sys.executable, str(SCRIPTS/'ctx_single.py')], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert r.returncode != 0
    assert 'Invalid rank 2' in r.stderr and '[0, 1]' in r.stderr

def test_teardown_never_hangs():
    """Destroying the gloo group right after collectives (pytorch#56297 class): 4 jobs at once (more contention for
    the race than one after another, in less time) each end under a timeout"""
    cmd = [sys.executable, '-m', 'distrib.launch', '--nproc_per_node', '2', str(SCRIPTS/'teardown.py')]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(4)]
    try: outs = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None: p.kill()
    for p, (out, err) in zip(procs, outs): assert p.returncode == 0 and 'done' in out, out + err[-3000:]
