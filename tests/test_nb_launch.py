"notebook_launch: rank 0's result comes back; a worker's fault is re-raised in the caller, naming the rank, quickly"
import os, time
import pytest, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from distrib import notebook_launch, Learner, DataLoaders, Callback, rank_distrib, num_distrib, pg_initialized

def place():
    "Where this worker is: (rank, world size, MASTER_ADDR) from the process group and the environment"
    import distrib
    distrib.setup_distrib(timeout=30)
    try: return rank_distrib(), num_distrib(), os.environ['MASTER_ADDR'], torch.get_num_threads()
    finally: distrib.teardown_distrib()

class Boom(Callback):
    def before_batch(self):
        if rank_distrib() == 1 and self.learn.iter == 3:
            print(f"FAULT_AT {time.time()}", flush=True)
            raise ValueError('bad batch on purpose')

def fit_with_fault():
    x = torch.randn(800, 3); y = x.sum(1, keepdim=True)
    dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=4), DataLoader(TensorDataset(x, y), batch_size=8))
    learn = Learner(dls, nn.Linear(3, 1), nn.functional.mse_loss)
    learn.progress.enabled = False
    with learn.distrib_ctx(timeout=60): learn.fit(2, cbs=Boom())

def test_returns_rank0_result_fork():
    test = notebook_launch(place, nprocs=3, timeout=120, start_method='fork')
    assert test == (0, 3, '127.0.0.1', 1)  # rank 0 of 3; forked workers compute on one thread
    assert not pg_initialized()  # the caller has no process group of its own

def test_spawn_importable_fn():
    rank, world, addr, threads = notebook_launch(place, nprocs=2, timeout=120, start_method='spawn')
    assert (rank, world, addr) == (0, 2, '127.0.0.1') and threads == max(1, (os.cpu_count() or 1) // 2)

def test_fault_in_fit_reraised_with_rank(capfd):
    "Rank 1 raises in fit while rank 0 waits in the all-reduce: the caller gets rank 1's ValueError, not rank 0's peer error"
    start = time.time()
    with pytest.raises(ValueError, match='bad batch on purpose') as info:
        notebook_launch(fit_with_fault, nprocs=2, timeout=120)
    end = time.time()
    assert 'rank 1 of 2' in info.value.__notes__[0] and 'in before_batch' in str(info.value.__cause__)
    fault_at = float(capfd.readouterr().out.split('FAULT_AT ')[1].split()[0])
    print(f"\nFAULT-TIME notebook_launch, rank 1 raises in before_batch: ended {end - fault_at:.1f} s after the fault")
    assert end - start < 60 and end - fault_at < 30

def reset_on_rank0():
    "Rank 0's own ConnectionResetError (a download, say) while rank 1 waits for it in a barrier"
    import distrib
    distrib.setup_distrib(timeout=30)
    if rank_distrib() == 0:
        time.sleep(0.5)
        raise ConnectionResetError(104, 'Connection reset by peer')
    distrib.distrib_barrier()

def test_own_connection_reset_is_the_cause():
    "The caller gets rank 0's ConnectionResetError, its own, not rank 1's report of a peer that went away"
    start = time.time()
    with pytest.raises(ConnectionResetError) as info: notebook_launch(reset_on_rank0, nprocs=2, timeout=120)
    assert 'rank 0 of 2' in info.value.__notes__[0]
    assert time.time() - start < 60

class Branchy(nn.Module):
    "A linear model with a branch that rank 1's batches skip from batch 3 on (`skip`): DDP raises on rank 1 only"
    skip = False
    def __init__(self):
        super().__init__()
        self.lin, self.branch = nn.Linear(3, 1), nn.Linear(3, 1)
    def forward(self, x): return self.lin(x) if Branchy.skip else self.lin(x) + self.branch(x)

class SkipBranch(Callback):
    def before_batch(self):
        if self.learn.training and self.learn.iter == 3 and rank_distrib() == 1:
            print(f"FAULT_AT {time.time()}", flush=True)
            Branchy.skip = True

def caught_then_gather():
    "DDP's one-rank error caught outside distrib_ctx, then a gather_object, as a sweep or retry loop would"
    x = torch.randn(800, 3); y = x.sum(1, keepdim=True)
    dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=4), DataLoader(TensorDataset(x, y), batch_size=8))
    learn = Learner(dls, Branchy(), nn.functional.mse_loss)
    learn.progress.enabled = False
    try:
        with learn.distrib_ctx(timeout=60): learn.fit(1, cbs=SkipBranch())
    except RuntimeError: pass
    from distrib import gather_object
    return gather_object(rank_distrib())

def test_caught_one_rank_error_deadlock_ends_in_seconds(capfd):
    """Under notebook_launch as under distrib.launch: rank 1 catches DDP's error and goes on to gather_object while
    rank 0 waits in the gradient all-reduce (collective timeout 60 s); rank 0's watchdog finds the deadlock and names
    rank 1 as its cause, within seconds: the caller gets rank 1's own exception, DDP's error with distrib's hint"""
    with pytest.raises(RuntimeError, match="Expected to have finished reduction(.|\n)*Pass find_unused_parameters=True "
                       "to learn.distrib_ctx") as e:
        notebook_launch(caught_then_gather, nprocs=2, timeout=120, start_method='fork')
    assert 'Raised in worker rank 1 of 2 (notebook_launch)' in e.value.__notes__, e.value.__notes__
    end = time.time()
    fault = float(capfd.readouterr().out.split('FAULT_AT ')[1].split()[0])
    assert end - fault < 15, end - fault

def collective_and_env():
    "An all-reduce through distrib (which writes an at-record where DISTRIB_AT_DIR names a directory); the variable"
    import distrib
    distrib.setup_distrib(timeout=30)
    try:
        distrib.all_reduce_sum(torch.ones(1))
        return os.environ.get('DISTRIB_AT_DIR')
    finally: distrib.teardown_distrib()

def test_inside_a_launched_worker_writes_no_at_record(tmp_path, monkeypatch):
    """notebook_launch called in a distrib.launch worker (DISTRIB_AT_DIR set): its own workers are not the launcher's
    ranks, so they write no at-record there (they would overwrite the outer ranks' of the same numbers)"""
    monkeypatch.setenv('DISTRIB_AT_DIR', str(tmp_path))
    assert notebook_launch(collective_and_env, nprocs=2, timeout=120, start_method='fork') is None
    assert os.listdir(tmp_path) == []
    assert os.environ['DISTRIB_AT_DIR'] == str(tmp_path)  # the caller's own environment is left as it was
