"""What each waiting rank costs the job's store does not grow with the number of ranks: measured from outside the job
(the kernel's byte counts of the store's connections, read with iproute2's `ss` by tests/scripts/store_traffic.py)
while W-1 ranks wait for rank 0, in `rank0_first` and in a collective, at W = 4 and W = 16 (issue 30)."""
import re, shutil
import pytest
from conftest import launch, orphans, SCRIPTS

def traffic(nproc:int)->dict:
    "{what: bytes per second per waiting rank} of a job of `nproc` processes"
    r = launch(SCRIPTS/'store_traffic.py', 8, nproc=nproc, timeout=240, env={'OMP_NUM_THREADS': '1'})
    assert r.returncode == 0, r.stderr[-3000:]
    found = {m[0]: (float(m[2]), int(m[3])) for m in
             re.findall(r'^TRAFFIC (\S+) (\d+) ([\d.]+) \(over (\d+) waiting ranks', r.stdout, re.M)}
    assert set(found) == {'rank0_first', 'collective'}, r.stdout + r.stderr[-3000:]
    assert all(n == nproc - 1 for _, n in found.values()), found  # every waiting rank's connections were seen
    assert not orphans(r.tag), orphans(r.tag)
    return {k: b for k, (b, _) in found.items()}

@pytest.mark.slow
def test_bytes_per_waiting_rank_do_not_grow_with_the_world():
    "W = 16 costs the store at most 1.15 times what W = 4 costs, per waiting rank, in both waits"
    if shutil.which('ss') is None: pytest.fail("iproute2's `ss` is needed (apt-get install -y iproute2)")
    small, big = traffic(4), traffic(16)
    print(f"\nSTORE-TRAFFIC bytes/s per waiting rank: W=4 {small}, W=16 {big}")
    for what in small: assert big[what] <= 1.15 * small[what], (what, small, big)
