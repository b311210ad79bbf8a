"""Real clusters: on a one-node Slurm cluster started by the `slurm` fixture (tests/cluster.py) and with Open MPI,
`srun`, `sbatch` and `mpirun` start examples/train_digits.py on 2 processes that find each other with no variable
set by hand, and report the numbers of the torchrun run; `python -m distrib.env --check` under each says what it
detected; a preempted batch job is requeued from rank 0 and runs again. Several checks per job: they are slow,
about two minutes (behind `-m slow`, which CI runs)."""
import re, shlex, sys, time
import pytest
from pathlib import Path
from conftest import ROOT, SCRIPTS, digits_numbers
from distrib.runtime.clusters import job_port

pytestmark = pytest.mark.slow

def _env(base:dict)->dict:
    "`base` with this interpreter's directory first on PATH (`python` in the job scripts) and one thread per process"
    return dict(base, PATH=f"{Path(sys.executable).parent}:{base.get('PATH', '')}", OMP_NUM_THREADS='1',
                PYTHONUNBUFFERED='1')

def _sbatch(slurm, *args, env:dict)->str:
    "Submit a batch job to `slurm` with `args` (options, script, its arguments); its job id"
    return slurm.run('sbatch', '--parsable', *args, env=env).stdout.strip()

def _env_lines(out:str)->list:
    "The fields of each `distrib.env:` line in `out`, as dicts, sorted by rank"
    lines = [l for l in out.splitlines() if l.startswith('distrib.env:')]
    return sorted((dict(f.split('=', 1) for f in shlex.split(l)[1:]) for l in lines), key=lambda d: int(d['rank']))

def _same_numbers(out:str, reference):
    "The job's (world size, accuracy, loss) are the torchrun run's: same accuracy, loss within its printed precision"
    r, _ = reference
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    (ws, acc, loss), (ws0, acc0, loss0) = digits_numbers(out), digits_numbers(r.stdout)
    assert ws == ws0 == 2 and acc == acc0 and abs(loss - loss0) <= 1e-4, (out[-2000:], r.stdout[-500:])

