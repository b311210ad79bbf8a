"""A collective that returns before it is done, as NCCL's do (here gloo's `async_op=True`, its `Work.is_completed`
recorded with `mark_queued`): rank 0 queues an all_reduce that rank 1 does not join, and its main thread goes on.
`python -m distrib.launch --nproc_per_node 2 queued.py MODE`:

- deadlock: rank 1 waits in `distrib_barrier()`: every rank waits, and the examination names rank 1 as the cause;
- stall: rank 1 sleeps 8 s in its script (with DISTRIB_STALL_REPORT=2: it reports itself, rank 0 waiting in the
  queued all_reduce), then joins the all_reduce: the job ends well;
- timeout: the process group's timeout is 5 s (the all_reduce runs in a group of 120 s, as NCCL's timeout has a
  grace over the group's): rank 0's watchdog ends it with a `CollectiveTimeoutError` naming rank 1.
"""
import sys, time, datetime
import torch
import torch.distributed as dist
from distrib import setup_distrib, distrib_barrier, rank_distrib
from distrib.runtime.position import mark_queued

mode = sys.argv[1]
setup_distrib(timeout=5 if mode == 'timeout' else 60)
slow = dist.new_group(backend='gloo', timeout=datetime.timedelta(seconds=120))
print(f"FAULT_AT {time.time()}", flush=True)
if rank_distrib() == 0:
    work = dist.all_reduce(torch.ones(1), group=slow, async_op=True)
    mark_queued('all_reduce', done=work.is_completed)
    while not work.is_completed(): time.sleep(0.1)   # the host goes on; here it waits, outside any collective
    work.wait()
elif mode == 'deadlock': distrib_barrier()
else:
    time.sleep(8 if mode == 'stall' else 60)
    dist.all_reduce(torch.ones(1), group=slow)
print('the fault did not happen', flush=True)
