"""The straggler check (issue 30): in a job of 4 ranks where rank 3 does 3 times the others' work per step, rank 0's
stderr names rank 3 once, with the ratio to the median rank; a healthy job of the same shape names no rank. Both
prove that a round of the check was decided on every rank (the `ROUNDS` lines), so that silence means something."""
import re
import pytest
from conftest import launch, orphans, SCRIPTS

ENV = {'DISTRIB_STRAGGLER_STEPS': '40', 'OMP_NUM_THREADS': '1'}

def run(steps:int, *args):
    "Launch tests/scripts/straggler.py on 4 ranks; checks it ended well, each rank having decided in a round"
    r = launch(SCRIPTS/'straggler.py', steps, *args, nproc=4, timeout=240, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    rounds = {int(a): int(b) for a, b in re.findall(r'^ROUNDS (\d+) (\d+)$', r.stdout, re.M)}
    assert sorted(rounds) == [0, 1, 2, 3] and min(rounds.values()) >= 1, (rounds, r.stderr[-3000:])
    assert not orphans(r.tag), orphans(r.tag)
    return r

@pytest.mark.slow
def test_straggler_named_once():
    "Rank 3 sleeps 60 ms per step where the others sleep 20 ms: one line names it, its host and local rank"
    r = run(400, 'slow')
    lines = [l for l in r.stderr.splitlines() if 'distrib: straggler:' in l]
    assert len(lines) == 1, r.stderr[-3000:]
    m = re.match(r"distrib: straggler: rank 3 \(host \S+, local rank 3\) spends ([\d.]+)× the median rank's time "
                 r"per step outside collectives over the last 40 steps \(", lines[0])
    assert m and 2 <= float(m[1]) <= 5, lines[0]
    print(f"\nSTRAGGLER-LINE {lines[0]}")

@pytest.mark.slow
def test_healthy_job_names_no_straggler():
    "Every rank sleeps 20 ms per step: no line, though every rank took part in a round of the check"
    r = run(600)
    assert 'straggler:' not in r.stderr, r.stderr[-3000:]
