"""A real one-node Slurm cluster and a usable Open MPI for the tests (stdlib only).

`ensure_packages()` installs Debian's slurm-wlm, munge and openmpi-bin when a program is missing; `SlurmCluster(dir)`
starts munged, slurmctld and slurmd as children of this process with everything (configuration, munge key and socket,
state, logs) under `dir`, nothing in /etc; clients reach it through `cluster.env` (`SLURM_CONF`). `stop()` ends the
jobs, the daemons and every process the cluster started. Failures raise `ClusterError` with the daemons' log tails.
"""
from __future__ import annotations
import os, pwd, shutil, signal, socket, subprocess, time
from pathlib import Path

APT_PACKAGES = ['slurm-wlm', 'munge', 'openmpi-bin']
PROGRAMS = ['munged', 'munge', 'unmunge', 'slurmctld', 'slurmd', 'slurmstepd', 'srun', 'sbatch', 'squeue', 'sinfo',
            'scontrol', 'scancel', 'mpirun']
MARKER = 'DISTRIB_TEST_CLUSTER'  # in the daemons' environment (inherited by slurmstepd), to find strays at stop
FINAL_STATES = {'COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL', 'OUT_OF_MEMORY', 'PREEMPTED',
                'BOOT_FAIL', 'DEADLINE', 'REVOKED', 'SPECIAL_EXIT'}

class ClusterError(RuntimeError): "The test cluster could not be installed, started or stopped; the message says why"

def _missing()->list:
    path = os.environ.get('PATH', '') + ':/usr/sbin:/sbin:/usr/bin'
    return [p for p in PROGRAMS if shutil.which(p, path=path) is None]

def _tail(text:str, n:int=40)->str: return '\n'.join(text.splitlines()[-n:])

def ensure_packages(timeout:float=900)->list:
    """Install `APT_PACKAGES` with apt-get (update, then install without recommends) when a program of `PROGRAMS` is
    missing; returns the packages installed ([] when none was needed). Raises `ClusterError` naming the cause."""
    missing = _missing()
    if not missing: return []
    if shutil.which('apt-get') is None:
        raise ClusterError(f"{missing} missing and no apt-get to install {APT_PACKAGES}")
    if os.geteuid() != 0: raise ClusterError(f"{missing} missing; installing {APT_PACKAGES} needs root")
    env = dict(os.environ, DEBIAN_FRONTEND='noninteractive')
    policy = Path('/usr/sbin/policy-rc.d')  # exit 101: the packages' scripts must not start services (no init here)
    added = not policy.exists()
    if added: policy.write_text('#!/bin/sh\nexit 101\n'); policy.chmod(0o755)
    try:
        lock = ['-o', 'DPkg::Lock::Timeout=300']  # wait for another apt run rather than fail
        for cmd in (['apt-get', *lock, 'update', '-q'],
                    ['apt-get', *lock, 'install', '-y', '-q', '--no-install-recommends', *APT_PACKAGES]):
            r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=timeout)
            if r.returncode:
                raise ClusterError(f"{' '.join(cmd)} failed (exit code {r.returncode}):\n{_tail(r.stdout)}")
    finally:
        if added: policy.unlink()
    if _missing(): raise ClusterError(f"after installing {APT_PACKAGES}, still missing {_missing()}")
    return APT_PACKAGES

def mpi_env(base:dict|None=None)->dict:
    "`base` (default `os.environ`) with what `mpirun` of Open MPI needs as root in a container, on few cores"
    return dict(os.environ if base is None else base, OMPI_ALLOW_RUN_AS_ROOT='1', OMPI_ALLOW_RUN_AS_ROOT_CONFIRM='1',
                OMPI_MCA_rmaps_base_oversubscribe='1')

def _free_port()->int:
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); return s.getsockname()[1]

def _alive(pid:int)->bool:
    try: os.waitpid(pid, os.WNOHANG)  # reap our own exited child
    except (ChildProcessError, OSError): pass
    try: return Path(f'/proc/{pid}/stat').read_text().split(') ', 1)[1][0] != 'Z'
    except (OSError, IndexError): return False

def _wait(pred, timeout:float, interval:float=0.1):
    end = time.monotonic() + timeout
    while not (r := pred()) and time.monotonic() < end: time.sleep(interval)
    return r

