"""Faults end the whole job quickly, the launcher's output names the rank and the cause, and no process is left
behind; bad set-ups fail on every rank at once, never hang. Run with `pytest -s` to see how long each fault took to
end (the FAULT-TIME lines)."""
import os, re, signal, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
import pytest, torch
from conftest import launch, orphans, new_tag, tagged, SCRIPTS, ROOT

LIVENESS = '3'  # DISTRIB_LIVENESS_TIMEOUT of these jobs: a frozen rank counts as dead after 3 s (default 20)

def report(fault, secs, since='the fault'): print(f"\nFAULT-TIME {fault}: ended {secs:.1f} s after {since}")

def run_fault(mode, *args, tmp=None):
    "Launch fault.py MODE on 2 ranks: (CompletedProcess, seconds from the fault to the launcher's exit)"
    env = dict(DISTRIB_LIVENESS_TIMEOUT=LIVENESS, FAULT_DIR=str(tmp or ''))
    r = launch(SCRIPTS/'fault.py', mode, *args, nproc=2, timeout=150, env=env)
    end = time.time()
    m = re.search(r'FAULT_AT ([\d.]+)', r.stdout)
    assert m, r.stdout + r.stderr
    assert 'the fault did not happen' not in r.stdout
    return r, end - float(m.group(1))

def summary(r):
    "The launcher's own lines of the output"
    return '\n'.join(l for l in r.stderr.splitlines() if l.startswith('distrib.launch:'))

B3 = 'before_batch (epoch 0, training batch 3)'
RAISED = 'ValueError: bad batch on purpose'
FAULTS = {  # fault.py mode: (the launcher's exit code, the start of its first line, words of its other lines)
    'raise': (1, f'rank 1 failed (exit code 1): {RAISED} (in {B3})', ['rank 0 ended']),
    'sigkill': (137, 'rank 1 failed (exit code -9): killed by signal 9 (SIGKILL)', []),
    'freeze': (137, f'rank 1 failed (exit code -9): killed by signal 9 (SIGKILL); rank 0 saw: froze: its process is '
                    f'stopped (SIGSTOP or a debugger) and silent for 3 s in {B3}', []),
    'sigint': (130, f'rank 1 failed (exit code 130): KeyboardInterrupt: interrupted (SIGINT) in {B3}', []),
    'exit0': (1, 'rank 1 failed: exited with code 0 before joining the process group (which can then never be '
                 'complete) (reported by rank 0)', ['rank 0 ended (exit code 1): PeerFailedError']),
    'cancel_fit': (1, f'rank 1 failed (exit code 1): RanksDivergedError: CancelFitException was raised on rank 1 in '
                      f'{B3}, but not on every rank at that point (rank 0 went on without it', []),
    'cancel_epoch': (1, f'rank 1 failed (exit code 1): RanksDivergedError: CancelEpochException was raised on rank 1 '
                        f'in {B3}, but not on every rank', []),
    'cancel_batch': (1, f'rank 1 failed (exit code 1): RanksDivergedError: CancelBatchException was raised on rank 1 '
                        f'in {B3}, but not on every rank', []),
    'save0': (1, "rank 0 failed (exit code 1): RanksDivergedError: rank 0 waits in save ",
              ["rank0_only.pth, but rank 1 waits in backward (DDP's all-reduce of gradients) (epoch 0, "
               "training batch 4)",
               'code that runs it on some ranks only (under `if rank == 0:`) hangs the others']),
    'ignore_term': (1, f'rank 0 failed (exit code 1): {RAISED} (in {B3})',
                    ['rank 1 ended (exit code 1): PeerFailedError: stopped because of rank 0']),
    'freeze_peer': (1, f'rank 0 failed (exit code 1): {RAISED} (in {B3})',
                    ['rank 1 ended (exit code -9): killed by signal 9 (SIGKILL)']),
    'reset0': (1, 'rank 0 failed (exit code 1): ConnectionResetError: [Errno 104] Connection reset by peer', []),
    'pipe0': (1, 'rank 0 failed (exit code 1): BrokenPipeError: [Errno 32] Broken pipe (in after_batch (epoch 0, '
                 'training batch 3))', []),
}

