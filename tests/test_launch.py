"The launcher: exit codes and argument errors"
import os, re, sys, subprocess
from concurrent.futures import ThreadPoolExecutor
import pytest
from conftest import launch, ROOT, SCRIPTS

TORCHRUN_LOG = re.compile(r'^[IWE]\d{4} ', re.M)  # torchrun's log lines: "W1121 17:47:31.292000 24855 torch/..."

def test_failing_script_exit_code_verbose(tmp_path):
    """The failed rank's exit code is the launcher's, also when the other rank's script ends about when its watchdog
    would end it (2.5 s: the exit of neither waits for, nor races, its watchdog); with --verbose, torchrun's own log
    lines are printed too. No --nproc_per_node: 2 processes on a CPU machine, one thread each on 2 cores"""
    s = tmp_path/'fail.py'
    s.write_text('import os, sys, time\nsys.stdout.write(f"world {os.environ[\'WORLD_SIZE\']} threads '
                 '{os.environ[\'OMP_NUM_THREADS\']}\\n")\nif os.environ["RANK"] == "1": sys.exit(7)\n'
                 'time.sleep(2.5)\n')
    r = launch(s, nproc=None, launcher_args=('--verbose',))
    assert r.returncode == 7, r.stderr
    assert TORCHRUN_LOG.search(r.stderr), r.stderr
    assert 'distrib.launch: rank 1 failed (exit code 7)' in r.stderr and 'SIGABRT' not in r.stderr, r.stderr
    threads = max(1, (os.cpu_count() or 1) // 2)    # as distrib.launch sets OMP_NUM_THREADS
    assert r.stdout.count(f'world 2 threads {threads}\n') == 2, r.stdout

GLOO_LINE = re.compile(r'\[Gloo\] Rank \d+ is connected to')  # gloo's own print on torch 2.8, not the launcher's

def test_raising_script_summary_first_traceback_once(tmp_path):
    """Both ranks raise the same error: the summary comes first, then the traceback once, naming both ranks; the
    script's own prints come through; no torchrun log line without --verbose"""
    s = tmp_path/'raise.py'
    s.write_text('import os\nfrom distrib import distrib_barrier\nprint("up", os.environ["RANK"], flush=True)\n'
                 'distrib_barrier()\ndef f(): raise ValueError("bad data")\nf()\n')
    r = launch(s, nproc=2, launcher_args=('--monitor_interval', '2'))  # both raise before the agent looks
    assert r.returncode == 1
    out = [l for l in r.stdout.splitlines() if l and not GLOO_LINE.match(l)]
    assert sorted(out) == ['up 0', 'up 1'], r.stdout
    lines = r.stderr.splitlines()
    assert re.match(r'distrib.launch: rank (\d) failed \(exit code 1\): ValueError: bad data$', lines[0]), r.stderr
    # rank 1 raised too; whether it had exited when the agent stopped the others (SIGTERM, -15) is a race on a loaded
    # machine, the error it recorded is named either way
    assert re.match(r'distrib.launch:   then rank (\d) ended \(exit code (1|-15)\): ValueError: bad data$', lines[1]), \
        r.stderr
    assert lines[2] == 'distrib.launch: traceback of ranks 0, 1:' and lines[3].startswith('Traceback'), r.stderr
    assert r.stderr.count('Traceback') == 1 and lines[-1] == 'ValueError: bad data', r.stderr
    assert 'worker.py' not in r.stderr and not TORCHRUN_LOG.search(r.stderr), r.stderr

def _listening(port:int)->list:
    "Local addresses (hex, as /proc/net/tcp{,6} write them) listening on TCP port `port`"
    rows = [l.split() for f in ('/proc/net/tcp', '/proc/net/tcp6') for l in open(f).read().splitlines()[1:]]
    return [r[1].split(':')[0] for r in rows if r[3] == '0A' and int(r[1].split(':')[1], 16) == port]

def test_success_clean_local(tmp_path):
    """Three ranks on two cores: one warning line; the job's store listens on 127.0.0.1 only; no file is left in the
    working directory or the temporary directory"""
    s = tmp_path/'ok.py'
    s.write_text('import os, sys\nsys.path.insert(0, os.environ["TESTS"])\nfrom test_launch import _listening\n'
                 'print(f"world {os.environ[\'WORLD_SIZE\']} rank {os.environ[\'RANK\']} "\n'
                 '      f"store {_listening(int(os.environ[\'MASTER_PORT\']))}", flush=True)\n')
    cwd, tmp = tmp_path/'cwd', tmp_path/'tmp'
    cwd.mkdir(); tmp.mkdir()
    r = launch(s, nproc=3, cwd=cwd, env=dict(TMPDIR=str(tmp), TESTS=str(ROOT/'tests')))
    assert r.returncode == 0, r.stderr
    assert sorted(re.findall(r'world 3 rank \d', r.stdout)) == [f'world 3 rank {i}' for i in range(3)]
    assert set(re.findall(r'store (.*)', r.stdout)) == {"['0100007F']"}, r.stdout  # 127.0.0.1, nothing else
    if (os.cpu_count() or 1) < 3:
        n = os.cpu_count()
        assert r.stderr == f'distrib.launch: warning: 3 CPU processes on {n} cores: they share the cores, ' \
                           f'so each one runs slower than with --nproc_per_node {n} or fewer\n', r.stderr
    assert list(cwd.iterdir()) == [] and list(tmp.iterdir()) == []

def _main(*argv, timeout=60):
    return subprocess.run([sys.executable, '-m', 'distrib.launch', *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)

def _main_here(capsys, *argv):
    "distrib.launch's main in this process (what `python -m distrib.launch` runs): (exit code, stdout, stderr)"
    from distrib.launch.cli import main
    code = main(list(map(str, argv)))
    out = capsys.readouterr()
    return code, out.out, out.err

def test_help_and_bad_arguments(tmp_path, capsys):
    """--help exits 0; argument errors are one line in distrib's words, exit code 2, before any worker starts.
    `python -m distrib.launch` once; the other cases call its `main` here (each process would import torch again)"""
    r = _main('--help')
    assert r.returncode == 0 and r.stderr == '' and '--nproc_per_node N' in r.stdout and '--gpus' in r.stdout, r
    code, out, err = _main_here(capsys, '-h')
    assert code == 0 and err == '' and out.strip() == r.stdout.strip(), (code, out, err)
    s = tmp_path/'ok.py'; s.write_text('')
    for argv, words in ((['nope.py'], 'does not exist'), (['--nproc_per_node', '0', s], '--nproc_per_node 0: expected'),
                        (['--nproc_per_node', 'abc', s], '--nproc_per_node abc: expected'),
                        (['--epochs', '2', s], 'unknown option --epochs before the script'),
                        ([tmp_path], 'is a directory, not a script')):
        code, out, err = _main_here(capsys, *argv)
        assert code == 2 and len(err.splitlines()) == 1 and words in err, (argv, err)
    import socket
    with socket.socket() as busy:
        busy.bind(('127.0.0.1', 0)); busy.listen()
        port = busy.getsockname()[1]
        code, out, err = _main_here(capsys, '--master_port', port, s)
    assert code == 2, err
    assert err == f'distrib.launch: error: --master_port {port}: the port is in use (another job, or another ' \
                  f'program): leave --master_port out, and distrib.launch picks a free port\n', err

def _free_port()->int:
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]

@pytest.mark.slow  # two launchers as two nodes, about 12 s; CI runs it
def test_two_nodes_one_job():
    "Two launchers, --nnodes 2 on this machine (static rendezvous through --master_addr/--master_port): one world of 4"
    port = _free_port()
    node = lambda n: launch(SCRIPTS/'multinode.py', nproc=2, timeout=150, launcher_args=(
        '--nnodes', 2, '--node_rank', n, '--master_addr', '127.0.0.1', '--master_port', port))
    with ThreadPoolExecutor(2) as ex: runs = list(ex.map(node, (0, 1)))
    for n, r in enumerate(runs):
        assert r.returncode == 0, r.stdout + r.stderr
        waits = [l for l in r.stderr.splitlines() if 'waits up to' in l]  # once, what for and how long
        assert waits == [f'distrib.launch: node {n} waits up to 600 s for all 2 nodes of --nnodes 2 to join the '
                         f'rendezvous at 127.0.0.1:{port} (--rdzv_conf timeout=SECONDS to change)'], r.stderr
    found = {}
    for node, r in enumerate(runs):
        for rank, local, world, nrank, total in re.findall(r'rank (\d) local (\d) world (\d) node (\d) sum (\d+)',
                                                           r.stdout):
            assert (world, nrank, total) == ('4', str(node), '10')  # 1+2+3+4: the all_reduce spans both nodes
            found[int(rank)] = (node, int(local))
    assert found == {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)}, [(r.stdout, r.stderr) for r in runs]