def test_srun(slurm, digits_torchrun, tmp_path):
    "srun -n 2: each task is a rank (Slurm's variables), rank 0 on the node list's first host, a port from the job id"
    env = _env(slurm.env)
    slurm.run('srun', '-n', '2', '-o', tmp_path/'env-%t', 'python', '-m', 'distrib.env', '--check', env=env)
    envs = _env_lines((tmp_path/'env-0').read_text() + (tmp_path/'env-1').read_text())
    assert [e['rank'] for e in envs] == ['0', '1'], envs
    for e in envs:
        assert (e['env'], e['world_size'], e['local_world_size']) == ('slurm', '2', '2'), e
        assert e['master'] == f"{slurm.host}:{job_port(e['job_id'], 0)}", e
        assert e['check'].startswith('ok: all_reduce=2 '), e
    r = slurm.run('srun', '-n', '2', 'python', 'examples/train_digits.py', '--data', digits_torchrun[1], cwd=ROOT,
                  env=env, timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    _same_numbers(r.stdout, digits_torchrun)

def _wait_lines(path:Path, word:str, n:int, timeout:float=120)->str:
    "The text of `path` once it has `n` lines starting with `word`; AssertionError with the text past `timeout` s"
    end = time.monotonic() + timeout
    while True:
        text = path.read_text() if path.exists() else ''
        if sum(l.startswith(word) for l in text.splitlines()) >= n: return text
        assert time.monotonic() < end, f"fewer than {n} {word} lines after {timeout} s:\n{text[-3000:]}"
        time.sleep(0.2)

def test_sbatch(slurm, digits_torchrun, tmp_path):
    """Batch jobs: a training preempted by SIGUSR1 and requeued by `Checkpoint(auto_requeue=True)`, then
    examples/slurm/train.sbatch (one task per process) and train_torchrun.sbatch (one torchrun per node) as written,
    which run while the requeued job waits to start again. `scancel --signal=USR1` (what `#SBATCH --signal=USR1@60`
    sends) reaches every rank of the step; they stop at the same step with a checkpoint, rank 0 requeues the job;
    its second run (restart_count 1, the same job id) resumes from the checkpoint and ends with the weights and
    recorded values of an uninterrupted fit, exactly, and the job COMPLETED."""
    out = tmp_path/'requeue.out'
    requeued = _sbatch(slurm, '-n', '2', '--requeue', '--open-mode=append', f'--output={out}', '--wrap',
                       f'srun python {SCRIPTS/"slurm_requeue.py"} {tmp_path}', env=_env(slurm.env))
    _wait_lines(out, 'READY', 2)  # in the middle of training, every rank's handler installed
    start = time.monotonic()
    slurm.run('scancel', '--signal=USR1', requeued)
    shape = ['--nodes=1', '--gpus-per-node=0', '--time=10', f'--chdir={ROOT}']  # this one node, no GPU
    jobs = {'train.sbatch': ['--ntasks-per-node=2', '--cpus-per-task=1'],
            'train_torchrun.sbatch': ['--cpus-per-task=2']}
    ck = {'train.sbatch': ['--checkpoint', tmp_path/'digits_ck']}   # not in the repository's checkpoints/
    ids = {name: _sbatch(slurm, *shape, *opts, f'--output={tmp_path}/{name}.out', ROOT/'examples'/'slurm'/name,
                         '--data', digits_torchrun[1], *ck.get(name, []), env=_env(slurm.env))
           for name, opts in jobs.items()}
    for name, job_id in ids.items():
        state = slurm.wait_job(job_id, timeout=300)
        text = (tmp_path/f'{name}.out').read_text()
        assert state == ('COMPLETED', '0:0'), (name, state, text[-3000:])
        _same_numbers(text, digits_torchrun)
    assert slurm.wait_job(requeued, timeout=180) == ('COMPLETED', '0:0'), out.read_text()[-3000:]
    print(f"signal to the requeued job's end: {time.monotonic() - start:.1f} s")
    text = out.read_text()
    assert f'requeueing Slurm job {requeued}; exiting with code 138' in text, text
    for rank in (0, 1): assert f'RESTARTED rank {rank} restart_count 1' in text, text
    final = re.findall(r'^FINAL max_diff=(\S+) values_equal=(\S+) resumed_from=(\S+)', text, re.M)
    assert len(final) == 1 and final[0][:2] == ('0.0', 'True') and final[0][2].startswith('step-'), text
    assert slurm.job(requeued)['Restarts'] == '1', text
    assert re.search(r'^Resumed from .*/ck/step-\d+\.pth \(epoch 1, batch [1-9]\d* of 32, written by 2 processes\), '
                     r'now on 2 processes, global batch \d+ kept$', text, re.M), text

def test_mpirun(slurm, mpirun_env, digits_torchrun, tmp_path):
    """mpirun -n 2: the digits example (Open MPI's variables, rank 0 on this host); then mpirun inside an sbatch job,
    where every rank also carries the batch shell's SLURM_PROCID=0: Open MPI's variables win"""
    r = slurm.run('mpirun', '-n', '2', '--allow-run-as-root', 'python', 'examples/train_digits.py', '--data',
                  digits_torchrun[1], cwd=ROOT, env=_env(mpirun_env), timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    _same_numbers(r.stdout, digits_torchrun)
    out = tmp_path/'in-sbatch.out'
    ompi = {k: v for k, v in mpirun_env.items() if k.startswith('OMPI_')}
    job_id = _sbatch(slurm, '-n', '2', f'--output={out}', '--wrap',
                     'mpirun -n 2 --allow-run-as-root python -m distrib.env --check', env=_env(slurm.env | ompi))
    assert slurm.wait_job(job_id, timeout=120) == ('COMPLETED', '0:0'), out.read_text()[-3000:]
    envs = _env_lines(out.read_text())
    assert [(e['rank'], e['env'], e['world_size'], e['job_id']) for e in envs] == [
        ('0', 'openmpi', '2', job_id), ('1', 'openmpi', '2', job_id)], out.read_text()
    assert all(e['master'].startswith('127.0.0.1:') and e['check'].startswith('ok: all_reduce=2 ') for e in envs), envs
