"""Faults end the whole job quickly, the launcher's output names the rank and the cause, and no process is left
behind; bad set-ups fail on every rank at once, never hang. Run with `pytest -s` to see how long each fault took to
end (the FAULT-TIME lines). The cases of a job alive but not moving (stalls, deadlocks, skewed collectives) run
behind `-m slow`. Signals to the launcher: tests/test_launcher_signals.py; bad set-ups: test_disagree.py."""
import os, re, time, subprocess
from concurrent.futures import ThreadPoolExecutor
import pytest
from conftest import launch, orphans, report, run_forked, new_tag, SCRIPTS

LIVENESS = '3'  # DISTRIB_LIVENESS_TIMEOUT of these jobs: a frozen rank counts as dead after 3 s (default 20)


def run_fault(mode, *args, tmp=None, env=None):
    "Launch fault.py MODE on 2 ranks: (CompletedProcess, seconds from the fault to the launcher's exit)"
    env = dict(DISTRIB_LIVENESS_TIMEOUT=LIVENESS, FAULT_DIR=str(tmp or ''), **(env or {}))
    r = launch(SCRIPTS/'fault.py', mode, *args, nproc=2, timeout=150, env=env)
    end = time.time()
    m = re.search(r'FAULT_AT ([\d.]+)', r.stdout)
    assert m or mode in HEALTHY, r.stdout + r.stderr
    assert ('the fault did not happen' not in r.stdout) or mode in ENDS_WELL, r.stdout + r.stderr
    return r, end - float(m.group(1)) if m else None

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

def run_faults(jobs:dict, tmp_path_factory)->dict:
    """The fault.py jobs `jobs` ({mode: its extra arguments}), PARALLEL at a time: {mode: (CompletedProcess, seconds
    from the fault to the launcher's exit)}"""
    dirs = {m: tmp_path_factory.mktemp(m) for m in jobs}  # here: pytest's mktemp is not safe across threads
    def run(mode): return mode, run_fault(mode, *jobs[mode], tmp=dirs[mode], env=SLOW.get(mode))
    with ThreadPoolExecutor(PARALLEL) as ex: return dict(ex.map(run, jobs))

LATER = ('cancel_epoch', 'cancel_batch', 'pipe0')  # as cancel_fit and reset0 are: behind `-m slow`

@pytest.fixture(scope='module')
def fault_runs(tmp_path_factory):
    "Every job of FAULTS but LATER (see `run_faults`)"
    return run_faults({m: () for m in FAULTS if m not in LATER}, tmp_path_factory)

@pytest.fixture(scope='module')
def slow_runs(tmp_path_factory):
    """The jobs of the cases of a job alive but not moving, and of LATER (see `run_faults`): behind `-m slow`, which
    CI runs, to keep the README's test command short"""
    jobs = ({m: (3,) for m in STALLS} | {m: () for m in DEADLOCKS} | {m: () for m in SLOW} |
            {m: () for m in ('skew', 'skew_abort', 'barrier_bcast', *LATER)})
    return run_faults(jobs, tmp_path_factory)

@pytest.mark.parametrize('mode', [pytest.param(m, marks=pytest.mark.slow) if m in LATER else m for m in FAULTS])
def test_fault_ends_the_job_naming_its_cause(mode, request):
    """One fault of a kind a cluster sees every week (see fault.py): the job ends within 10 s of it with the right
    exit code, the launcher's first line names the rank at fault and the cause, and no process is left. Frozen
    (SIGSTOP) and exited-early ranks are found by the others' watchdogs, a Cancel*Exception or a barrier on one
    rank is refused at once, a peer that ignores SIGTERM or is frozen does not delay the end, and a rank's own
    ConnectionResetError or BrokenPipeError is the cause, not a lost peer."""
    code, first, others = FAULTS[mode]
    r, secs = request.getfixturevalue('slow_runs' if mode in LATER else 'fault_runs')[mode]
    report(mode, secs)
    s = summary(r)
    assert r.returncode == code, s + r.stderr[-3000:]
    assert s.startswith(f'distrib.launch: {first}'), s
    for w in others: assert w in s, (w, s)
    assert secs < 10, secs
    assert not orphans(r.tag), orphans(r.tag)

