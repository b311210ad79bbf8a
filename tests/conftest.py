"Shared helpers: run a script under `python -m distrib.launch` with a timeout, so a hang fails the test"
import os, re, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent/'scripts'

def launch(script, *args, nproc=2, launcher_args=(), timeout=120, cwd=None, env=None):
    "Run `script` with `nproc` processes under distrib.launch; returns the CompletedProcess (text output)"
    e = dict(os.environ, PYTHONUNBUFFERED='1', **(env or {}))
    cmd = [sys.executable, '-m', 'distrib.launch', '--nproc_per_node', str(nproc), *launcher_args, str(script), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd or ROOT, env=e)

@pytest.fixture
def run_launch(): return launch

def launch_ok(script, nproc=2, timeout=300)->str:
    "Run `script` under distrib.launch, assert it succeeded; its stdout (one job serving several tests)"
    r = launch(script, nproc=nproc, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr[-5000:]
    return r.stdout

def checked(out:str, name:str)->bool:
    "True when the job's output `out` has the line 'CHECK <name> OK'"
    return re.search(rf'^CHECK {name} OK', out, re.M) is not None
