"""Counting the host syncs of a training step, on CUDA and on CPU: `Syncs(learn, cuda)` opens a window per training
step (after the `Learner` moved the batch, before `before_batch`) that `StopSyncs` closes after every `after_batch`.
On CUDA it records what `torch.cuda.set_sync_debug_mode('warn')` reports (`is_sync_warning`: torch's
"called a synchronizing CUDA operation", not its one-time "Synchronization debug mode is a prototype feature"
warning). On CPU, where there is no device to wait for, `HostReads` substitutes CUDA's answer: it counts the
operations of the same code that would wait for a GPU (used by tests/scripts/gpu_syncs.py and
tests/test_host_syncs.py, which proves that a planted synchronising call is caught)."""
import os, traceback, warnings
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from distrib import Callback

SYNC_WARNING = 'called a synchronizing CUDA operation'   # c10/cuda/CUDAFunctions.cpp, warn_or_error_on_sync

def is_sync_warning(w:warnings.WarningMessage)->bool:
    "True for a warning of CUDA's sync debug mode about one synchronising call (a `UserWarning`, TORCH_WARN's)"
    return issubclass(w.category, UserWarning) and str(w.message).startswith(SYNC_WARNING)

# Reads that distrib makes on CPU only, where there is no device to wait for, and not on CUDA (the same line keeps the
# value on the device there): `AvgLoss.accumulate` adds a CPU batch loss to a Python float; the Recorder keeps a CPU
# step's loss as a number (`_step_record`)
CPU_ONLY = {('metrics.py', 'accumulate'), ('recorder.py', '_step_record')}

class HostReads(TorchDispatchMode):
    """Counts, in `seen` ('what at file:line'), the operations that wait for a CUDA device to know a value: reading one
    (`_local_scalar_dense`: `.item()`, `bool()`, `float()`), sizing a result by values (`nonzero`, `masked_select`,
    `unique`, indexing by a boolean mask), a copy to the host (`.cpu()`, `.tolist()`, `.numpy()`, which on a CPU tensor is no operation, so the
    methods are counted) and a copy between devices without `non_blocking` (`copy_`, `_to_copy`). On CPU it stands
    for CUDA's sync debug mode; the reads of `exempt` ((file name, function) pairs) are not counted."""
    OPS = {'_local_scalar_dense', 'nonzero', 'masked_select', 'unique', '_unique', '_unique2', 'unique_consecutive'}
    COPIES = ('cpu', 'tolist', 'numpy')
    MASKED = (torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default)
    def __init__(self, exempt=CPU_ONLY): super().__init__(); self.seen, self._orig, self.exempt = [], {}, exempt
    def _saw(self, what:str):
        f = next((f for f in reversed(traceback.extract_stack()[:-2])
                  if 'torch' not in f.filename and f.filename != __file__), None)
        if f is None or (os.path.basename(f.filename), f.name) not in self.exempt:
            self.seen.append(f'{what} at {f.filename}:{f.lineno}' if f else what)
    @staticmethod
    def _crosses(func, args, kwargs)->bool:
        "A copy between devices that the host waits for (no `non_blocking`)"
        if kwargs.get('non_blocking') or (func is torch.ops.aten.copy_.default and len(args) > 2 and args[2]):
            return False
        if func is torch.ops.aten.copy_.default: return args[0].device != args[1].device
        if func is torch.ops.aten._to_copy.default: return kwargs.get('device') not in (None, args[0].device)
        return False
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.name.split('::')[-1] in self.OPS: self._saw(func._schema.name)
        elif self._crosses(func, args, kwargs): self._saw(f'{func._schema.name} across devices')
        elif func in self.MASKED and any(i is not None and i.dtype == torch.bool for i in args[1]):
            self._saw(f'{func._schema.name} by a mask')   # sized by the mask's values: `nonzero` on CUDA
        return func(*args, **kwargs)
    def __enter__(self):
        for name in self.COPIES:
            orig = self._orig[name] = getattr(torch.Tensor, name)
            def wrapped(t, *a, _orig=orig, _name=name, **k):
                self._saw(f'Tensor.{_name}')
                return _orig(t, *a, **k)
            setattr(torch.Tensor, name, wrapped)
        return super().__enter__()
    def __exit__(self, *exc):
        for name, orig in self._orig.items(): setattr(torch.Tensor, name, orig)
        self._orig = {}
        return super().__exit__(*exc)

class Syncs:
    """The host syncs of each training step of `learn` after the first `skip`: `steps`, a list of lists of what
    synced (CUDA's sync debug mode with `cuda`, else `HostReads`). The window opens once the batch is on the device
    (after the `Learner` moves it, before `before_batch`) and closes at `stop()` (`StopSyncs`, after every
    `after_batch`)"""
    def __init__(self, learn, cuda:bool, skip:int=2):
        self.learn, self.cuda, self.skip, self.steps, self.n, self._on = learn, cuda, skip, [], 0, None
        split = learn._split_batch
        def split_then_start(b):
            split(b)
            self.start()
        learn._split_batch = split_then_start
    def start(self):
        if not self.learn.training: return
        self.n += 1
        if self.n <= self.skip: return
        if self.cuda:
            self._on = warnings.catch_warnings(record=True)
            self._rec = self._on.__enter__()
            warnings.simplefilter('always')
            torch.cuda.set_sync_debug_mode('warn')
        else:
            self._on = HostReads(); self._on.__enter__()
    def stop(self):
        if self._on is None: return
        if self.cuda:
            torch.cuda.set_sync_debug_mode(0)
            self._on.__exit__(None, None, None)
            self.steps.append([f'{w.filename}:{w.lineno}' for w in self._rec if is_sync_warning(w)])
        else:
            self._on.__exit__(None, None, None)
            self.steps.append(self._on.seen)
        self._on = None

class StopSyncs(Callback):
    "Ends `Syncs`' window after every other callback's `after_batch`"
    order, syncs = 10**6, None
    def after_batch(self): self.syncs.stop()
    def after_cancel_batch(self): self.syncs.stop()