STALLS = {'hang': B3, 'barrier': 'its script, outside any Learner event or distrib operation'}

@pytest.mark.slow
@pytest.mark.parametrize('mode', STALLS)
def test_stall_names_the_rank_that_did_not_arrive(mode, slow_runs):
    """Rank 1 alive but stuck (not dead) past a 3 s timeout, while rank 0 waits in the gradient all-reduce, or in a
    distrib barrier: the launcher names rank 1 and where it is (not rank 0, which waited), and rank 0's error names
    the collective and the timeout to raise"""
    r, secs = slow_runs[mode]
    report(f'{mode}: rank 1 stuck past a 3 s timeout', secs)
    s = summary(r)
    assert r.returncode == 1, s + r.stderr[-3000:]
    assert re.match(r'distrib.launch: rank 1 failed( \(exit code 1\))?: did not arrive: it is alive and has been '
                    rf'there for at least \d s in {re.escape(STALLS[mode])} \(reported by rank 0\)', s), s
    assert re.search(r'then rank 0 ended \(exit code (1|-15)\): CollectiveTimeoutError: timed out waiting for rank 1',
                     s), s
    op = "all_reduce of gradients in backward" if mode == 'hang' else 'distrib_barrier()'
    assert f'CollectiveTimeoutError: {op}' in r.stderr and 'distrib_ctx(timeout=...)' in r.stderr, r.stderr[-3000:]
    assert secs < 3 + 10, secs
    assert not orphans(r.tag), orphans(r.tag)

CAUGHT = "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one."
CAUGHT_AT = "(raised in the batch (forward and loss) (epoch 0, training batch 4))"

DEADLOCKS = {'caught_gather': 'in the collective gather_object', 'caught_sleep': 'in its script, outside any'}

@pytest.mark.slow
@pytest.mark.parametrize('mode', DEADLOCKS)
def test_deadlock_ends_in_seconds(mode, slow_runs):
    """A caught one-rank error: DDP raises on rank 1 only (the model's branch ran on rank 0's data only), the script
    catches it outside distrib_ctx and goes on (to a gather_object, or to sleep) while rank 0 waits in the gradient
    all-reduce. Rank 0's watchdog sees that no rank can ever move and publishes one verdict within seconds (the
    collective timeout is 60 s), naming rank 1 as its cause: the launcher's first line names rank 1 with the exception
    that started it and distrib's hint; rank 0 ends blaming rank 1, with both positions and its stack"""
    r, secs = slow_runs[mode]
    report(f'{mode}: a caught one-rank error, then a deadlock', secs)
    s = summary(r)
    assert r.returncode == 1, s + r.stderr[-3000:]
    assert s.startswith(f"distrib.launch: rank 1 failed (exit code 1): {CAUGHT}"), s
    first = r.stderr[r.stderr.index('distrib.launch: rank 1 failed'):].split('distrib.launch:   then')[0]
    assert 'Pass find_unused_parameters=True to learn.distrib_ctx()' in first, first  # distrib's hint
    assert first.rstrip().endswith("(in the batch (forward and loss) (epoch 0, training batch 4))"), first
    assert 'then rank 0 ended (exit code 1): PeerFailedError: stopped because of rank 1' in s, s
    assert ("rank 0 waits in backward (DDP's all-reduce of gradients) (epoch 0, training batch 3), but rank 1 left "
            "distrib_ctx by an exception, so it never joins this collective of the context's loop; it is now "
            + DEADLOCKS[mode]) in r.stderr, r.stderr[-3000:]
    assert f"It started when rank 1 left distrib_ctx by {CAUGHT}" in r.stderr and CAUGHT_AT in r.stderr, r.stderr
    assert "Rank 0's main thread (innermost last):" in r.stderr and 'in _backward' in r.stderr, r.stderr[-3000:]
    assert secs < 15, secs
    assert not orphans(r.tag), orphans(r.tag)

