"Iterable data under distrib_ctx on 2 processes and in one; DataLoaders that cannot be sharded are named"
import os
from conftest import checked, run_forked, SCRIPTS

CHECKS = ['iterable_equal_steps', 'iterable_like_one_process', 'iterable_valid_exact', 'unshardable_loaders_named']

def test_iterable_two_processes(together):
    out = together('iterable')
    for name in CHECKS: assert out.count(f'CHECK {name} OK') == 2, (name, out)

def test_iterable_one_process():
    env = {k: v for k, v in os.environ.items() if k not in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK')}
    r = run_forked([SCRIPTS/'iterable.py'], env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in CHECKS: assert checked(r.stdout, name), (name, r.stdout)
