"""Signals to the launcher (Ctrl-C, SIGTERM, SIGKILL) end every worker within seconds, none left behind. Run with
`pytest -s` to see how long each took (the FAULT-TIME lines). Behind `-m slow` (which CI runs): they wait for
real signals to travel through the launcher, about 40 s of jobs."""
import os, re, signal, subprocess, sys, time
import pytest
from conftest import orphans, new_tag, tagged, report, SCRIPTS, ROOT

pytestmark = pytest.mark.slow

def _wait_for(path, marker, proc, timeout=120):
    "Wait until `marker` appears in file `path` written by `proc`; return the file's text"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        text = path.read_text()
        if marker in text: return text
        assert proc.poll() is None, f"launcher ended early: {text}"
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"no {marker} within {timeout} s")

def _gone(pid)->bool:
    "True when process `pid` no longer runs (absent, or a zombie waiting to be reaped)"
    try: return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0] == 'Z'
    except FileNotFoundError: return True

def _start_training(out, *args):
    "Start the launcher on interrupt.py (which trains until stopped) with a new tag; (Popen, tag, worker pids)"
    tag = new_tag()
    cmd = [sys.executable, '-m', 'distrib.launch', '--nproc_per_node', '2', str(SCRIPTS/'interrupt.py'), *args]
    with open(out, 'w') as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                             env=dict(os.environ, PYTHONUNBUFFERED='1', DISTRIB_TEST_TAG=tag))
    text = _wait_for(out, 'STUBBORN' if args else 'TRAINING', p)
    pids = [int(x) for x in re.findall(r'PID \d (\d+)', text)]
    assert len(pids) == 2, text
    return p, tag, pids

@pytest.mark.parametrize('sig,stubborn', [(signal.SIGINT, False), (signal.SIGTERM, True)])
def test_launcher_signal_stops_all(tmp_path, sig, stubborn):
    """Ctrl-C (SIGINT) or SIGTERM to the launcher: every worker is gone within 10 s, also one that ignores both
    signals (killed after the launcher's --shutdown_timeout of 5 s), and the launcher exits with 128+N"""
    out = tmp_path/'out.txt'
    p, tag, pids = _start_training(out, *(['stubborn'] if stubborn else []))
    try:
        start = time.time()
        p.send_signal(sig)
        rc = p.wait(timeout=60)
        secs = time.time() - start
    finally:
        if p.poll() is None: p.kill()
    report(f'{signal.Signals(sig).name} to the launcher' + (' (a worker ignores it)' if stubborn else ''), secs, since='the signal')
    text = out.read_text()
    assert rc == 128 + sig, text
    assert f'distrib.launch: stopped by {signal.Signals(sig).name}' in text, text
    assert 'Traceback' not in text, text
    assert all(_gone(pid) for pid in pids), [(pid, _gone(pid)) for pid in pids]
    assert secs < 10
    assert not orphans(tag), orphans(tag)

def test_launcher_killed_leaves_no_worker(tmp_path):
    """SIGKILL to the launcher (the OOM killer, `kill -9`), which can stop nothing: every worker is gone within 5 s
    (each asked Linux for SIGKILL when its launcher dies), none left training"""
    p, tag, pids = _start_training(tmp_path/'out.txt')
    try:
        start = time.time()
        p.kill(); p.wait(timeout=30)
        while not all(_gone(pid) for pid in pids) and time.time() - start < 30: time.sleep(0.05)
        secs = time.time() - start
        left = orphans(tag)
    finally:
        for pid in tagged(tag): os.kill(pid, signal.SIGKILL)  # this test's own processes, if the property broke
    report('SIGKILL to the launcher', secs, since='the signal')
    assert secs < 5, secs
    assert not left, left
