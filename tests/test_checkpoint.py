"""Checkpoint across processes: a restart after SIGKILL resumes exactly (and restarted workers never read the dead
attempt's store keys), SIGTERM to the launcher stops every rank at the same step with a checkpoint that the next
launch resumes exactly, another number of processes resumes from an epoch's end, SaveModelCallback under DDP.
Run with `pytest -s` to see the largest differences (MAXDIFF lines). DISTRIB_RESTART_RUNS=5 runs the restart job 5
times in a row."""
import os, re, signal, subprocess, sys
import pytest
from conftest import launch, checked, run_forked, SCRIPTS, ROOT
from test_launcher_signals import _wait_for
from distrib import checkpoints

JOB = SCRIPTS/'checkpoint_job.py'

def maxdiffs(out:str)->list:
    lines = re.findall(r'^MAXDIFF .*$', out, re.M)
    for l in lines: print(l)
    return lines

@pytest.mark.parametrize('run', range(int(os.environ.get('DISTRIB_RESTART_RUNS', 1))))
def test_restart_resumes_exactly(tmp_path, run):
    """SIGKILL of rank 1 in the middle of epoch 2 of 4 under --max_restarts 2, Checkpoint(every_n_steps=5): the job
    exits 0, resumed from the last checkpoint, and ends with the weights and values of an uninterrupted run"""
    r = launch(JOB, 'restart', tmp_path, nproc=2, launcher_args=('--max_restarts', '2'), timeout=240)
    out = r.stdout
    assert r.returncode == 0, out[-3000:] + r.stderr[-5000:]
    assert 'ATTEMPT 1 RANK 1' in out and 'ATTEMPT 2' not in out, out   # one restart (the ranks' lines may interleave)
    for name in ('resumed_mid_epoch', 'restart_exact', 'keep_last', 'one_rank_signal', 'save_model'):
        assert checked(out, name), (name, out[-3000:])
    maxdiffs(out)
    # another number of processes: 1 process resumes the 2-process checkpoints of the same run without dropout
    w = run_forked([SCRIPTS/'checkpoint_world.py', tmp_path], os.environ, timeout=120)
    assert w.returncode == 0, w.stdout + w.stderr[-5000:]
    for name in ('world_epoch', 'world_batch_refused', 'world_mid_epoch'): assert checked(w.stdout, name), w.stdout
    maxdiffs(w.stdout)

@pytest.mark.slow  # about 25 s of two launched jobs; CI runs it
def test_preemption_resumes_exactly(tmp_path):
    """SIGTERM to the launcher in the middle of epoch 1: every rank finishes its step, the same step on both, a
    checkpoint is written and the job exits with 128+15; the next launch resumes and ends as an uninterrupted run"""
    out = tmp_path/'out.txt'
    cmd = [sys.executable, '-m', 'distrib.launch', '--nproc_per_node', '2', str(JOB), 'train', str(tmp_path)]
    with open(out, 'w') as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                             env=dict(os.environ, PYTHONUNBUFFERED='1'))
    try:
        _wait_for(out, 'MIDEPOCH', p)
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None: p.kill()
    text = out.read_text()
    assert rc == 128 + signal.SIGTERM, text[-5000:]
    # the ranks' lines may interleave: not anchored to a line
    stops = re.findall(r'PREEMPTED rank (\d) step (\d+) file (\S+) code (\d+)', text)
    assert sorted(s[0] for s in stops) == ['0', '1'] and len({s[1:] for s in stops}) == 1, text[-5000:]
    assert stops[0][3] == '143' and 'finished without being stopped' not in text, text[-5000:]
    assert checkpoints(tmp_path/'ck')[-1][1].name == stops[0][2], os.listdir(tmp_path/'ck')   # the latest
    r = launch(JOB, 'resume', tmp_path, nproc=2, timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert checked(r.stdout, 'preempt_resumed') and checked(r.stdout, 'preempt_exact'), r.stdout[-3000:]
    maxdiffs(r.stdout)