@pytest.mark.slow
def test_skewed_collective_ends_in_seconds(slow_runs):
    """Rank 1 alone calls all_reduce_mean at after_epoch (of the size of the Recorder's, so gloo pairs it with rank
    0's and every later collective is off by one): both ranks then wait in the gradient all-reduce of the same step,
    after different numbers of distrib collectives. A watchdog ends the job within seconds (the collective timeout
    is 60 s) with a RanksDivergedError that says so"""
    r, secs = slow_runs['skew']
    report('skew: all_reduce_mean on rank 1 only', secs)
    s = summary(r)
    assert r.returncode == 1, s + r.stderr[-3000:]
    m = re.match(r"distrib.launch: rank (0|1) failed \(exit code 1\): RanksDivergedError: rank \1 waits in backward "
                 r"\(DDP's all-reduce of gradients\) \(epoch 1, training batch 0\), but rank (0|1) waits at the "
                 r"same point, but after (\d+) distrib collectives against this rank's (\d+) \(a collective ran on "
                 r"some ranks only", s)
    assert m and m[1] != m[2], s
    # rank 1 ran one more (how many before depends on the build: 6 and 7 on the CPU torch 2.13, 7 and 8 on CUDA builds)
    assert int(m[3]) - int(m[4]) == (1 if m[2] == '1' else -1), s
    assert secs < 15, secs
    assert not orphans(r.tag), orphans(r.tag)

@pytest.mark.slow
def test_barrier_against_a_broadcast_ends_in_seconds(slow_runs):
    """Rank 0 in a distrib barrier while rank 1 waits in broadcast_object: rank 0's barrier sees rank 1 wait in
    another collective and ends the job within seconds (the collective timeout is 60 s), naming both positions"""
    r, secs = slow_runs['barrier_bcast']
    report('barrier_bcast: a barrier against a broadcast', secs)
    s = summary(r)
    assert r.returncode == 1, s + r.stderr[-3000:]
    assert s.startswith("distrib.launch: rank 0 failed (exit code 1): RanksDivergedError: rank 0 waits in "
                        "distrib_barrier(), but rank 1 waits in the collective broadcast_object"), s
    assert secs < 15, secs
    assert not orphans(r.tag), orphans(r.tag)

@pytest.mark.slow
def test_crash_in_a_collective_shows_the_positions(slow_runs):
    """The skewed all_reduce_mean of another size than the Recorder's: gloo aborts a process (SIGABRT), which
    writes no record. The launcher's summary still gives what each rank last published, with the distrib collective
    each last entered: rank 1's extra one at after_epoch"""
    r, secs = slow_runs['skew_abort']
    report('skew_abort: gloo aborts a rank', secs)
    s = summary(r)
    assert r.returncode == 134, s + r.stderr[-3000:]
    assert re.match(r"distrib.launch: rank (0|1) failed \(exit code -6\): killed by signal 6 \(SIGABRT\)", s), s
    line = next((l for l in s.splitlines() if "the ranks' last positions" in l), '')
    assert re.search(r"rank 1 in .*, last entering distrib collective number \d+, in after_epoch \(epoch 0\), the "
                     r"collective all_reduce_sum", line), s
    assert secs < 10, secs
    assert not orphans(r.tag), orphans(r.tag)

HEALTHY = ()   # modes without a fault
ENDS_WELL = ('stall_report', 'stall_worker', 'phase_report')  # modes whose job ends well
SLOW = {'stall_report': dict(DISTRIB_STALL_REPORT='2.5'), 'stall_end': dict(DISTRIB_STALL_TIMEOUT='4'),
        'stall_worker': dict(DISTRIB_STALL_REPORT='2.5'), 'phase_report': dict(DISTRIB_STALL_REPORT='0.3'),
        'phase_timeout': {}}
