"""The bytes the job's store receives from each waiting rank, measured from outside the job: `python -m
distrib.launch --nproc_per_node W store_traffic.py [SECS]`.

Rank 0 keeps the others waiting twice, each time for SECS seconds (default 12) in a declared long phase: first in
`rank0_first`'s function (the others wait in its barrier), then before an `all_reduce_sum` that the others are
already in. Inside each phase it reads, with iproute2's `ss`, the kernel's count of the bytes received by each of the
store's connections (the store's port is `MASTER_PORT`: `distrib.launch`'s single-node store), at WARM seconds into the
phase (past the deadlock hold) and at SECS-1, attributes each connection to the worker at its other end, and prints,
for the ranks other than itself, `TRAFFIC <what> <W> <bytes per second per waiting rank>`.
"""
import os, re, subprocess, sys, time
import torch
from distrib import rank0_first, all_reduce_sum, long_phase, setup_distrib, rank_distrib, num_distrib

SECS = float(sys.argv[1]) if len(sys.argv) > 1 else 12.
WARM = 4.  # seconds into the phase before the first reading: the waiting ranks have waited past the 3 s hold
PORT = int(os.environ['MASTER_PORT'])

def connections()->dict:
    "{pid of the worker at the other end: bytes the store received on its connections} from `ss`"
    out = subprocess.run(['ss', '-tinpH', 'state', 'established'], capture_output=True, text=True, check=True).stdout
    recv, owner = {}, {}
    for head, info in re.findall(r'^(\S.*)\n\s+(.*)$', out, re.M):
        f = head.split()
        local, peer = f[2], f[3]
        lport, pport = int(local.rsplit(':', 1)[1]), int(peer.rsplit(':', 1)[1])
        pid = re.search(r'pid=(\d+)', head)
        if lport == PORT:  # the store's end of a connection: what it received
            m = re.search(r'bytes_received:(\d+)', info)
            recv[pport] = int(m.group(1)) if m else 0
        elif pport == PORT and pid: owner[lport] = int(pid.group(1))  # a client's end: whose it is
    by_pid = {}
    for port, n in recv.items():
        pid = owner.get(port)
        if pid is not None: by_pid[pid] = by_pid.get(pid, 0) + n
    return by_pid

def measure(what:str):
    "On rank 0, inside a long phase of SECS seconds: the waiting ranks' bytes per second, printed"
    time.sleep(WARM)
    a, t0 = connections(), time.monotonic()
    time.sleep(SECS - WARM - 1)
    b, t1 = connections(), time.monotonic()
    skip = {os.getpid(), int(os.environ.get('DISTRIB_LAUNCHER_PID', 0))}
    pids = [p for p in b if p not in skip and p in a]
    n = sum(b[p] - a[p] for p in pids)
    w = num_distrib()
    print(f"TRAFFIC {what} {w} {n / (t1 - t0) / max(len(pids), 1):.1f} (over {len(pids)} waiting ranks of {w - 1}, "
          f"{t1 - t0:.1f} s)", flush=True)

setup_distrib()
rank0_first(lambda: measure('rank0_first') if rank_distrib() == 0 else None)
if rank_distrib() == 0:
    with long_phase('measuring'): measure('collective')
all_reduce_sum(torch.ones(1))
