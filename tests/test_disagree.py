"""Bad set-ups fail on every rank at once with the same clear error, never hang: ranks that disagree before
training or would diverge silently (tests/scripts/disagree.py runs every case in one job)."""
import re
import pytest, torch
from conftest import launch, report, SCRIPTS

CASES = {  # case of disagree.py: (exception type, words of the message)
    'len_dl': ('RuntimeError', ['disagree', 'training batches per rank: rank 0: 4, rank 1: 3',
                                'dataset length of each loader: rank 0: [64, 16], rank 1: [48, 16]']),
    'split': ('RuntimeError', ['disagree on what fit will run', 'items of each loader (CRC32 of their indices or '
                               'names): rank 0: [', 'Seed your splitter: RandomSplitter(seed=...) or set_seed(...)',
                               'random_split(..., generator=torch.Generator().manual_seed(...))']),
    'params': ('RuntimeError', ['disagree on the model', 'parameter tensors: rank 0: 2, rank 1: 4']),
    'grown': ('RuntimeError', ['disagree', 'model parameter tensors: rank 0: 2, rank 1: 4', 'model parameter elements: rank 0: 4, rank 1: 10']),
    'epochs': ('RuntimeError', ['disagree', 'epochs (start_epoch, n_epoch): rank 0: [0, 1], rank 1: [0, 2]']),
    'callback': ('RuntimeError', ['disagree', "rank 1: ['AllReduceEachEpoch', 'DistributedTrainer'", 'local_only = True']),
    'local_only': ('OK', []),
    'tiny': ('ValueError', ['training set has 1 sample, fewer than the 2 ranks', '--nproc_per_node 1']),
    'nested': ('RuntimeError', ['nested twice']),
    'lr': ('RuntimeError', ['disagree', 'optimizer: rank 0: SGD [{', 'lr=0.01,', 'lr=0.02,']),
    'opt': ('RuntimeError', ['disagree', 'optimizer: rank 0: SGD [{', 'rank 1: Adam [{']),
    'loss': ('RuntimeError', ['disagree', 'loss function: rank 0: torch.nn.functional.mse_loss, rank 1: '
                              'torch.nn.functional.l1_loss']),
    'shuffle': ('RuntimeError', ['disagree', '(shuffle, seed, drop_last, pad) of each loader: rank 0: [(True, 0, '
                                 'False, False), (False, 0, False, False)], rank 1: [(False, 0, False, False)']),
    'dtype': ('RuntimeError', ['disagree on the model', 'parameter dtypes: rank 0: float32 x2, rank 1: float64 x2']),
    'valid_len': ('RuntimeError', ['disagree on the loader to evaluate', 'dataset length: rank 0: 16, rank 1: 12']),
    'preds_len': ('RuntimeError', ['disagree on the loader to evaluate', 'dataset length: rank 0: 16, rank 1: 12']),
    'cancel_all': ('OK', []),
    'long_phase': ('OK', []),  # rank 0 alive in rank0_first or a long_phase past the timeout: not a stall  # a cancel raised on every rank at the same points is taken, not refused
    'cuda': ('RuntimeError', ['torch.cuda.is_available() is False']),
}

def test_bad_setups_fail_on_every_rank():
    """Ranks that disagree before training (len(dl), parameters, epochs, a callback on one rank only) or would
    diverge silently (a learning rate, optimizer, loss function, shuffle or parameter dtype of their own;
    validate/get_preds on loaders of different lengths), a training set smaller than the world, distrib_ctx
    nested, a CUDA device without a GPU, a random split drawn on each rank (the fix, a seed, named); and a cancel on every rank, or rank 0 alive in a declared long phase past
    the timeout, which are no faults: each raises the same clear error on both ranks at the start, in one job
    that goes on to the next case (so none of them hung, and none aborted the process)"""
    cases = {k: v for k, v in CASES.items() if k != 'cuda' or not torch.cuda.is_available()}  # 'cuda': no GPU here
    r = launch(SCRIPTS/'disagree.py', *cases, nproc=2, timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    for case, (etype, words) in cases.items():
        lines = re.findall(rf'^CASE {case} rank (\d) ([\d.]+)s (.*)$', r.stdout, re.M)
        assert sorted(l[0] for l in lines) == ['0', '1'], (case, r.stdout)
        assert lines[0][2] == lines[1][2] or case == 'params', (case, lines)  # DDP's own message names the rank
        secs = max(float(l[1]) for l in lines)
        report(f'bad set-up {case!r}', secs, since='the case began, on both ranks')
        assert secs < 30
        for _, _, res in lines:
            assert res.startswith(etype), (case, res)
            for w in words: assert w in res, (case, w, res)

def test_batch_size_below_one():
    from torch.utils.data import TensorDataset
    from distrib import DistributedDL
    for bs in (0, -1):
        with pytest.raises(ValueError, match=f'Invalid batch_size {bs}'): DistributedDL(TensorDataset(torch.arange(4)), batch_size=bs, rank=0, world_size=2)
