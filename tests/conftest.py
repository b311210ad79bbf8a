"""Shared helpers: run a script under `python -m distrib.launch` with a timeout, so a hang fails the test; every
launched process carries a tag in its environment (`DISTRIB_TEST_TAG`), so that `orphans` finds any left behind"""
import compileall, multiprocessing, os, re, runpy, subprocess, sys, tempfile, time, uuid
from pathlib import Path
import pytest, torch
from filelock import FileLock

# One thread for the computations pytest's own processes run: the workers of `pytest -n` share the cores with the
# jobs the tests launch, which the launcher gives one thread each
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
SCRIPTS = TESTS/'scripts'

def pytest_configure(config):
    """Compile distrib's modules to bytecode once, before the tests: every process they launch imports distrib, and
    where PYTHONDONTWRITEBYTECODE is set no import writes the bytecode, so each would compile it again (0.2 s)"""
    if not os.environ.get('PYTEST_XDIST_WORKER'): compileall.compile_dir(ROOT/'distrib', quiet=1)

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

def _forkserver():
    """The multiprocessing context whose processes are forked from one server process per pytest process, which
    imports torch and distrib (with distrib.launch) once (started on first use)"""
    ctx = multiprocessing.get_context('forkserver')
    ctx.set_forkserver_preload(['distrib.launch'])
    return ctx

def _read(path)->str: return Path(path).read_text(errors='replace') if os.path.exists(path) else ''

def run_forked(argv:list, env:dict, timeout:float, cwd=None)->subprocess.CompletedProcess:
    """`python *argv` (`argv`: a script and its arguments, or `-m distrib.launch` and its) with environment `env`, in a
    process forked from the forkserver (`_forkserver`, tests/forked.py), which saves it importing torch: a
    CompletedProcess with text output. Raises `subprocess.TimeoutExpired` after killing it past `timeout` s."""
    argv, cmd = list(map(str, argv)), [sys.executable, *map(str, argv)]
    with tempfile.TemporaryDirectory() as d:
        out, err = f'{d}/stdout', f'{d}/stderr'
        job = dict(ARGV=argv, ENV=dict(env), CWD=str(cwd or ROOT), OUT=out, ERR=err)
        p = _forkserver().Process(target=runpy.run_path, args=(str(TESTS/'forked.py'),),
                                  kwargs=dict(init_globals=job, run_name='forked'))
        p.start()
        p.join(timeout)
        if p.exitcode is None:
            p.kill()
            p.join()
            raise subprocess.TimeoutExpired(cmd, timeout, _read(out), _read(err))
        return subprocess.CompletedProcess(cmd, p.exitcode, _read(out), _read(err))

def run_alone(script, env_update:dict|None=None, timeout:float=60)->subprocess.CompletedProcess:
    """Run `script` as one process (forked, `run_forked`) in this environment less every launcher's variables
    (torch's, Slurm's, Open MPI's, PMI's), with `env_update` on top"""
    drop = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT', 'TORCHELASTIC_RUN_ID')
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(('SLURM_', 'OMPI_', 'PMI_'))}
    return run_forked([script], env | (env_update or {}), timeout)

def launch(script, *args, nproc=2, launcher_args=(), timeout=120, cwd=None, env=None, fork=True):
    """Run `script` with `nproc` processes (None: the launcher's default) under distrib.launch; returns the
    CompletedProcess (text output), with the processes' tag as `.tag`; raises `subprocess.TimeoutExpired` after
    killing the launcher past `timeout` s. The launcher is forked from the forkserver (`run_forked`), which saves it
    importing torch; `fork=False` starts it as `python -m distrib.launch`. Its workers are new interpreters."""
    tag = new_tag()
    e = dict(os.environ, PYTHONUNBUFFERED='1', DISTRIB_TEST_TAG=tag, **(env or {}))
    argv = ['-m', 'distrib.launch', *(['--nproc_per_node', nproc] if nproc else []), *launcher_args, script, *args]
    if fork: r = run_forked(argv, e, timeout, cwd)
    else: r = subprocess.run([sys.executable, *map(str, argv)], capture_output=True, text=True, timeout=timeout,
                             cwd=cwd or ROOT, env=e)
    r.tag = tag
    return r

