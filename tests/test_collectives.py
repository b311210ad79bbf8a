"The collectives for callbacks, over two gloo processes (tests/scripts/collectives.py, in the shared job)"
import re

def test_collectives_two_processes(together):
    out = together('collectives')
    assert sorted(re.findall(r'rank \d OK', out)) == ['rank 0 OK', 'rank 1 OK'], out
