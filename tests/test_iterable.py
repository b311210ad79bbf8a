"Iterable data under distrib_ctx on 2 processes and in one; DataLoaders that cannot be sharded are named"
from conftest import checked, run_alone, SCRIPTS

CHECKS = ['iterable_equal_steps', 'iterable_like_one_process', 'iterable_valid_exact', 'unshardable_loaders_named']

def test_iterable_two_processes(together):
    out = together('iterable')
    for name in CHECKS: assert out.count(f'CHECK {name} OK') == 2, (name, out)

def test_iterable_one_process():
    r = run_alone(SCRIPTS/'iterable.py', timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in CHECKS: assert checked(r.stdout, name), (name, r.stdout)
