"""Lose processes, keep training (issue 26): a job killed in the middle of an epoch (rank 1 SIGKILLed) and launched
again at once on another number of processes resumes from its last checkpoint at the next global step, with the
global batch kept (each rank reads 8 // W): 2 -> 1, 2 -> 4 and 4 -> 2 processes under DDP, 2 -> 1 under FSDP (a
sharded checkpoint). Each resumed job checks (tests/scripts/reshard.py) that a script keeping the old per-rank batch
is refused before a step, that every global step after the resume read the samples of the uninterrupted 2-process
run, and the final weights and `recorder.values` against it (1e-5). Five launches in a chain (a job resumes, then
starts the next killed run): run with `pytest -s` to see the MAXDIFF lines and the seconds from the kill to the
first step after the resume (RESHARD lines). An iterable training set stopped on 1 process resumes on 2 (in the same
jobs); a refused checkpoint is not restarted; a node lost under `--nnodes 1:2`: the survivor resumes alone."""
import os, re, shutil, signal, socket, subprocess, sys, time
import pytest
from conftest import launch, checked, new_tag, orphans, SCRIPTS, ROOT

# Chains of launches and a node lost (about 3 minutes on 2 cores): outside the README's test command, run by CI with
# `python -m pytest -n 2 -m slow tests`
pytestmark = pytest.mark.slow

JOB = SCRIPTS/'reshard.py'
CHECKS = ('reshard_refused', 'reshard_resumed', 'reshard_samples', 'reshard_exact')

def _stamp(out:str, what:str)->float: return float(re.search(rf'^{what} (\S+)$', out, re.M)[1])

def _run(steps:str, d, nproc:int):
    "Launch reshard.py `steps` in `d` on `nproc` processes: (CompletedProcess, its start and end times)"
    start = time.time()
    r = launch(JOB, steps, d, nproc=nproc, timeout=150)
    r.text, r.start, r.end = f"exit code {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}", start, time.time()
    return r

@pytest.fixture(scope='module')
def chain(tmp_path_factory):
    """The uninterrupted 2-process run and the same killed (A); 1 process resumes A, then trains from an iterable set,
    stopped mid-epoch (B); 4 resume a copy of A, then 4 are killed (C); 2 resume C, then B's iterable run, then 2 are
    killed under FSDP (D); 1 resumes D under FSDP (E). {case: (the killed job, the resuming job)}"""
    d = tmp_path_factory.mktemp('reshard')
    (d/'a').mkdir()
    a = _run('ref+kill', d/'a', 2)
    assert 'KILL_AT' in a.stdout and (d/'a'/'ref.pt').exists(), a.text
    a.ref = d/'a'/'ref.pt'
    shutil.copytree(d/'a', d/'c')
    b = _run('resume+iterstop', d/'a', 1)
    c = _run('resume+kill', d/'c', 4)
    if (d/'a'/'iter').exists(): shutil.copytree(d/'a'/'iter', d/'c'/'next'/'iter')
    dd = _run('resume+iterresume+killfsdp', d/'c'/'next', 2)
    e = _run('resumefsdp', d/'c'/'next'/'next', 1)
    return {'2->1': (a, b), '2->4': (a, c), '4->2': (c, dd), '2->1 fsdp': (dd, e), '1->2 iterable': (b, dd)}

@pytest.mark.parametrize('case', ['2->1', '2->4', '4->2', '2->1 fsdp'])
def test_resume_mid_epoch_on_other_world(chain, case):
    "The resumed job: refuses another global batch, then resumes at the next global step, as the uninterrupted run"
    killed, resumed = chain[case]
    assert 'KILL_AT' in killed.stdout and killed.returncode != 0, killed.text
    for name in CHECKS: assert checked(resumed.stdout, name), (name, resumed.text)
    if case in ('2->1', '2->1 fsdp'): assert resumed.returncode == 0, resumed.text   # the others then are killed
    # kill -> end of the killed job, + start of the next job -> its first step after the resume (the relaunch itself
    # is at once here: a scheduler or torchrun's agent adds its own delay)
    secs = (killed.end - _stamp(killed.stdout, 'KILL_AT')) + (_stamp(resumed.stdout, 'FIRST_STEP') - resumed.start)
    print('\n' + re.search(r'^MAXDIFF .*$', resumed.stdout, re.M)[0] +
          f"\nRESHARD {case}: {secs:.1f} s from the kill to the first step after the resume")

def test_iterable_resumes_on_other_world(chain):
    """An iterable training set (iter_shard) stopped mid-epoch on 1 process resumes on 2: the epoch's first batches
    dropped, the same samples in each later step, the uninterrupted run's weights and values"""
    stopped, resumed = chain['1->2 iterable']
    assert stopped.returncode == 0, stopped.text
    for name in CHECKS: assert checked(resumed.stdout, name + '_iterable'), (name, resumed.text)
    print('\n' + re.search(r'^MAXDIFF .*iterable.*$', resumed.stdout, re.M)[0])

def test_refused_checkpoint_not_restarted(chain, tmp_path):
    """A checkpoint refused (another global batch) under `--max_restarts 2`: one attempt, the launcher says why it
    does not restart, the job's exit code is 1"""
    shutil.copytree(chain['2->1'][0].ref.parent, tmp_path/'run', ignore=shutil.ignore_patterns('next'))
    r = launch(JOB, 'refuse', tmp_path/'run', nproc=1, launcher_args=('--max_restarts', '2'), timeout=90)
    text = r.stdout + r.stderr
    assert r.returncode == 1 and text.count('REFUSE ATTEMPT') == 1, text[-5000:]
    want = 'distrib.launch: not restarting (2 restarts left): a restart cannot change ResumeError:'
    assert want in text, text[-5000:]

