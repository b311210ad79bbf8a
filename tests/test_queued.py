"""Collectives that return before they are done (NCCL's), followed by the watchdog (`mark_queued`): on CPU, gloo's
`async_op=True` stands for them (tests/scripts/queued.py). A rank whose queued collective waits counts as waiting in
it: a deadlock against a barrier is found in seconds, a stalled peer is reported naming the queued collective, and
one that outlives the group's timeout ends the job naming the rank that never came (issue 34's item 7)."""
import re, time
import pytest
from conftest import launch, orphans, report, SCRIPTS

def run(mode:str, **env):
    "Launch queued.py MODE on 2 ranks: (CompletedProcess, seconds from the fault to the launcher's exit)"
    r = launch(SCRIPTS/'queued.py', mode, nproc=2, timeout=150, env=env)
    end = time.time()
    m = re.search(r'FAULT_AT ([\d.]+)', r.stdout)
    assert m, r.stdout + r.stderr[-3000:]
    assert not orphans(r.tag), orphans(r.tag)
    return r, end - float(m.group(1))

def summary(r): return '\n'.join(l for l in r.stderr.splitlines() if l.startswith('distrib.launch:'))

@pytest.mark.slow
def test_queued_collective_against_a_barrier_is_a_deadlock():
    "Rank 0's all_reduce is queued (its host goes on), rank 1 waits in a barrier: found in seconds, naming both"
    r, secs = run('deadlock')
    report('queued all_reduce against a barrier', secs)
    s = summary(r)
    assert r.returncode == 1, s + r.stderr[-3000:]
    assert s.startswith("distrib.launch: rank 1 failed (exit code 1): RanksDivergedError: rank 1 waits in "
                        "distrib_barrier(), but rank 0 waits in the collective all_reduce, queued and not done (its "
                        "main thread has gone on to its script"), s
    assert secs < 15, secs

@pytest.mark.slow
def test_stall_of_a_peer_of_a_queued_collective_is_reported():
    "Rank 1 sleeps while rank 0's all_reduce is queued: rank 1 reports itself, naming the queued collective"
    r, _ = run('stall', DISTRIB_STALL_REPORT='2')
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"distrib: probable stall: rank 1 has been in its script, outside any Learner event or distrib "
                     r"operation for \d+ s, while rank 0 waits in the collective all_reduce, queued and not done",
                     r.stderr), r.stderr[-3000:]

@pytest.mark.slow
def test_queued_collective_past_the_timeout_names_the_missing_rank():
    "The group's timeout is 5 s, the queued all_reduce's own 120 s: distrib's watchdog speaks first, naming rank 1"
    r, secs = run('timeout')
    report('queued all_reduce past a 5 s timeout', secs)
    s = summary(r)
    assert r.returncode == 1, s + r.stderr[-3000:]
    assert re.match(r"distrib.launch: rank 1 failed( \(exit code -?\d+\))?: did not arrive: it is alive and has been "
                    r"there for at least \d+ s in its script, outside any Learner event or distrib operation "
                    r"\(reported by rank 0\)", s), s
    assert 'CollectiveTimeoutError: the collective all_reduce timed out on rank 0 after' in r.stderr, r.stderr[-3000:]
    assert secs < 5 + 10, secs