PARALLEL = 2  # fault jobs run at once: they mostly wait (for a heartbeat, a timeout), so they share the 2 cores

@pytest.fixture(scope='module')
def fault_runs(tmp_path_factory):
    """Every job of FAULTS and of the stall cases, PARALLEL at a time: {mode: (CompletedProcess, seconds from the
    fault to the launcher's exit)}"""
    jobs = {m: () for m in FAULTS} | {m: (3,) for m in STALLS}
    def run(mode): return mode, run_fault(mode, *jobs[mode], tmp=tmp_path_factory.mktemp(mode))
    with ThreadPoolExecutor(PARALLEL) as ex: return dict(ex.map(run, jobs))

@pytest.mark.parametrize('mode', FAULTS)
def test_fault_ends_the_job_naming_its_cause(mode, fault_runs):
    """One fault of a kind a cluster sees every week (see fault.py): the job ends within 10 s of it with the right
    exit code, the launcher's first line names the rank at fault and the cause, and no process is left. Frozen
    (SIGSTOP) and exited-early ranks are found by the others' watchdogs, a Cancel*Exception or a barrier on one
    rank is refused at once, a peer that ignores SIGTERM or is frozen does not delay the end, and a rank's own
    ConnectionResetError or BrokenPipeError is the cause, not a lost peer."""
    code, first, others = FAULTS[mode]
    r, secs = fault_runs[mode]
    report(mode, secs)
    s = summary(r)
    assert r.returncode == code, s + r.stderr[-3000:]
    assert s.startswith(f'distrib.launch: {first}'), s
    for w in others: assert w in s, (w, s)
    assert secs < 10, secs
    assert not orphans(r.tag), orphans(r.tag)

STALLS = {'hang': B3, 'barrier': 'its script, outside any Learner event or distrib operation'}

@pytest.mark.parametrize('mode', STALLS)
def test_stall_names_the_rank_that_did_not_arrive(mode, fault_runs):
    """Rank 1 alive but stuck (not dead) past a 3 s timeout, while rank 0 waits in the gradient all-reduce, or in a
    distrib barrier: the launcher names rank 1 and where it is (not rank 0, which waited), and rank 0's error names
    the collective and the timeout to raise"""
    r, secs = fault_runs[mode]
    report(f'{mode}: rank 1 stuck past a 3 s timeout', secs)
    s = summary(r)
    assert r.returncode == 1, s + r.stderr[-3000:]
    assert re.match(r'distrib.launch: rank 1 failed \(exit code (-15|1)\): did not arrive: it is alive and has been '
                    rf'there for at least \d s in {re.escape(STALLS[mode])} \(reported by rank 0\)', s), s
    assert re.search(r'then rank 0 ended \(exit code (1|-15)\): CollectiveTimeoutError: timed out waiting for rank 1',
                     s), s
    op = "all_reduce of gradients in backward" if mode == 'hang' else 'distrib_barrier()'
    assert f'CollectiveTimeoutError: {op}' in r.stderr and 'distrib_ctx(timeout=...)' in r.stderr, r.stderr[-3000:]
    assert secs < 3 + 10, secs
    assert not orphans(r.tag), orphans(r.tag)

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

def _start_training(out, *args):
    "Start the launcher on interrupt.py (which trains until stopped) with a new tag; (Popen, tag, worker pids)"
    tag = new_tag()
    cmd = [sys.executable, '-m', 'distrib.launch', '--nproc_per_node', '2', str(SCRIPTS/'interrupt.py'), *args]
    with open(out, 'w') as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                             env=dict(os.environ, PYTHONUNBUFFERED='1', DISTRIB_TEST_TAG=tag))
    text = _wait_for(out, 'STUBBORN' if args else 'TRAINING', p)
    pids = [int(x) for x in re.findall(r'PID \d (\d+)', text)]
    assert len(pids) == 2, text
    return p, tag, pids

@pytest.mark.parametrize('sig,stubborn', [(signal.SIGINT, False), (signal.SIGTERM, True)])
def test_launcher_signal_stops_all(tmp_path, sig, stubborn):
    """Ctrl-C (SIGINT) or SIGTERM to the launcher: every worker is gone within 10 s, also one that ignores both
    signals (killed after the launcher's --shutdown_timeout of 5 s), and the launcher exits with 128+N"""
    out = tmp_path/'out.txt'
    p, tag, pids = _start_training(out, *(['stubborn'] if stubborn else []))
    try:
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
    assert not orphans(tag), orphans(tag)

