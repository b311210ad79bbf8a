"""Faults end the whole job quickly, and the launcher's output names the rank and the cause; bad set-ups fail on
every rank at once, never hang. Run with `pytest -s` to see how long each fault took to end."""
import os, re, signal, subprocess, sys, time
import pytest, torch
from conftest import launch, SCRIPTS, ROOT

def report(fault, secs, since='the fault'): print(f"\nFAULT-TIME {fault}: ended {secs:.1f} s after {since}")

def run_fault(mode, *args):
    "Launch fault.py MODE on 2 ranks: (CompletedProcess, seconds from rank 1's fault to the launcher's exit)"
    r = launch(SCRIPTS/'fault.py', mode, *args, nproc=2, timeout=150)
    end = time.time()
    m = re.search(r'FAULT_AT ([\d.]+)', r.stdout)
    assert m, r.stdout + r.stderr
    return r, end - float(m.group(1))

def summary(r):
    "The launcher's own lines of the output"
    return '\n'.join(l for l in r.stderr.splitlines() if l.startswith('distrib.launch:'))

def test_rank_raises_in_fit():
    "ValueError on rank 1 only, at batch 3: rank 0 waits in the gradient all-reduce; the job ends, naming rank 1"
    r, secs = run_fault('raise')
    report('rank 1 raises in before_batch', secs)
    assert r.returncode == 1, r.stderr
    assert summary(r).startswith('distrib.launch: rank 1 failed (exit code 1): ValueError: bad batch on purpose'), r.stderr
    assert 'the fault did not happen' not in r.stdout
    assert secs < 30

def test_rank_killed():
    r, secs = run_fault('sigkill')
    report('rank 1 SIGKILLed mid-epoch', secs)
    assert r.returncode == 128 + 9, r.stderr
    assert summary(r).startswith('distrib.launch: rank 1 failed (exit code -9): killed by signal 9 (SIGKILL)'), r.stderr
    assert secs < 30

@pytest.mark.parametrize('mode,op', [('hang', 'all_reduce of gradients in backward'), ('barrier', 'barrier timed out')])
def test_collective_timeout_names_op(mode, op):
    "Rank 1 stuck (not dead) past a 3 s timeout: rank 0's collective fails with an error naming the collective"
    r, secs = run_fault(mode, 3)
    report(f'collective stuck past a 3 s timeout ({mode})', secs)
    assert r.returncode == 1, r.stderr
    s = summary(r)
    assert s.startswith('distrib.launch: rank 0 failed (exit code 1): CollectiveTimeoutError: '), s
    assert op in s.splitlines()[0] and 'distrib_ctx(timeout=...)' in s, s
    assert 'rank 1 ended (exit code -15): stopped by the launcher (SIGTERM)' in s, s
    assert secs < 30

def _wait_for(path, marker, proc, timeout=120):
    "Wait until `marker` appears in file `path` written by `proc`; return the file's text"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        text = path.read_text()
        if marker in text: return text
        assert proc.poll() is None, f"launcher ended early: {text}"
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"no {marker} within {timeout} s")

def _gone(pid)->bool:
    "True when process `pid` no longer runs (absent, or a zombie waiting to be reaped)"
    try: return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0] == 'Z'
    except FileNotFoundError: return True

@pytest.mark.parametrize('sig,stubborn', [(signal.SIGINT, False), (signal.SIGTERM, True)])
def test_launcher_signal_stops_all(tmp_path, sig, stubborn):
    """Ctrl-C (SIGINT) or SIGTERM to the launcher: every worker is gone within 10 s, also one that ignores both
    signals (killed after the launcher's --shutdown_timeout of 5 s), and the launcher exits with 128+N"""
    out = tmp_path/'out.txt'
    cmd = [sys.executable, '-m', 'distrib.launch', '--nproc_per_node', '2', str(SCRIPTS/'interrupt.py')] + (['stubborn'] if stubborn else [])
    with open(out, 'w') as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED='1'))
    try:
        text = _wait_for(out, 'STUBBORN' if stubborn else 'TRAINING', p)
        pids = [int(x) for x in re.findall(r'PID \d (\d+)', text)]
        assert len(pids) == 2, text
        start = time.time()
        p.send_signal(sig)
        rc = p.wait(timeout=60)
        secs = time.time() - start
    finally:
        if p.poll() is None: p.kill()
    report(f'{signal.Signals(sig).name} to the launcher' + (' (a worker ignores it)' if stubborn else ''), secs, since='the signal')
    text = out.read_text()
    assert rc == 128 + sig, text
    assert f'distrib.launch: stopped by {signal.Signals(sig).name}' in text, text
    assert 'Traceback' not in text, text
    assert all(_gone(pid) for pid in pids), [(pid, _gone(pid)) for pid in pids]
    assert secs < 10

CASES = {  # case of disagree.py: (exception type, words of the message)
    'len_dl': ('RuntimeError', ['disagree', 'training batches per rank: rank 0: 4, rank 1: 3',
                                'dataset length of each loader: rank 0: [64, 16], rank 1: [48, 16]']),
    'params': ('RuntimeError', ['DDP expects same model across all ranks']),
    'grown': ('RuntimeError', ['disagree', 'model parameter tensors: rank 0: 2, rank 1: 4', 'model parameter elements: rank 0: 4, rank 1: 10']),
    'epochs': ('RuntimeError', ['disagree', 'epochs (start_epoch, n_epoch): rank 0: [0, 1], rank 1: [0, 2]']),
    'callback': ('RuntimeError', ['disagree', "rank 1: ['AllReduceEachEpoch', 'DistributedTrainer'", 'local_only = True']),
    'local_only': ('OK', []),
    'tiny': ('ValueError', ['training set has 1 sample, fewer than the 2 ranks', '--nproc_per_node 1']),
    'nested': ('RuntimeError', ['nested twice']),
    'cuda': ('RuntimeError', ['torch.cuda.is_available() is False']),
}

def test_bad_setups_fail_on_every_rank():
    """Ranks that disagree before training (len(dl), parameters, epochs, a callback on one rank only), a training set
    smaller than the world, distrib_ctx nested, a CUDA device without a GPU: each raises the same clear error on
    both ranks at the start, in one job that goes on to the next case (so none of them hung)"""
    cases = {k: v for k, v in CASES.items() if k != 'cuda' or not torch.cuda.is_available()}  # 'cuda': no GPU here
    r = launch(SCRIPTS/'disagree.py', *cases, nproc=2, timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    for case, (etype, words) in cases.items():
        lines = re.findall(rf'^CASE {case} rank (\d) ([\d.]+)s (.*)$', r.stdout, re.M)
        assert sorted(l[0] for l in lines) == ['0', '1'], (case, r.stdout)
        assert lines[0][2] == lines[1][2] or case == 'params', (case, lines)  # DDP's own message names the rank
        secs = max(float(l[1]) for l in lines)
        report(f'bad set-up {case!r}', secs, since='the case began, on both ranks')
        assert secs < 30
        for _, _, res in lines:
            assert res.startswith(etype), (case, res)
            for w in words: assert w in res, (case, w, res)

def test_batch_size_below_one():
    from torch.utils.data import TensorDataset
    from distrib import DistributedDL
    for bs in (0, -1):
        with pytest.raises(ValueError, match=f'Invalid batch_size {bs}'): DistributedDL(TensorDataset(torch.arange(4)), batch_size=bs, rank=0, world_size=2)
