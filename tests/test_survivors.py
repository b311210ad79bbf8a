"""A lost rank costs seconds (issue 50): under `python -m distrib.launch --on-failure continue`, 3 CPU processes, a
rank SIGKILLed in the middle of epoch 1 (tests/scripts/survivors.py): the two survivors' next optimizer step ends
within 10 s of the kill, in the same processes (same pids), the job exits 0, and its weights are those of one
process trained with the same global batch over the same order (1e-5). Rank 2 lost (a batch-mean loss), then rank
0 (the survivors renumber; the store lives in the launcher) with a loss over items (`ItemMean` all-reduces each
step's count, over the new world after the loss). A global batch of 3 cannot be kept by 2 survivors: refused in one
line from the launcher and one `SurvivorError`, or, with `DISTRIB_ALLOW_BATCH_CHANGE=1`, the job goes on with 2 (two
jobs: marked slow). The heartbeat layer follows the survivors' world: a survivor that stalls after the re-form is
reported by its new rank, waiting for the other's. A loss in a validation pass: the pass is done again on the
survivors, its metrics those of one process. Two losses one after the other (4 processes, then 3, then 2). A loss
where the survivors cannot go on (a `Checkpoint` written at an epoch's end): refused in one line naming the rank.
A node lost with its launcher (two launchers as two nodes, the store apart: marked slow): the survivor publishes the
loss itself and goes on.
Run with `pytest -s` to see the SURVIVORS lines (the times)."""
import os, re, socket, subprocess, sys
import pytest
import torch
from conftest import launch, new_tag, orphans, SCRIPTS, ROOT

JOB = SCRIPTS/'survivors.py'

def _ref(d, loss:str, G:int=6)->tuple:
    "The weights and the Recorder's values of one process trained with the whole global batch `G`, in the same order"
    r = subprocess.run([sys.executable, str(JOB), 'ref', str(d), loss], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env={**os.environ, 'SURVIVORS_G': str(G)})
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(d/f'ref-{loss}.pt'), torch.load(d/f'ref-{loss}-values.pt')

@pytest.fixture(scope='module')
def ref(tmp_path_factory):
    "The weights of one process trained with the whole global batch, in the same order, for each loss"
    d = tmp_path_factory.mktemp('ref')
    return {loss: _ref(d, loss)[0] for loss in ('mean', 'items')}

def _job(tmp_path, victim:int=2, nproc:int=3, loss:str='mean', **env):
    "Launch the job under --on-failure continue; its result and a text to show when an assertion fails"
    r = launch(JOB, 'job', tmp_path, loss, victim, nproc=nproc, launcher_args=('--on-failure', 'continue'),
               timeout=240, env=env)
    return r, f"exit code {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"

def _diff(got:dict, want:dict)->float: return max((got[k] - want[k]).abs().max().item() for k in want)

def _steps(path)->list:
    "The (pid, epoch, batch, time) of each optimizer step a rank wrote"
    return [(int(p), int(e), int(b), float(t)) for p, e, b, t in re.findall(r'^STEP (\d+) (\d+) (\d+) (\S+)$',
                                                                           path.read_text(), re.M)]

@pytest.mark.parametrize('victim,loss', [(2, 'mean'), (0, 'items')])
def test_survivors_go_on(ref, tmp_path, victim, loss):
    r = launch(JOB, 'job', tmp_path, loss, victim, nproc=3, launcher_args=('--on-failure', 'continue'), timeout=240)
    text = f"exit code {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    assert r.returncode == 0 and 'DONE world 2' in r.stdout, text
    killed = float(re.search(r'^KILL_AT (\S+)$', r.stdout, re.M)[1])
    line = re.search(rf'^distrib: lost rank {victim} killed by SIGKILL; 2 survivor\(s\) go on .*$', r.stderr, re.M)
    assert line, text
    for rank in sorted({0, 1, 2} - {victim}):
        steps = _steps(tmp_path/f'steps{rank}.txt')
        assert len({p for p, *_ in steps}) == 1, (rank, 'another process', steps[:3])   # the same process throughout
        assert [(e, b) for _, e, b, _ in steps] == [(e, b) for e in range(3) for b in range(16)], (rank, steps)
        after = min(t for *_, t in steps if t > killed)
        assert after - killed <= 10, (rank, after - killed)
    got = torch.load(tmp_path/'weights.pt')
    diff = max((got[k] - ref[loss][k]).abs().max().item() for k in ref[loss])
    assert diff <= 1e-5, diff
    print(f"\nSURVIVORS rank {victim} lost: first step of a survivor {after - killed:.2f} s after the kill, "
          f"weights {diff:.1e} from one process; {line[0]}")

