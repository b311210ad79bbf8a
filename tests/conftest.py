"Shared helpers: run a script under `python -m distrib.launch` with a timeout, so a hang fails the test"
import os, subprocess, sys
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
