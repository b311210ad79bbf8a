"""Shared helpers: run a script under `python -m distrib.launch` with a timeout, so a hang fails the test; every
launched process carries a tag in its environment (`DISTRIB_TEST_TAG`), so that `orphans` finds any left behind"""
import os, re, time, uuid, subprocess, sys
from pathlib import Path
import pytest, torch

# One thread for the computations pytest's own processes run: the workers of `pytest -n` share the cores with the
# jobs the tests launch, which the launcher gives one thread each
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent/'scripts'

def new_tag()->str:
    "A fresh value for `DISTRIB_TEST_TAG`"
    return uuid.uuid4().hex

def tagged(tag:str)->list:
    "Pids of the live processes (not zombies) whose environment has DISTRIB_TEST_TAG=`tag`"
    out, needle = [], f'DISTRIB_TEST_TAG={tag}'.encode()
    for d in os.listdir('/proc'):
        if not d.isdigit(): continue
        try:
            if needle not in open(f'/proc/{d}/environ', 'rb').read().split(b'\0'): continue
            if open(f'/proc/{d}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z': out.append(int(d))
        except OSError: pass
    return out

def orphans(tag:str, wait:float=5.)->list:
    "The processes of tag `tag` still alive after up to `wait` seconds (none once a job ended completely)"
    end = time.monotonic() + wait
    while (left := tagged(tag)) and time.monotonic() < end: time.sleep(0.1)
    return left

def launch(script, *args, nproc=2, launcher_args=(), timeout=120, cwd=None, env=None):
    """Run `script` with `nproc` processes under distrib.launch; returns the CompletedProcess (text output), with
    the processes' tag as `.tag`"""
    tag = new_tag()
    e = dict(os.environ, PYTHONUNBUFFERED='1', DISTRIB_TEST_TAG=tag, **(env or {}))
    cmd = [sys.executable, '-m', 'distrib.launch', '--nproc_per_node', str(nproc), *launcher_args, str(script), *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd or ROOT, env=e)
    r.tag = tag
    return r

@pytest.fixture
def run_launch(): return launch

def report(fault:str, secs:float, since:str='the fault'):
    "Print how long `fault` took to end (seen with `pytest -s`)"
    print(f"\nFAULT-TIME {fault}: ended {secs:.1f} s after {since}")

# The files whose jobs take longest, first: `pytest -n 2 --dist loadfile` hands files to its two workers in this
# order, so the long ones do not start last and leave one worker idle at the end
SLOW_FIRST = ['test_faults', 'test_fsdp', 'test_clusters', 'test_checkpoint', 'test_launcher_signals', 'test_disagree',
              'test_distributed', 'test_launch']

def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(Path(item.fspath).stem, len(SLOW_FIRST)))  # stable: order within a file kept

def launch_ok(script, nproc=2, timeout=300)->str:
    "Run `script` under distrib.launch, assert it succeeded; its stdout (one job serving several tests)"
    r = launch(script, nproc=nproc, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr[-5000:]
    return r.stdout

def checked(out:str, name:str)->bool:
    "True when the job's output `out` has the line 'CHECK <name> OK'"
    return re.search(rf'^CHECK {name} OK', out, re.M) is not None

DIGITS = re.compile(r'^world size (\d+): .*?valid accuracy ([\d.]+), valid loss ([\d.]+)', re.M)

def digits_numbers(out:str)->tuple:
    "(world size, accuracy, validation loss) from the one result line examples/train_digits.py prints (on rank 0)"
    found = DIGITS.findall(out)
    assert len(found) == 1, f"expected one result line, found {len(found)}:\n{out[-3000:]}"
    ws, acc, loss = found[0]
    return int(ws), float(acc), float(loss)

@pytest.fixture(scope='session')
def digits_torchrun(tmp_path_factory):
    "The digits example under distrib.launch (torchrun) on 2 processes, once: (CompletedProcess, its data cache)"
    data = tmp_path_factory.mktemp('digits')/'digits.pt'
    r = launch(ROOT/'examples'/'train_digits.py', '--data', data, nproc=2, timeout=180, env={'OMP_NUM_THREADS': '1'})
    return r, data  # one thread per process, as the cluster tests run it: the same arithmetic on any machine

@pytest.fixture(scope='session')
def slurm(tmp_path_factory):
    """A running one-node Slurm cluster (tests/cluster.py), its packages installed when missing; a test using it fails
    with the reason when the cluster cannot be installed or started (no skip)"""
    from cluster import ClusterError, SlurmCluster, ensure_packages
    try:
        ensure_packages()
        c = SlurmCluster(tmp_path_factory.mktemp('slurm'))
    except ClusterError as e: pytest.fail(str(e), pytrace=False)
    yield c
    c.stop()

@pytest.fixture(scope='session')
def mpirun_env():
    "The environment for Open MPI's mpirun as root (tests/cluster.py), its package installed when missing"
    from cluster import ClusterError, ensure_packages, mpi_env
    try: ensure_packages()
    except ClusterError as e: pytest.fail(str(e), pytrace=False)
    return mpi_env()