@pytest.mark.slow
def test_global_batch_not_kept_refused_or_allowed(tmp_path):
    "3 processes of 1 sample each, rank 2 lost: 2 survivors cannot keep 3; refused, or shrunk when allowed"
    r = launch(JOB, 'job', tmp_path, 'mean', 2, nproc=3, launcher_args=('--on-failure', 'continue'), timeout=240,
               env={'SURVIVORS_G': '3'})
    text = f"exit code {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    assert r.returncode == 1, text
    assert ('distrib.launch: --on-failure continue: the job lost rank 2 (killed by SIGKILL) and went on; then the '
            'survivors failed:') in r.stderr, text
    want = 'SurvivorError: after the loss of rank 2 (killed by SIGKILL), 2 survivors cannot keep the global batch of 3'
    assert want in r.stderr, text
    r = launch(JOB, 'job', tmp_path, 'mean', 2, nproc=3, launcher_args=('--on-failure', 'continue'), timeout=240,
               env={'SURVIVORS_G': '3', 'DISTRIB_ALLOW_BATCH_CHANGE': '1'})
    text = f"exit code {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    assert r.returncode == 0 and 'DONE world 2' in r.stdout, text
    assert 'global batch 3 now 2 (1 per rank)' in r.stderr, text

def test_liveness_follows_survivors(ref, tmp_path):
    """Rank 0 lost; then start rank 2, rank 1 of the survivors' world, stalls 5 s after a step: its watchdog, of the
    new world, reports it by its new rank while rank 0 (start rank 1) waits: heartbeats, counters and the stall check
    run over the survivors; the job still ends exact"""
    r, text = _job(tmp_path, 0, SURVIVORS_STALL='2', DISTRIB_STALL_REPORT='2')
    assert r.returncode == 0 and 'DONE world 2' in r.stdout, text
    assert re.search(r'^distrib: probable stall: rank 1 has been in .* while rank 0 waits in ', r.stderr, re.M), text
    assert _diff(torch.load(tmp_path/'weights.pt'), ref['mean']) <= 1e-5

def test_loss_in_validation_redone(tmp_path):
    "Rank 2 lost in the validation pass of epoch 1: the survivors do it again; metrics and weights as one process's"
    want, values = _ref(tmp_path, 'mean')
    r, text = _job(tmp_path, SURVIVORS_KILLS='2:1:1:valid')
    assert r.returncode == 0 and 'DONE world 2' in r.stdout, text
    line = re.search(r'^distrib: lost rank 2 killed by SIGKILL; 2 survivor\(s\) go on in their own processes from '
                     r'the validation pass of epoch 1, again, .*$', r.stderr, re.M)
    assert line, text
    got = torch.load(tmp_path/'values.pt')
    assert len(got) == len(values) == 3, (got, values)
    for g, v in zip(got, values):   # [train_loss, valid_loss] per epoch
        assert abs(g[1] - v[1]) <= 1e-6 * abs(v[1]), (got, values)
    assert max(abs(g[0] - v[0]) for g, v in zip(got, values)) <= 1e-6, (got, values)   # no step lost in training
    diff = _diff(torch.load(tmp_path/'weights.pt'), want)
    assert diff <= 1e-5, diff
    print(f"\nSURVIVORS validation: valid losses {[round(g[1], 6) for g in got]} (one process "
          f"{[round(v[1], 6) for v in values]}), weights {diff:.1e}; {line[0]}")

def test_two_losses(tmp_path):
    """4 processes, a global batch of 12: rank 2 lost in epoch 1, then rank 1 in epoch 2 (rank 1 of 3 then): two
    lines, the job ends on 2 survivors with one process's weights"""
    want, values = _ref(tmp_path, 'mean', 12)
    r, text = _job(tmp_path, nproc=4, SURVIVORS_G='12', SURVIVORS_KILLS='2:1:5:train,1:2:3:train')
    assert r.returncode == 0 and 'DONE world 2' in r.stdout, text
    lines = re.findall(r'^distrib: lost rank (\d) killed by SIGKILL; (\d) survivor\(s\) go on .*$', r.stderr, re.M)
    assert lines == [('2', '3'), ('1', '2')], text
    for rank in (0, 3):
        steps = [(int(e), int(b)) for e, b in re.findall(r'^STEP \d+ (\d+) (\d+) ', (tmp_path/f'steps{rank}.txt')
                                                           .read_text(), re.M)]
        assert steps == [(e, b) for e in range(3) for b in range(8)], (rank, steps)
    diff = _diff(torch.load(tmp_path/'weights.pt'), want)
    assert diff <= 1e-5, diff
    got = torch.load(tmp_path/'values.pt')   # [train_loss, valid_loss] per epoch
    assert all(abs(g[1] - v[1]) <= 1e-6 * abs(v[1]) for g, v in zip(got, values)), (got, values)
    assert abs(got[0][0] - values[0][0]) <= 1e-6 * abs(values[0][0]), (got, values)   # before any loss
    off = [abs(g[0] - v[0]) / abs(v[0]) for g, v in zip(got, values)]   # the epochs of a loss: the lost rank's share
    print(f"\nSURVIVORS two losses: weights {diff:.1e} from one process; valid losses equal; the training loss of "
          f"each epoch off by {', '.join(f'{o:.1e}' for o in off)} (relative; a loss in epochs 1 and 2)")