def _line(text:str)->str:
    "'line N, in fault': where fault.py's line holding `text` shows in a stack"
    lines = (SCRIPTS/'fault.py').read_text().splitlines()
    return f"line {next(i for i, l in enumerate(lines, 1) if text in l)}, in fault"
STALL_LINE = _line('# STALL_LINE')  # rank 1's 5 s sleep
STUCK_LINE = _line("time.sleep(600)  # 'hang'")  # rank 1's 600 s sleep

@pytest.mark.slow
def test_stall_reported_with_its_stack(slow_runs):
    """Rank 1 sleeps 5 s in a callback while rank 0 waits in the gradient all-reduce: with a 2.5 s threshold
    (DISTRIB_STALL_REPORT; by default max(60 s, 20 steps)), rank 1's watchdog reports where it is, for how long, what
    rank 0 waits in, and both stacks (rank 1's at the line of its sleep); the job goes on and ends well. The same job
    has long but healthy phases, not reported (4 s each): rank0_first's function on rank 0, the first training step
    on rank 1, a declared long phase on rank 0 (as Learner.save writes a large state) before a barrier."""
    r, _ = slow_runs['stall_report']
    assert r.returncode == 0, r.stderr[-3000:]
    m = re.search(r"distrib: probable stall: rank 1 has been in before_batch \(epoch 0, training batch 3\) for (\d+) "
                  r"s, while rank 0 waits in backward \(DDP's all-reduce of gradients\) \(epoch 0, training batch 3\)",
                  r.stderr)
    assert m, r.stderr[-3000:]
    report('stall_report: rank 1 in a callback, reported', float(m.group(1)))
    assert 2 <= int(m.group(1)) <= 4, m.group(0)
    assert r.stderr.count('probable stall') == 1, r.stderr[-3000:]  # none for the long healthy phases
    assert r.stdout.count('the fault did not happen') == 2, r.stdout
    rest = r.stderr[m.end():]
    assert rest.index("Rank 1's main thread") < rest.index(STALL_LINE) < rest.index("Rank 0's main thread"), rest
    assert "time.sleep(5); return  # STALL_LINE" in rest, rest

@pytest.mark.slow
def test_stall_in_a_dataloader_worker_reported(slow_runs):
    """Rank 1's DataLoader worker sleeps 5 s reading an item (as a worker stuck on a lock or a network read) while
    rank 0 waits in the gradient all-reduce: with a 2.5 s threshold, rank 1 is reported as reading the next batch,
    with its main thread's stack in the DataLoader; the job goes on and ends well"""
    r, _ = slow_runs['stall_worker']
    assert r.returncode == 0, r.stderr[-3000:]
    m = re.search(r"distrib: probable stall: rank 1 has been in reading the next batch \(epoch 0, training batch \d+\) "
                  r"for (\d+) s, while rank 0 waits in backward \(DDP's all-reduce of gradients\)", r.stderr)
    assert m, r.stderr[-3000:]
    report('stall_worker: rank 1 in a DataLoader worker, reported', float(m.group(1)))
    assert 2 <= int(m.group(1)) <= 4, m.group(0)
    assert r.stderr.count('probable stall') == 1, r.stderr[-3000:]
    rest = r.stderr[m.end():]
    assert "Rank 1's main thread" in rest and 'dataloader.py' in rest.split("Rank 0's main thread")[0], rest

@pytest.mark.slow
def test_stall_timeout_ends_the_job(slow_runs):
    """With DISTRIB_STALL_TIMEOUT=4 (or distrib_ctx(stall_timeout=4)), rank 1 stuck in a callback ends the job after
    about 4 s, long before the collective's timeout (60 s): the launcher names rank 1, its position and its stack"""
    r, secs = slow_runs['stall_end']
    report('stall_end: rank 1 stuck, DISTRIB_STALL_TIMEOUT=4', secs)
    s = summary(r)
    assert r.returncode == 1, s + r.stderr[-3000:]
    assert re.match(rf"distrib.launch: rank 1 failed \(exit code 1\): did not arrive: it is alive and has been there "
                    rf"for \d s in {re.escape(B3)} \(reported by rank 1\)", s), s
    assert STUCK_LINE in r.stderr and "Rank 0's main thread" in r.stderr, r.stderr[-3000:]
    assert 4 <= secs < 4 + 10, secs
    assert not orphans(r.tag), orphans(r.tag)

