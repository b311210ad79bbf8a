"The launcher: exit codes and argument errors"
import re, sys, subprocess
from conftest import launch, ROOT

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