def _free_port()->int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]

def test_node_lost_survivor_finishes(chain, tmp_path):
    """Two launchers on this machine as two nodes (`--nnodes 1:2 --nproc_per_node 1`, c10d rendezvous on localhost,
    its store in a process of its own: `python -m distrib.launch.store`, and `is_host=false`), `--max_restarts 3`:
    the node of rank 0 (launcher and worker) SIGKILLed in the middle of epoch 2; the survivor's agent restarts its
    worker as a world of 1 after the rendezvous' last call (3 s here), which resumes from step 20 with the global
    batch kept and ends as the uninterrupted run (reshard.py's checks); the survivor exits 0"""
    shutil.copy(chain['2->1'][0].ref, tmp_path/'ref.pt')
    port, tag = _free_port(), new_tag()
    env = dict(os.environ, PYTHONUNBUFFERED='1', DISTRIB_TEST_TAG=tag)
    store = subprocess.Popen([sys.executable, '-m', 'distrib.launch.store', '--host', '127.0.0.1', '--port', str(port)],
                             env=env, stdout=subprocess.PIPE, text=True)
    assert store.stdout.readline().startswith('distrib.launch.store: the rendezvous store listens on port')
    cmd = [sys.executable, '-m', 'distrib.launch', '--nnodes', '1:2', '--nproc_per_node', '1', '--rdzv_backend', 'c10d',
           '--rdzv_endpoint', f'127.0.0.1:{port}', '--rdzv_conf', 'is_host=false,last_call_timeout=3',
           '--max_restarts', '3', str(JOB), 'elastic', str(tmp_path)]
    logs = [tmp_path/f'node{i}.txt' for i in range(2)]
    nodes = []
    try:
        for log in logs:
            with open(log, 'w') as f: nodes.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                                                                    env=env, start_new_session=True))
        end = time.monotonic() + 90
        while not any('MIDEPOCH' in l.read_text() for l in logs) and time.monotonic() < end: time.sleep(0.2)
        lost = next((i for i, l in enumerate(logs) if 'MIDEPOCH' in l.read_text()), None)
        assert lost is not None, '\n'.join(l.read_text()[-3000:] for l in logs)
        killed = time.time()
        os.killpg(nodes[lost].pid, signal.SIGKILL)   # the node of rank 0: its launcher and its worker
        rc = nodes[1 - lost].wait(timeout=120)
    finally:
        store.terminate()   # SIGTERM: the store ends cleanly
        for p in nodes + [store]:
            try: p.wait(timeout=10)
            except subprocess.TimeoutExpired: p.kill(); p.wait(timeout=10)
    out = logs[1 - lost].read_text()
    assert rc == 0, out[-5000:]
    assert 'ATTEMPT 1 WORLD 1' in out, out[-5000:]
    for name in CHECKS: assert checked(out, name), (name, out[-5000:])
    print('\n' + re.search(r'^MAXDIFF .*$', out, re.M)[0] + f"\nRESHARD node lost, 2->1: "
          f"{_stamp(out, 'FIRST_STEP') - killed:.1f} s from the kill to the first step after the resume")
    assert not orphans(tag), orphans(tag)

def _listening(port:int)->bool:
    "True when something accepts connections on 127.0.0.1:`port`"
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(('127.0.0.1', port)) == 0

def test_lost_store_says_host_it_apart(tmp_path):
    """The same two nodes without a store of its own: the first launcher hosts it (is_host by default); when that node
    is lost, the other ends (exit code 1) with a line that says to host the store apart"""
    port, tag = _free_port(), new_tag()
    env = dict(os.environ, PYTHONUNBUFFERED='1', DISTRIB_TEST_TAG=tag)
    cmd = [sys.executable, '-m', 'distrib.launch', '--nnodes', '1:2', '--nproc_per_node', '1', '--rdzv_backend', 'c10d',
           '--rdzv_endpoint', f'127.0.0.1:{port}', '--rdzv_conf', 'last_call_timeout=3', '--max_restarts', '3',
           str(JOB), 'elastic', str(tmp_path)]
    logs, nodes = [tmp_path/f'node{i}.txt' for i in range(2)], []
    try:
        for log in logs:
            with open(log, 'w') as f: nodes.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                                                                    env=env, start_new_session=True))
            end = time.monotonic() + 60   # the first node binds the store before the second starts
            while not _listening(port) and time.monotonic() < end: time.sleep(0.2)
        end = time.monotonic() + 40   # both training (or the second still joining: it needs the store all the same)
        while not all('ATTEMPT 0' in l.read_text() for l in logs) and time.monotonic() < end: time.sleep(0.2)
        os.killpg(nodes[0].pid, signal.SIGKILL)   # the node that hosts the store
        rc = nodes[1].wait(timeout=90)
    finally:
        for p in nodes:
            if p.poll() is None: os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
    out = logs[1].read_text()
    assert rc == 1 and 'distrib.launch: error: the rendezvous did not complete' in out, out[-5000:]
    assert 'Host it apart from the nodes: `python -m distrib.launch.store --port PORT`' in out, out[-5000:]
    assert not orphans(tag), orphans(tag)
