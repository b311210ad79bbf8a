"The collectives for callbacks, over two gloo processes"
import re
from conftest import launch, SCRIPTS

def test_collectives_two_processes():
    r = launch(SCRIPTS/'collectives.py', nproc=2)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(re.findall(r'rank \d OK', r.stdout)) == ['rank 0 OK', 'rank 1 OK']
