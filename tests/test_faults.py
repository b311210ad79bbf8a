"""Faults end the whole job quickly, the launcher's output names the rank and the cause, and no process is left
behind; bad set-ups fail on every rank at once, never hang. Run with `pytest -s` to see how long each fault took to
end (the FAULT-TIME lines). Signals to the launcher: tests/test_launcher_signals.py; bad set-ups: test_disagree.py."""
import re, time
from concurrent.futures import ThreadPoolExecutor
import pytest
from conftest import launch, orphans, report, SCRIPTS

LIVENESS = '3'  # DISTRIB_LIVENESS_TIMEOUT of these jobs: a frozen rank counts as dead after 3 s (default 20)


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
    dirs = {m: tmp_path_factory.mktemp(m) for m in jobs}  # here: pytest's mktemp is not safe across threads
    def run(mode): return mode, run_fault(mode, *jobs[mode], tmp=dirs[mode])
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