def _ancestors()->set:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try: pid = int(Path(f'/proc/{pid}/stat').read_text().rsplit(') ', 1)[1].split()[1])
        except (OSError, ValueError, IndexError): break
    return pids

SLURM_CONF = """\
ClusterName=distribtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire (default 120 s) is also how long a requeued job waits before it may start again
AuthInfo=socket={munge_socket},cred_expire=5
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
PlugStackConfig={d}/plugstack.conf
# no cgroups, no systemd, no accounting: works in a plain container
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
# the scheduler's main loop every 2 s instead of 60 s (a requeued job starts sooner)
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
KillWait=5
MinJobAge=600
InactiveLimit=0
Waittime=0
NodeName={host} NodeAddr=127.0.0.1 NodeHostname={host} CPUs={cpus} RealMemory={mem}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""

class SlurmCluster:
    """A one-node Slurm cluster (munged, slurmctld, slurmd) configured and running under directory `d`, with `cpus`
    CPUs (default: this machine's, at least 2). Raises `ClusterError` with the daemons' log tails when it does not
    reach an idle node within `timeout` seconds, after stopping what it started."""
    def __init__(self, d, cpus:int|None=None, timeout:float=60):
        self.dir = d = Path(d).resolve()
        for sub in ('state', 'spool', 'run', 'log', 'munge'): (d/sub).mkdir(parents=True, exist_ok=True)
        self.host = socket.gethostname().split('.')[0]
        try: socket.gethostbyname(self.host)
        except OSError: self.host = 'localhost'  # the node's name is rank 0's address: it must resolve
        self.conf, self.munge_socket = str(d/'slurm.conf'), str(d/'munge'/'munge.socket')
        if len(self.munge_socket) > 100: raise ClusterError(f"path too long for unix sockets: {d}")
        self.procs = {}
        key = d/'munge'/'munge.key'
        key.write_bytes(os.urandom(1024)); key.chmod(0o600); (d/'munge').chmod(0o700)
        (d/'plugstack.conf').write_text('')
        mem = int(next(l for l in open('/proc/meminfo') if l.startswith('MemTotal')).split()[1]) // 1024 * 8 // 10
        Path(self.conf).write_text(SLURM_CONF.format(
            host=self.host, d=d, ctld_port=_free_port(), slurmd_port=_free_port(), munge_socket=self.munge_socket,
            cpus=cpus or max(2, os.cpu_count() or 1), mem=max(1024, mem)))
        try: self._start(timeout)
        except Exception as e:
            msg = f"{type(e).__name__}: {e}" if not isinstance(e, ClusterError) else str(e)
            logs = '\n'.join(f"--- {p.name}:\n{_tail(p.read_text(errors='replace'), 25)}"
                             for p in sorted((d/'log').glob('*')) if p.stat().st_size)
            self.stop()
            raise ClusterError(f"the Slurm test cluster did not start: {msg}\n{logs}") from None

    @property
    def env(self)->dict:
        "`os.environ` without inherited Slurm variables, with `SLURM_CONF` naming this cluster's configuration"
        e = {k: v for k, v in os.environ.items() if not k.startswith(('SLURM_', 'SBATCH_', 'SRUN_', 'SALLOC_'))}
        return dict(e, SLURM_CONF=self.conf)

    def run(self, *cmd, timeout:float=120, check:bool=True, **kw)->subprocess.CompletedProcess:
        """Run a client command (`srun`, `sbatch`, `scontrol`...) against this cluster, text output captured; with
        `check`, a non-zero exit is a `ClusterError` with the command's output"""
        kw.setdefault('capture_output', True)
        r = subprocess.run([str(c) for c in cmd], env=kw.pop('env', self.env), text=True, timeout=timeout, **kw)
        if check and r.returncode:
            raise ClusterError(f"`{' '.join(map(str, cmd))}` failed (exit code {r.returncode}):\n"
                               f"{_tail(r.stdout or '')}\n{_tail(r.stderr or '')}")
        return r

    def job(self, job_id)->dict:
        "`scontrol show job`'s fields of job `job_id` (JobState, ExitCode, Restarts...)"
        r = self.run('scontrol', 'show', 'job', '-o', job_id, check=False, timeout=30)
        return dict(kv.split('=', 1) for kv in r.stdout.split() if '=' in kv)

    def wait_job(self, job_id, timeout:float=120)->tuple:
        """Poll job `job_id` until it reaches a final state (much sooner than `sbatch --wait`, which polls every
        10 s); returns (state, exit code), e.g. ('COMPLETED', '0:0'). Raises `ClusterError` past `timeout` s."""
        end = time.monotonic() + timeout
        while (state := self.job(job_id).get('JobState', '?')) not in FINAL_STATES:
            if time.monotonic() > end: raise ClusterError(f"job {job_id} still {state} after {timeout} s")
            time.sleep(0.2)
        return state, self.job(job_id).get('ExitCode')

    def _launch(self, name:str, cmd:list):
        out = open(self.dir/'log'/f'{name}.stdout', 'ab')
        self.procs[name] = subprocess.Popen(cmd, env=dict(self.env, **{MARKER: str(self.dir)}), cwd=self.dir,
                                            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        out.close()
        return self.procs[name]

    def _up(self, name:str, pred, timeout:float, what:str):
        "Wait until `pred()`; `ClusterError` when daemon `name` exits first or `timeout` passes"
        def ok():
            if self.procs[name].poll() is not None: raise ClusterError(f"{name} exited ({self.procs[name].returncode})")
            return pred()
        if not _wait(ok, timeout, 0.2): raise ClusterError(f"{what} within {timeout:.0f} s")

    def _start(self, timeout:float):
        d, sock = self.dir, self.munge_socket
        # munged as root needs --force (it refuses a 0700 socket directory otherwise); -F logs to stderr
        self._launch('munged', ['munged', '-F', '--force', f'--socket={sock}', f'--key-file={d}/munge/munge.key',
                                f'--pid-file={d}/run/munged.pid', f'--seed-file={d}/munge/munged.seed'])
        def munge_ok():
            cred = subprocess.run(['munge', '-n', '-S', sock], capture_output=True)
            return cred.returncode == 0 and subprocess.run(['unmunge', '-S', sock], input=cred.stdout,
                                                           capture_output=True).returncode == 0
        self._up('munged', lambda: os.path.exists(sock) and munge_ok(), timeout / 3, 'munged did not answer')
        self._launch('slurmctld', ['slurmctld', '-D', '-c', '-f', self.conf])  # -c: no state from an earlier run
        self._up('slurmctld', lambda: 'UP' in self.run('scontrol', 'ping', check=False).stdout, timeout / 2,
                 'slurmctld did not answer `scontrol ping`')
        self._launch('slurmd', ['slurmd', '-D', '-f', self.conf, '-N', self.host])
        self._up('slurmd', lambda: self.run('sinfo', '-h', '-N', '-o', '%t', check=False).stdout.strip() == 'idle',
                 timeout, f"node {self.host} was not idle")

    def _strays(self)->set:
        "Processes of this cluster still alive: daemons, slurmstepd (MARKER), tasks and clients (SLURM_CONF)"
        marks = {f'{MARKER}={self.dir}'.encode(), f'SLURM_CONF={self.conf}'.encode()}
        skip, found = _ancestors(), {p.pid for p in self.procs.values() if _alive(p.pid)}
        for ent in os.listdir('/proc'):
            if not ent.isdigit() or int(ent) in skip: continue
            try: env = set(Path(f'/proc/{ent}/environ').read_bytes().split(b'\0'))
            except OSError: continue
            if env & marks and _alive(int(ent)): found.add(int(ent))
        return found - skip

    def stop(self):
        "Cancel every job, stop the daemons, end every process of the cluster; `ClusterError` if one survives"
        ctld = self.procs.get('slurmctld')
        if ctld and _alive(ctld.pid):
            self.run('scancel', '--full', '--quiet', '-u', pwd.getpwuid(os.getuid()).pw_name, check=False, timeout=10)
            _wait(lambda: not self.run('squeue', '-h', check=False, timeout=10).stdout.strip(), 5, 0.2)
        for name in ('slurmd', 'slurmctld', 'munged'):
            p = self.procs.get(name)
            if p is None or not _alive(p.pid): continue
            p.terminate()
            if not _wait(lambda: not _alive(p.pid), 5): p.kill()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self._strays():
                try: os.kill(pid, sig)
                except ProcessLookupError: pass
            if _wait(lambda: not self._strays(), 3): break
        if self._strays(): raise ClusterError(f"processes still alive after stopping the cluster: {self._strays()}")
