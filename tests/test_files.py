"""Saving and loading when things go wrong, for real: a full disk (a small tmpfs in a private mount namespace, under
2 processes), and saves killed by the kernel in the middle of their write (a file size limit, SIGXFSZ)."""
import os, resource, shutil, signal, subprocess, sys
import pytest, torch
from conftest import checked, SCRIPTS, ROOT
from distrib import save_file, load_file, checkpoints, Checkpoint

def _namespace_cmd()->list|None:
    "`unshare` arguments giving a private mount namespace in which this user may mount a tmpfs, or None"
    if shutil.which('unshare') is None: return None
    for opts in (['-rm'], ['-m']):   # as an unprivileged user (a user namespace), or as root
        try: r = subprocess.run(['unshare', *opts, 'sh', '-c', 'mount -t tmpfs -o size=64k tmpfs /mnt'],
                                capture_output=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired): continue
        if r.returncode == 0: return ['unshare', *opts]
    return None

def test_disk_full(tmp_path):
    "A 2 MB tmpfs: learn.save and Checkpoint on a full disk, on 2 processes (see scripts/disk_full.py)"
    ns = _namespace_cmd()
    if ns is None: pytest.skip("cannot mount a tmpfs here (no unshare, or no mount namespace for this user)")
    d = tmp_path/'small'
    d.mkdir()
    launch = f"{sys.executable} -m distrib.launch --nproc_per_node 2 {SCRIPTS/'disk_full.py'} {d}"
    r = subprocess.run([*ns, 'sh', '-c', f'mount -t tmpfs -o size=2m tmpfs {d} && exec {launch}'], capture_output=True,
                       text=True, timeout=180, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED='1'))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    for name in ('save_disk_full', 'checkpoint_disk_full', 'checkpoint_after_disk_full'):
        assert checked(r.stdout, name), (name, r.stdout)
    assert not list(d.iterdir())   # the tmpfs was in the namespace: nothing written here

def _killed(mode, folder, limit:int):
    "Run killed_save.py `mode` with files limited to `limit` bytes; assert the kernel killed it (SIGXFSZ)"
    def limit_size(): resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    r = subprocess.run([sys.executable, str(SCRIPTS/'killed_save.py'), mode, str(folder)], capture_output=True,
                       text=True, timeout=120, cwd=ROOT, preexec_fn=limit_size)
    assert r.returncode == -signal.SIGXFSZ, (r.returncode, r.stdout, r.stderr[-3000:])

def test_killed_save(tmp_path):
    """A save killed mid-write leaves the previous file as it was and a torn temporary file, never listed; reading
    the torn bytes says they are incomplete; the next save removes it"""
    f = save_file({'v': 1}, tmp_path/'m.pth')
    _killed('save', tmp_path, limit=65536)
    assert load_file(f) == {'v': 1}
    torn, = [p for p in tmp_path.iterdir() if p.name.startswith('.m.pth.tmp.')]
    assert torn.stat().st_size == 65536
    shutil.copy(torn, tmp_path/'torn.pth')
    with pytest.raises(EOFError, match='torn.pth is incomplete: it ends after 65536 bytes'):
        load_file(tmp_path/'torn.pth')
    save_file({'v': 2}, f)
    assert sorted(p.name for p in tmp_path.iterdir()) == ['m.pth', 'torn.pth'] and load_file(f) == {'v': 2}

def test_killed_checkpoint(tmp_path):
    """Killed while writing epoch 1's checkpoint: the latest complete checkpoint is still epoch 0's; the next run
    resumes from it, removes the torn file, and ends as an uninterrupted run"""
    sys.path.insert(0, str(SCRIPTS))
    from killed_save import make_learner
    make_learner(tmp_path).fit(1, cbs=Checkpoint('ck'))
    (_, first), = checkpoints(tmp_path/'ck')
    _killed('fit', tmp_path, limit=first.stat().st_size // 2)
    assert [p for _, p in checkpoints(tmp_path/'ck')] == [first]
    torn, = [p for p in (tmp_path/'ck').iterdir() if p.name.startswith(f'.{first.name[:5]}')]
    ck, learn = Checkpoint('ck'), make_learner(tmp_path)
    learn.fit(2, cbs=ck)
    assert ck.resumed_from == first and not torn.exists()
    ref = make_learner(tmp_path/'ref')
    ref.fit(2, cbs=Checkpoint())
    assert all(torch.equal(p, q) for p, q in zip(learn.model.parameters(), ref.model.parameters()))
    assert learn.recorder.values == ref.recorder.values
