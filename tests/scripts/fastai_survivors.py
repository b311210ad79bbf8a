"""fastai's own Learner under `--on-failure continue` (issue 50): `python -m distrib.launch --on-failure continue
--nproc_per_node 3 fastai_survivors.py DIR VICTIM[v]`, or `python fastai_survivors.py DIR ref` (fastai alone in one
process, with the global batch). The Learner of fastai_job.py (`learner`: 96 training items in order, drop_last,
fastai's Adam, `CrossEntropyLossFlat(ignore_index=-100)`, whose count distrib's `ItemMean` sums over the ranks, and
five metrics), a global batch of 6 (2 per rank on 3 processes, then 3 on the 2 survivors), `fit(3, 1e-2)`. In the
job, start rank VICTIM SIGKILLs itself before the backward of batch 5 of epoch 1 (`KILL_AT <time>`), or with `v`
after its forward of batch 1 of epoch 1's validation pass; every rank
writes `STEP <pid> <epoch> <iter> <time>` in DIR/steps<start rank>.txt after each optimizer step; at the end the
rank 0 of the last world writes DIR/weights.pt and DIR/values.pt (fastai's `recorder.values`) and prints `DONE world
<size>`. `ref` writes DIR/ref.pt and DIR/ref-values.pt."""
import os, signal, sys, time
from pathlib import Path
import torch
from fastai.callback.core import Callback
from fastai_job import learner

G, EPOCHS = 6, 3

class Steps(Callback):
    """Writes each optimizer step; the victim SIGKILLs itself before the backward of batch 5 of epoch 1, or, with
    `valid`, after its forward of batch 1 of epoch 1's validation pass"""
    def __init__(self, d:Path, victim:int, start_rank:int, valid:bool=False):
        self.f, self.victim, self.start = open(d/f'steps{start_rank}.txt', 'w', buffering=1), victim, start_rank
        self.valid = valid
    def _die(self, training:bool, at:tuple):
        if self.start == self.victim and self.valid != training and (self.epoch, self.iter) == at:
            print(f"KILL_AT {time.time()}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    def before_backward(self): self._die(True, (1, 5))
    def after_pred(self):
        if not self.training: self._die(False, (1, 1))
    def after_step(self):
        self.f.write(f"STEP {os.getpid()} {self.epoch} {self.iter} {time.time()}\n")
        time.sleep(0.05)   # the steps last: the kill lands in the middle of the epoch

if __name__ == '__main__':
    d, what = Path(sys.argv[1]), sys.argv[2]
    if what == 'ref':
        learn = learner(G)
        learn.fit(EPOCHS, 1e-2)
        torch.save(learn.model.state_dict(), d/'ref.pt')
        torch.save([[float(x) for x in v] for v in learn.recorder.values], d/'ref-values.pt')
        sys.exit(0)
    from distrib.fastai import *  # noqa: F403 -- the one-line change: was `from fastai.distributed import *`
    from distrib import current_world
    from distrib.model import unwrap_model
    start = current_world()
    learn = learner(G // start.world_size)
    learn.add_cb(Steps(d, int(what.rstrip('v')), start.rank, what.endswith('v')))
    with learn.distrib_ctx(backend='gloo'):
        learn.fit(EPOCHS, 1e-2)
        if current_world().rank == 0:
            torch.save(unwrap_model(learn.model).state_dict(), d/'weights.pt')
            torch.save([[float(x) for x in v] for v in learn.recorder.values], d/'values.pt')
            print(f"DONE world {current_world().world_size}", flush=True)
