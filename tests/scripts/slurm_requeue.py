"""Preemption on Slurm, the part that needs no Checkpoint: SIGUSR1 reaches every rank, rank 0 requeues the job
(`requeue_slurm_job`) where `Checkpoint(auto_requeue=True)` will after writing its checkpoint, and the job's second
run sees `World.restart_count == 1`. Started as `srun python slurm_requeue.py` in a batch job by tests/test_clusters.py.
"""
import signal, sys, time
from distrib import current_world, distrib_barrier, requeue_slurm_job

world = current_world()
if world.restart_count:
    distrib_barrier()  # the requeued run's ranks form their group again
    print(f"RESTARTED rank {world.rank} of {world.world_size} restart_count {world.restart_count} job {world.job_id}",
          flush=True)
    sys.exit(0)
got = []
signal.signal(signal.SIGUSR1, lambda *_: got.append(time.time()))
distrib_barrier()  # every rank has its handler before the test sends the signal
print(f"READY rank {world.rank}", flush=True)
deadline = time.time() + 120
while not got and time.time() < deadline: time.sleep(0.05)
print(f"USR1 rank {world.rank} {'received' if got else 'missing'}", flush=True)
distrib_barrier()  # here every rank would have written its part of the preemption checkpoint
if world.rank == 0:
    requeue_slurm_job(world.job_id)
    print("REQUEUED", flush=True)
time.sleep(30)  # Slurm ends every task (SIGTERM) and runs the job again
sys.exit(3)
