"The launcher: exit codes and argument errors"
import re, sys, subprocess
from conftest import launch, ROOT, SCRIPTS

def test_failing_script_exit_code(tmp_path):
    s = tmp_path/'fail.py'
    s.write_text('import os, sys\nsys.exit(7 if os.environ["RANK"] == "1" else 0)\n')
    r = launch(s, nproc=2)
    assert r.returncode == 7, r.stderr

def test_raising_script_names_rank(tmp_path):
    s = tmp_path/'raise.py'
    s.write_text('import os\nif os.environ["RANK"] == "1": raise ValueError("bad data on purpose")\n')
    r = launch(s, nproc=2)
    assert r.returncode == 1
    assert 'bad data on purpose' in r.stderr and 'rank' in r.stderr

def test_success_exit_code(tmp_path):
    s = tmp_path/'ok.py'
    s.write_text('import os, sys\nsys.stdout.write(f"world {os.environ[\'WORLD_SIZE\']} rank {os.environ[\'RANK\']}\\n")\n')
    r = launch(s, nproc=3)
    assert r.returncode == 0, r.stderr
    assert sorted(re.findall(r'world 3 rank \d', r.stdout)) == [f'world 3 rank {i}' for i in range(3)]

def test_default_nproc_is_two_on_cpu(tmp_path):
    s = tmp_path/'ok.py'
    s.write_text('import os, sys\nsys.stdout.write(f"world {os.environ[\'WORLD_SIZE\']} threads {os.environ[\'OMP_NUM_THREADS\']}\\n")\n')
    r = subprocess.run([sys.executable, '-m', 'distrib.launch', str(s)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert len(re.findall('world 2 threads 1', r.stdout)) == 2  # 2 cores // 2 processes

def test_bad_arguments(tmp_path):
    r = subprocess.run([sys.executable, '-m', 'distrib.launch', 'nope.py'], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and 'does not exist' in r.stderr
    s = tmp_path/'ok.py'; s.write_text('')
    r = subprocess.run([sys.executable, '-m', 'distrib.launch', '--nproc_per_node', '0', str(s)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and 'at least 1' in r.stderr

def _free_port()->int:
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]

def test_two_nodes_one_job():
    "Two launchers, --nnodes 2 on this machine (static rendezvous through --master_addr/--master_port): one world of 4"
    port = _free_port()
    cmd = lambda n: [sys.executable, '-m', 'distrib.launch', '--nnodes', '2', '--node_rank', str(n), '--nproc_per_node', '2',
                     '--master_addr', '127.0.0.1', '--master_port', str(port), str(SCRIPTS/'multinode.py')]
    procs = [subprocess.Popen(cmd(n), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT) for n in (0, 1)]
    try: outs = [p.communicate(timeout=150) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None: p.kill()
    for p, (out, err) in zip(procs, outs): assert p.returncode == 0, out + err
    found = {}
    for node, (out, _) in enumerate(outs):
        for rank, local, world, nrank, total in re.findall(r'rank (\d) local (\d) world (\d) node (\d) sum (\d+)', out):
            assert (world, nrank, total) == ('4', str(node), '10')  # 1+2+3+4: the all_reduce spans both nodes
            found[int(rank)] = (node, int(local))
    assert found == {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)}, outs

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