PHASE_LINE = _line('# PHASE_LINE').replace('in fault', 'in download')  # rank 0's 7 s sleep in rank0_first's function
PHASE_STUCK = _line('# PHASE_STUCK').replace('in fault', 'in download')  # its 600 s sleep in long_phase(timeout=3)

@pytest.mark.slow
def test_long_phase_reported(slow_runs):
    """Rank 0 sleeps 7 s in rank0_first's function (a declared long phase, as a slow download) while rank 1 waits for
    it: with DISTRIB_STALL_REPORT=0.3, rank 0's watchdog reports the phase at 3 s (10 times the threshold) and again
    at 6 s (the duration doubled), naming the rank, the phase and how long, with its stack at the sleep; the phase
    is not ended, nothing else is reported, and the job ends well; rank 1, which waits with a group timeout of 2 s,
    prints nothing of torch's store client (no wait of it times out: `_Waiter`)"""
    r, _ = slow_runs['phase_report']
    assert r.returncode == 0, r.stderr[-3000:]
    found = re.findall(r"distrib: long phase: rank 0 has been in the declared long phase "
                       r"'run download \(rank0_first\)' "
                       r"for (\d+) s; ", r.stderr)
    assert len(found) == 2, r.stderr[-3000:]
    report('phase_report: rank 0 in rank0_first, reported', float(found[0]))
    assert 3 <= int(found[0]) <= 5 and 6 <= int(found[1]) <= 7, found
    assert r.stderr.count(PHASE_LINE) == 2 and r.stderr.count("Rank 0's main thread (innermost last)") == 2, r.stderr
    assert 'probable stall' not in r.stderr and 'rank 1 has been' not in r.stderr, r.stderr[-3000:]
    assert r.stdout.count('the fault did not happen') == 2, r.stdout
    # rank 1 waited 7 s, looking at rank 0 every 2 s (the group's timeout): nothing of torch's store client's polls
    assert 'waitForInput' not in r.stderr, r.stderr[-3000:]

@pytest.mark.slow
def test_long_phase_timeout_ends_the_job(slow_runs):
    """Rank 0 stuck in `long_phase('fetching the data set', timeout=3)` (a download on a dead connection) inside
    rank0_first's function: its watchdog ends the job after 3 s, and the launcher's first line names rank 0, the
    phase and its timeout (LongPhaseTimeoutError, rank 0's own failure), with rank 0's stack at the stuck line; rank
    1, which waited, ended because of rank 0"""
    r, secs = slow_runs['phase_timeout']
    report('phase_timeout: long_phase(timeout=3) stuck', secs)
    s = summary(r)
    assert r.returncode == 1, s + r.stderr[-3000:]
    assert re.match(r"distrib.launch: rank 0 failed \(exit code 1\): LongPhaseTimeoutError: rank 0 has been in the "
                    r"declared long phase 'fetching the data set' for [34] s, past its timeout: long_phase\('fetching "
                    r"the data set', timeout=3\) ends the job after 3 s", s), s
    # rank 1's own code, or -15 when the agent's SIGTERM overtook its exit (seen under load)
    assert re.search(r'then rank 1 ended \(exit code (1|-15)\): PeerFailedError: stopped because of rank 0', s), s
    assert PHASE_STUCK in r.stderr, r.stderr[-3000:]
    assert 3 <= secs < 3 + 10, secs
    assert not orphans(r.tag), orphans(r.tag)