def report(fault:str, secs:float, since:str='the fault'):
    "Print how long `fault` took to end (seen with `pytest -s`)"
    print(f"\nFAULT-TIME {fault}: ended {secs:.1f} s after {since}")

# The files whose jobs take longest, first: `pytest -n 2 --dist loadfile` hands files to its two workers in this
# order, so the long ones do not start last and leave one worker idle at the end
SLOW_FIRST = ['test_reshard', 'test_faults', 'test_fsdp', 'test_clusters', 'test_checkpoint', 'test_launcher_signals',
              'test_disagree', 'test_distributed', 'test_launch']

def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(Path(item.fspath).stem, len(SLOW_FIRST)))  # stable: order within a file kept

def checked(out:str, name:str)->bool:
    "True when the job's output `out` has the line 'CHECK <name> OK'"
    return re.search(rf'^CHECK {name} OK', out, re.M) is not None

# The scripts the shared jobs run one after another (tests/scripts/together.py), in the processes of one job per
# world size: each process imports torch and builds DDP once for all. On 2 processes: one_world first (it needs a
# process without a group yet), the compiling one last (it changes dynamo's settings); fsdp there leaves the
# checkpoint its run on 3 processes loads.
TOGETHER = {2: ['one_world', 'ctx_restore', 'collectives', 'exactness', 'accumulate', 'ddp_options', 'iterable',
                'callbacks', 'trackers', 'items', 'fsdp', 'compile'],
            3: ['exactness', 'items', 'fsdp']}

def _shared_dir(tmp_path_factory)->Path:
    "The temporary directory of this pytest run, shared by its xdist workers (each has its own below it)"
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get('PYTEST_XDIST_WORKER') else base

def _shared_job(tmp_path_factory, world:int):
    """Run the scripts of TOGETHER[world] in one job of `world` processes unless this run did already (a file lock
    in the run's shared directory: one xdist worker runs it, the others wait for it); its output directory"""
    base = _shared_dir(tmp_path_factory)
    d = base/'together'
    with FileLock(str(base/f'together.w{world}.lock')):
        said = d/f'launcher.w{world}.txt'
        if not said.exists():
            try:
                r = launch(SCRIPTS/'together.py', d, *[SCRIPTS/f'{s}.py' for s in TOGETHER[world]], nproc=world,
                           timeout=900)
                text = f'exit code {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-8000:]}'
            except subprocess.TimeoutExpired as e: text = f'{e}\n{e.stdout}\n{e.stderr}'
            d.mkdir(exist_ok=True)
            said.write_text(text)
    return d

def _outputs(d:Path, world:int):
    """A function `name -> str`: the output of script `name` in the shared job of `world` processes, rank after
    rank; it fails the test with that output and the launcher's when the script failed or did not run"""
    def output(name:str)->str:
        text = ''.join(_read(d/f'{name}.w{world}.{rank}.txt') for rank in range(world))
        if not text or 'SCRIPT FAILED' in text:
            pytest.fail(f"{name}.py failed in the shared job of {world} processes:\n{text[-8000:]}\n"
                        f"The launcher:\n{_read(d/f'launcher.w{world}.txt')}")
        return text
    output.dir = d
    return output

@pytest.fixture(scope='session')
def together(tmp_path_factory):
    """The scripts of TOGETHER[2], run once for all xdist workers in one job of 2 processes: `name -> output`
    (`_outputs`); `.dir` is the job's directory (script `name` had `dir/name` as its argument)"""
    return _outputs(_shared_job(tmp_path_factory, 2), 2)

@pytest.fixture(scope='session')
def together3(together, tmp_path_factory):
    "As `together`, for TOGETHER[3] on 3 processes, after the job on 2 (fsdp.py on 3 loads what it saved)"
    return _outputs(_shared_job(tmp_path_factory, 3), 3)

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
    r = launch(ROOT/'examples'/'train_digits.py', '--data', data, nproc=2, timeout=180, env={'OMP_NUM_THREADS': '1'},
               fork=False)  # the README's command as it is: `python -m distrib.launch`
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