@pytest.mark.slow  # a rendezvous that waits for a node that never comes, about 10 s; CI runs it
def test_node_alone_gives_up():
    "--nnodes 2 started on one node only: it says what it waits for, then gives up with one line after the timeout"
    r = _main('--nnodes', '2', '--master_port', _free_port(), '--rdzv_conf', 'timeout=3', SCRIPTS/'multinode.py')
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and 'node 0 waits up to 3 s for all 2 nodes' in lines[0], r.stderr
    assert lines[1].startswith('distrib.launch: error: the rendezvous did not complete: DistStoreError: '), r.stderr

def test_restarts_logs_threads(tmp_path):
    """--max_restarts and --log_dir/--tee pass through to torchrun: the failed first attempt is restarted, each rank
    of each attempt has its log files; a preset OMP_NUM_THREADS is kept"""
    logs = tmp_path/'logs'
    r = launch(SCRIPTS/'restart.py', nproc=2, launcher_args=('--max_restarts', '1', '--log_dir', logs, '--tee', '3'),
               env=dict(OMP_NUM_THREADS='3'))
    assert r.returncode == 0, r.stdout + r.stderr
    for attempt in (0, 1):
        for rank in (0, 1):
            f, = logs.glob(f'*/attempt_{attempt}/{rank}/stdout.log')
            assert f.read_text().strip() == f'attempt {attempt} rank {rank} threads 3', f.read_text()