EARLY = ('top', 'import', 'collective')  # early_exit.py's placements of rank 1's os._exit(0)
EARLY_AT_ONCE, EARLY_ROUNDS = 4, 3      # jobs at once (the load), rounds: 12 jobs, each placement 4 times
EARLY_HOW = {'top': 'before joining the process group (which can then never be complete)',
             'import': 'before joining the process group (which can then never be complete)',
             'collective': 'without leaving the process group'}

@pytest.fixture(scope='module')
def early_runs():
    """early_exit.py's jobs, EARLY_AT_ONCE at a time, the placements in turn: a list of (placement, CompletedProcess
    or the TimeoutExpired of a job that hung, seconds from the exit to the launcher's exit)"""
    jobs = [EARLY[i % len(EARLY)] for i in range(EARLY_AT_ONCE * EARLY_ROUNDS)]
    def run(place):
        env = dict(DISTRIB_LIVENESS_TIMEOUT=LIVENESS)
        try: r = launch(SCRIPTS/'early_exit.py', place, nproc=2, timeout=60, env=env)
        except subprocess.TimeoutExpired as e: return place, e, None
        m = re.search(r'FAULT_AT ([\d.]+)', r.stdout)
        return place, r, time.time() - float(m.group(1)) if m else None
    with ThreadPoolExecutor(EARLY_AT_ONCE) as ex: return list(ex.map(run, jobs))

@pytest.mark.slow
def test_early_exit_named_under_load(early_runs):
    """Rank 1 ends by os._exit(0) (no goodbye) on the script's first line, before `import distrib`; after it, before
    any distrib call; or right after the process group formed: torchrun counts code 0 as success and waits for rank 0,
    which waits for rank 1 in the group's set-up (inside torch, where only its watchdog can act) or in its first
    all-reduce. With 4 jobs at once (12 in all), none hangs: each ends within seconds of the exit, its launcher's first
    line naming rank 1, its exit code 0 and the group's state it left in the same words whoever noticed first (the
    launcher's agent published the exit), and no process is left"""
    hung = [place for place, r, _ in early_runs if isinstance(r, subprocess.TimeoutExpired)]
    assert not hung, f"{len(hung)} of {len(early_runs)} jobs hung: {hung}"
    for place, r, secs in early_runs:
        report(f'early exit at {place}', secs)
        s = summary(r)
        assert r.returncode == 1, (place, s + r.stderr[-3000:])
        assert s.startswith(f'distrib.launch: rank 1 failed: exited with code 0 {EARLY_HOW[place]}, without a word '
                            '(os._exit?), as its launcher saw (reported by rank 0)'), (place, s)
        assert re.search(r'then rank 0 ended \(exit code (1|-15)\): PeerFailedError: stopped because of rank 1',
                         s), (place, s)
        assert secs < 10, (place, secs)
        assert not orphans(r.tag), orphans(r.tag)

@pytest.mark.slow
def test_early_exit_under_plain_torchrun_named_at_the_timeout():
    """Under plain torchrun (no distrib worker, no agent's record) rank 1's os._exit(0) before `import distrib` leaves
    no trace: liveness starts in setup_distrib. Rank 0 waits in the process group's set-up for the group's timeout
    (here 4 s), then setup_distrib names rank 1 as the rank that never published a heartbeat, not only a store key"""
    tag = new_tag()
    env = dict(os.environ, PYTHONUNBUFFERED='1', DISTRIB_TEST_TAG=tag, EARLY_TIMEOUT='4')
    start = time.time()
    r = run_forked(['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2', SCRIPTS/'early_exit.py',
                    'top'], env, 90)
    report('early exit under plain torchrun, group timeout 4 s', time.time() - start, 'the launch')
    assert r.returncode == 1, r.stderr[-3000:]
    assert ("CollectiveTimeoutError: init_process_group timed out on rank 0 (called from setup_distrib" in r.stderr
            and "after 4 s in setting up the process group: rank 1 never published a heartbeat" in r.stderr), r.stderr
    assert not orphans(tag), orphans(tag)