def test_launcher_killed_leaves_no_worker(tmp_path):
    """SIGKILL to the launcher (the OOM killer, `kill -9`), which can stop nothing: every worker is gone within 5 s
    (each asked Linux for SIGKILL when its launcher dies), none left training"""
    p, tag, pids = _start_training(tmp_path/'out.txt')
    try:
        start = time.time()
        p.kill(); p.wait(timeout=30)
        while not all(_gone(pid) for pid in pids) and time.time() - start < 30: time.sleep(0.05)
        secs = time.time() - start
        left = orphans(tag)
    finally:
        for pid in tagged(tag): os.kill(pid, signal.SIGKILL)  # this test's own processes, if the property broke
    report('SIGKILL to the launcher', secs, since='the signal')
    assert secs < 5, secs
    assert not left, left

CASES = {  # case of disagree.py: (exception type, words of the message)
    'len_dl': ('RuntimeError', ['disagree', 'training batches per rank: rank 0: 4, rank 1: 3',
                                'dataset length of each loader: rank 0: [64, 16], rank 1: [48, 16]']),
    'params': ('RuntimeError', ['disagree on the model', 'parameter tensors: rank 0: 2, rank 1: 4']),
    'grown': ('RuntimeError', ['disagree', 'model parameter tensors: rank 0: 2, rank 1: 4', 'model parameter elements: rank 0: 4, rank 1: 10']),
    'epochs': ('RuntimeError', ['disagree', 'epochs (start_epoch, n_epoch): rank 0: [0, 1], rank 1: [0, 2]']),
    'callback': ('RuntimeError', ['disagree', "rank 1: ['AllReduceEachEpoch', 'DistributedTrainer'", 'local_only = True']),
    'local_only': ('OK', []),
    'tiny': ('ValueError', ['training set has 1 sample, fewer than the 2 ranks', '--nproc_per_node 1']),
    'nested': ('RuntimeError', ['nested twice']),
    'lr': ('RuntimeError', ['disagree', 'optimizer: rank 0: SGD [{', 'lr=0.01,', 'lr=0.02,']),
    'opt': ('RuntimeError', ['disagree', 'optimizer: rank 0: SGD [{', 'rank 1: Adam [{']),
    'loss': ('RuntimeError', ['disagree', 'loss function: rank 0: torch.nn.functional.mse_loss, rank 1: '
                              'torch.nn.functional.l1_loss']),
    'shuffle': ('RuntimeError', ['disagree', '(shuffle, seed, drop_last, pad) of each loader: rank 0: [(True, 0, '
                                 'False, True), (False, 0, False, False)], rank 1: [(False, 0, False, True)']),
    'dtype': ('RuntimeError', ['disagree on the model', 'parameter dtypes: rank 0: float32 x2, rank 1: float64 x2']),
    'valid_len': ('RuntimeError', ['disagree on the loader to evaluate', 'dataset length: rank 0: 16, rank 1: 12']),
    'preds_len': ('RuntimeError', ['disagree on the loader to evaluate', 'dataset length: rank 0: 16, rank 1: 12']),
    'cancel_all': ('OK', []),
    'long_phase': ('OK', []),  # rank 0 alive in rank0_first or a long_phase past the timeout: not a stall  # a cancel raised on every rank at the same points is taken, not refused
    'cuda': ('RuntimeError', ['torch.cuda.is_available() is False']),
}

def test_bad_setups_fail_on_every_rank():
    """Ranks that disagree before training (len(dl), parameters, epochs, a callback on one rank only) or would
    diverge silently (a learning rate, optimizer, loss function, shuffle or parameter dtype of their own;
    validate/get_preds on loaders of different lengths), a training set smaller than the world, distrib_ctx
    nested, a CUDA device without a GPU; and a cancel on every rank, or rank 0 alive in a declared long phase past
    the timeout, which are no faults: each raises the same clear error on both ranks at the start, in one job
    that goes on to the next case (so none of them hung, and none aborted the process)"""
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
