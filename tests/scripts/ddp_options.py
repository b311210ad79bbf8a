"""Under 2 processes: DDP options reach DistributedDataParallel, comm hooks by name act on the gradients, DDP's
unused-parameter error carries the find_unused_parameters hint, and an RNN's reset() reaches the wrapped module.
Rank 0 prints one 'CHECK <name> OK <figures>' line per check."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.nn.parallel import DistributedDataParallel
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState
from distrib import (Learner, DataLoaders, Callback, DistributedDL, DistributedModule, rank_distrib, num_distrib,
                     setup_distrib, teardown_distrib)
from _common import check

torch.manual_seed(0)
x = torch.randn(64, 16); y = x @ torch.randn(16, 1)

def learner(model, bs=8):
    dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=bs, shuffle=True), DataLoader(TensorDataset(x, y), batch_size=16))
    learn = Learner(dls, model, nn.functional.mse_loss, opt_func=torch.optim.SGD, lr=0.01)
    learn.progress.enabled = False
    return learn

setup_distrib(timeout=60)

# 1. the options reach DistributedDataParallel
learn = learner(nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 1)))
with learn.distrib_ctx(find_unused_parameters=True, gradient_as_bucket_view=True, broadcast_buffers=False, bucket_cap_mb=1):
    m = learn.model
    got = (type(m).__name__, isinstance(m, DistributedDataParallel), m.find_unused_parameters, m.gradient_as_bucket_view,
           m.broadcast_buffers, m.bucket_bytes_cap, m.static_graph)
    learn.fit(1)
check('ddp_options', got == ('DistributedModule', True, True, True, False, 1024*1024, False), str(got))
with learn.distrib_ctx(static_graph=True):
    got = (learn.model.static_graph, learn.model.find_unused_parameters, learn.model.gradient_as_bucket_view)
    learn.fit(1)
check('ddp_static_graph', got == (True, False, False), str(got))
try: learn.distrib_ctx(bucket_cap=1).__enter__(); ok = False
except TypeError as e: ok = 'bucket_cap' in str(e) and 'bucket_cap_mb' in str(e)
check('ddp_unknown_option', ok)

# 2. communication hooks by name
class GradProbe(Callback):
    "After each backward: are the averaged gradients representable in `dtype`? The rank of the first weight's gradient"
    order = 20
    def __init__(self, dtype=torch.float16): self.dtype, self.exact, self.ranks = dtype, [], []
    def after_backward(self):
        gs = [p.grad for p in self.learn.model.parameters()]
        self.exact.append(all(torch.equal(g, g.to(self.dtype).float()) for g in gs))
        self.ranks.append(int(torch.linalg.matrix_rank(self.learn.model.module[0].weight.grad)))

def hooked(comm_hook=None, dtype=torch.float16, **kw):
    torch.manual_seed(1)  # the same initial weights whatever ran before (their gradients are of full rank 16)
    learn = learner(nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1)))
    # a step's 16 samples give a weight gradient of rank 16 only if they are well conditioned, which depends on which
    # samples: torch.randperm's order (shuffle='randperm'), for which the ranks below were checked; in index_shuffle's,
    # step 2's gradient is of numerical rank 15 with one hook and 16 without
    learn.dls = DataLoaders(DistributedDL(TensorDataset(x, y), batch_size=8, shuffle='randperm', rank=rank_distrib(),
                                          world_size=num_distrib()), learn.dls.valid)
    probe = GradProbe(dtype)
    with learn.distrib_ctx(comm_hook=comm_hook, **kw): learn.fit(1, cbs=probe)
    return probe

plain, fp16 = hooked(None), hooked('fp16')
check('comm_hook_fp16', all(fp16.exact) and not any(plain.exact),
      f'fp16-representable grads: with hook {sum(fp16.exact)}/{len(fp16.exact)}, without {sum(plain.exact)}/{len(plain.exact)}')
if torch.distributed.get_backend() == 'nccl':   # bf16 needs NCCL (distrib checks the group's backend, torch the build)
    bf16, plain_bf16 = hooked('bf16', torch.bfloat16), hooked(None, torch.bfloat16)
    check('comm_hook_bf16', all(bf16.exact) and not any(plain_bf16.exact),
          f'bf16-representable grads: with hook {sum(bf16.exact)}/{len(bf16.exact)}, without {sum(plain_bf16.exact)}/{len(plain_bf16.exact)}')
else:  # a TypeError naming NCCL, also from a CUDA build of torch without a GPU, and the Learner is left as it was
    learn = learner(nn.Linear(16, 1)); model = learn.model
    try:
        with learn.distrib_ctx(comm_hook='bf16'): pass
        msg = ''
    except TypeError as e: msg = str(e)
    check('comm_hook_bf16_needs_nccl', 'NCCL' in msg and learn.model is model and not hasattr(learn, 'distributed_trainer'), msg)
psgd = hooked('powersgd', comm_hook_state=PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2))
check('comm_hook_powersgd', psgd.ranks[:2] == [16, 16] and set(psgd.ranks[2:]) == {1} and set(plain.ranks) == {16},
      f'rank of the 16x16 weight gradient per step: {psgd.ranks}')
try: hooked('fp8'); ok = False
except ValueError as e: ok = all(n in str(e) for n in ("'fp16'", "'bf16'", "'powersgd'"))
check('comm_hook_unknown', ok)

# 3. a parameter without gradient: the error says to pass find_unused_parameters=True
class TwoHeads(nn.Module):
    def __init__(self): super().__init__(); self.a, self.b = nn.Linear(16, 1), nn.Linear(16, 1)
    def forward(self, x): return self.a(x)   # `b` is never used
learn = learner(TwoHeads())
model = learn.model
try:
    with learn.distrib_ctx(): learn.fit(1)
    msg = ''
except RuntimeError as e: msg = str(e)
check('find_unused_hint', 'Expected to have finished reduction' in msg and
      'Pass find_unused_parameters=True to learn.distrib_ctx()' in msg and learn.model is model)
with learn.distrib_ctx(find_unused_parameters=True): learn.fit(1)
check('find_unused_fixed', learn.recorder.values[-1][0] is not None)

# 4. an RNN language model that keeps its hidden state: reset() reaches it while wrapped
class TinyLM(nn.Module):
    def __init__(self, vocab=8, nh=16):
        super().__init__()
        self.emb, self.rnn, self.out = nn.Embedding(vocab, nh), nn.GRU(nh, nh, batch_first=True), nn.Linear(nh, vocab)
        self.h, self.n_reset = None, 0
    def forward(self, x):                        # x: (bs, seq_len)
        out, h = self.rnn(self.emb(x), self.h)
        self.h = h.detach()
        return self.out(out).transpose(1, 2)     # (bs, vocab, seq_len)
    def reset(self): self.h, self.n_reset = None, self.n_reset + 1

class ModelResetter(Callback):
    def before_train(self):
        assert isinstance(self.learn.model, DistributedDataParallel)
        self.learn.model.reset()
    def before_validate(self): self.learn.model.reset()

seq = torch.arange(16*17).remainder(8).view(16, 17)
xs, ys = seq[:, :-1].reshape(16, 2, 8).transpose(0, 1).reshape(32, 8), seq[:, 1:].reshape(16, 2, 8).transpose(0, 1).reshape(32, 8)
dls = DataLoaders(DataLoader(TensorDataset(xs, ys), batch_size=8), DataLoader(TensorDataset(xs, ys), batch_size=8))
lm = TinyLM()
learn = Learner(dls, lm, nn.functional.cross_entropy, lr=0.03, cbs=ModelResetter())
learn.progress.enabled = False
with learn.distrib_ctx():
    learn.fit(4)
    learn.model.reset()
    wrapped = isinstance(learn.model, DistributedModule)
v = learn.recorder.values
check('rnn_reset', wrapped and lm.n_reset == 2*4 + 1 and learn.model is lm and v[-1][1] < v[0][1]/2,
      f'resets={lm.n_reset} valid_loss {v[0][1]:.3f} -> {v[-1][1]:.3f}')
teardown_distrib()
print(f'rank {rank_distrib()} done')
