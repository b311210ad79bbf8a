"The main job: the digits example over 2 processes"
import re
from conftest import launch, ROOT

def test_digits_two_processes(tmp_path):
    r = launch(ROOT/'examples'/'train_digits.py', '--data', tmp_path/'digits.pt', '--scale', 'lr', nproc=2,
               timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r'world size (\d+): .*valid accuracy ([\d.]+)', r.stdout)
    assert m, r.stdout
    assert int(m.group(1)) == 2 and 'lr 0.02, 12 epochs, global batch 64' in m.group(0)  # --scale lr: 2 x 0.01
    assert r.stdout.count('world size') == 1                        # printed under rank_distrib() == 0: once
    assert float(m.group(2)) >= 0.95
    assert r.stdout.count('train_loss') == 1                        # the table header, once: rank 0 only
    assert len(re.findall(r'^\s+11\s', r.stdout, re.M)) == 1        # the last epoch's row, once
    assert (tmp_path/'digits.pt').exists()
