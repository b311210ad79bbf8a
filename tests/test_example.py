"The main job: the digits example over 2 processes"
import re
from conftest import digits_numbers

def test_digits_two_processes(digits_torchrun):
    r, data = digits_torchrun
    assert r.returncode == 0, r.stdout + r.stderr
    world_size, acc, _ = digits_numbers(r.stdout)
    assert world_size == 2
    assert acc >= 0.95
    assert 'world size 2: lr 0.01, 12 epochs, global batch 64:' in r.stdout   # what the run used, said once
    assert r.stdout.count('world size') == 1                        # printed under rank_distrib() == 0: once
    assert r.stdout.count('train_loss') == 1                        # the table header, once: rank 0 only
    assert len(re.findall(r'^\s+11\s', r.stdout, re.M)) == 1        # the last epoch's row, once
    assert data.exists()