def test_loss_at_pass_end_refused(tmp_path):
    """Rank 2 lost at the end of epoch 1's training pass: the survivors' all-reduce of the pass's losses (the
    Recorder's `after_train`) fails outside a training batch or a validation pass; refused in one line naming the
    rank, its cause and where"""
    r, text = _job(tmp_path, SURVIVORS_KILLS='2:1:0:end')
    assert r.returncode == 1, text
    assert ('distrib.launch: --on-failure continue: the job lost rank 2 (killed by SIGKILL) and went on; then the '
            'survivors failed:') in r.stderr, text
    assert ('SurvivorError: rank 2 was lost (killed by SIGKILL) in after_train of epoch 1: --on-failure continue '
            'goes on from a training batch or a validation pass, not from there') in r.stderr, text

def test_checkpoint_refused(tmp_path):
    "A Checkpoint under --on-failure continue is refused before the first step, in one line"
    r, text = _job(tmp_path, SURVIVORS_CHECKPOINT='1', SURVIVORS_KILLS='2:9:0:train')
    assert r.returncode == 1, text
    assert 'SurvivorError: --on-failure continue with a Checkpoint: after a loss its world size' in r.stderr, text

def _free_port()->int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]

@pytest.mark.slow
def test_node_lost_survivor_goes_on(ref, tmp_path):
    """Two launchers on this machine as two nodes (`--nnodes 1:2 --nproc_per_node 1`, a c10d rendezvous whose store is
    apart from the nodes: `python -m distrib.launch.store`, `is_host=false`), `--on-failure continue`: the node of rank
    0, its launcher and then its worker, SIGKILLed before the backward of batch 5 of epoch 1. No launcher sees that
    loss: the survivor's watchdog finds rank 0 gone and publishes it; the survivor goes on alone, in its process, its
    first step within 10 s of the kill, to the weights of one process (1e-5); its launcher exits 0 without waiting
    for the lost node at the end"""
    port, tag = _free_port(), new_tag()
    env = dict(os.environ, PYTHONUNBUFFERED='1', DISTRIB_TEST_TAG=tag, SURVIVORS_KILLS='0:1:5:node')
    store = subprocess.Popen([sys.executable, '-m', 'distrib.launch.store', '--host', '127.0.0.1', '--port', str(port)],
                             env=env, stdout=subprocess.PIPE, text=True)
    assert store.stdout.readline().startswith('distrib.launch.store: the rendezvous store listens on port')
    cmd = [sys.executable, '-m', 'distrib.launch', '--nnodes', '1:2', '--nproc_per_node', '1', '--rdzv_backend', 'c10d',
           '--rdzv_endpoint', f'127.0.0.1:{port}', '--rdzv_conf', 'is_host=false,last_call_timeout=3',
           '--on-failure', 'continue', str(JOB), 'job', str(tmp_path), 'mean', '0']
    logs, nodes = [tmp_path/f'node{i}.txt' for i in range(2)], []
    try:
        for log in logs:
            with open(log, 'w') as f: nodes.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                                                                    env=env, start_new_session=True))
        rcs = [p.wait(timeout=180) for p in nodes]
    finally:
        store.terminate()   # SIGTERM: the store ends cleanly
        for p in nodes + [store]:
            try: p.wait(timeout=10)
            except subprocess.TimeoutExpired: p.kill(); p.wait(timeout=10)
    outs = [log.read_text() for log in logs]
    lost = next((i for i, o in enumerate(outs) if 'KILL_AT' in o), None)
    text = '\n=====\n'.join(o[-4000:] for o in outs)
    assert lost is not None and rcs[lost] == -9 and rcs[1 - lost] == 0, (rcs, text)
    out = outs[1 - lost]
    assert 'DONE world 1' in out, text
    line = re.search(r'^distrib: lost rank 0 with its launcher: .*; 1 survivor\(s\) go on .*$', out, re.M)
    assert line, text
    assert 'this node does not wait for the others at the end' in out, text
    killed = float(re.search(r'^KILL_AT (\S+)$', outs[lost], re.M)[1])
    steps = _steps(tmp_path/'steps1.txt')
    assert len({p for p, *_ in steps}) == 1, ('another process', steps[:3])
    assert [(e, b) for _, e, b, _ in steps] == [(e, b) for e in range(3) for b in range(16)], steps
    after = min(t for *_, t in steps if t > killed)
    assert after - killed <= 10, after - killed
    diff = _diff(torch.load(tmp_path/'weights.pt'), ref['mean'])
    assert diff <= 1e-5, diff
    assert not orphans(tag), orphans(tag)
    print(f"\nSURVIVORS node of rank 0 lost: first step of the survivor {after - killed:.2f} s after the kill, "
          f"weights {diff:.1e} from one process; {line[0]}")
