"One rank of a multi-node job: prints its place and the sum of (rank + 1) over the world, from a global all_reduce"
import os, torch
import torch.distributed as dist
from distrib import setup_distrib, teardown_distrib, rank_distrib, num_distrib, local_rank_distrib

setup_distrib(timeout=60)
t = torch.tensor([rank_distrib() + 1.])
dist.all_reduce(t)
print(f"rank {rank_distrib()} local {local_rank_distrib()} world {num_distrib()} node {os.environ['GROUP_RANK']} "
      f"sum {t.item():.0f}", flush=True)
teardown_distrib()
