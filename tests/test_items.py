"""Losses over items (issue 33) on 2 gloo processes (3 with -m slow) against one process with the global batch: a
masked sequence model whose ranks count different numbers of tokens at every step. One script runs every case
(tests/scripts/items.py, in the shared jobs); each test reads its lines."""
import json, re
import pytest
from conftest import checked

W3 = pytest.param(3, marks=pytest.mark.slow)   # CI runs it (-m slow)

@pytest.fixture(scope='module')
def out(together): return together('items')

@pytest.fixture(scope='module', params=[2, W3])
def outw(request):
    "The script's output on 2 processes, and on 3 (the main cases)"
    return request.getfixturevalue({2: 'together', 3: 'together3'}[request.param])('items')

def test_mean_loss_differs(out):
    "The batch-mean loss (each rank's own token mean): weights and values differ from one process (the issue)"
    for name in ['mean_loss_ddp', 'mean_loss_one_process_accumulate', 'mean_loss_accumulate']:
        assert checked(out, name), out

@pytest.mark.parametrize('case', ['ddp_sum_count', 'ddp_cross_entropy_loss', 'fsdp'])
def test_same_as_one_process(outw, case):
    "W ranks x 8 against 1 x 8W: weights <= 1e-5, recorder.values and the per-step smoothed losses <= 1e-6"
    assert checked(outw, 'reference_token_means') and checked(outw, case), outw

def test_one_all_reduce_per_step(outw):
    """The count's all-reduces: one per optimizer step for a (sum, count) loss (before_backward), and in the last
    micro-batch's before_backward when accumulating; none for nn.CrossEntropyLoss in a whole step (the count travels
    with the gradients, in DDP's hook `sum_over_items`), nor for a batch-mean loss"""
    assert checked(outw, 'one_all_reduce_per_step') and checked(outw, 'accumulate_single_auto_sync_all_reduces'), outw

def test_validate(outw):
    "validate(): the token means over the whole validation set (loss, and a (sum, count) metric)"
    assert checked(outw, 'ddp_validate'), outw

@pytest.mark.parametrize('strategy', ['single_auto_sync', 'multi_auto_sync', 'forced_sync'])
def test_accumulate(out, strategy):
    "2 ranks x 4, GradientAccumulation(16) against 1 x 16; the step losses against 1 x 8 with the same accumulation"
    assert checked(out, 'one_process_accumulate') and checked(out, f'accumulate_{strategy}'), out
    assert checked(out, f'accumulate_{strategy}_step_losses'), out

def test_fsdp_accumulate(outw): assert checked(outw, 'fsdp_accumulate'), outw

def test_plain_classifier_unchanged(outw):
    "nn.CrossEntropyLoss on a classifier (nothing ignored) trains and reports as F.cross_entropy, to float rounding"
    for name in ['classifier', 'classifier_item_loss', 'classifier_accumulate', 'classifier_accumulate_item_loss']:
        assert checked(outw, name), outw

def test_clip_and_mixed_precision(out):
    "GradientClip after the rescaling; float16's GradScaler exact (no step skipped); bfloat16 within its rounding"
    for name in ['clip_accumulate', 'fp16_scaler_accumulate', 'fp16_scaler_steps', 'bf16']:
        assert checked(out, name), out

def test_lr_find(out): assert checked(out, 'lr_find'), out

def test_checkpoint_resume(out):
    "Resumed mid-epoch (accumulating): bit for bit the uninterrupted run, and one process's weights and values"
    assert checked(out, 'checkpoint_resume_exact') and checked(out, 'checkpoint_resume'), out

def test_figures(outw):
    "The figures of the Exactness page's table (nbs/35_exactness.ipynb)"
    m = re.search(r'^ITEMS (\{.*\})', outw, re.M)
    assert m, outw
    print(json.loads(m.group(1)))

@pytest.mark.parametrize('case', ['known_equal', 'known_equal_accumulate', 'ignored_target', 'class_weights',
                                  'callback_before_item_mean'])
def test_known_equal_counts(outw, case):
    """Issue 39: a classifier's nn.CrossEntropyLoss() over a TensorDataset without an ignored target sums no count
    (no all-reduce in any batch), with and without accumulation; an ignored target, class weights or a callback that
    could change the targets before ItemMean: an ignored target or class weights, the count travels with the gradients
    (DDP's hook `sum_over_items`), no all-reduce of its own; a callback before ItemMean, one all-reduce of the count
    per step. Each against one process with the
    global batch (weights <= 1e-5, recorder.values <= 1e-6)"""
    assert checked(outw, case) and checked(outw, f'{case}_all_reduces'), outw

@pytest.mark.parametrize('config, count_on, want', [
    ('cpu:gloo,cuda:nccl', 'cuda', 'cuda'),   # distrib's default: a CUDA count goes to NCCL, no copy to the host
    ('cpu:gloo,cuda:nccl', 'cpu', 'cpu'),     # a CPU count (CPU training) to gloo
    ('cuda:nccl', 'cuda', 'cuda'),            # NCCL alone
    ('cuda:nccl', 'cpu', 'cuda'),             # a CPU count under NCCL alone: copied to the group's device
    ('cpu:gloo,cuda:gloo', 'cuda', 'cuda')])  # gloo for both: the group's own choice for CUDA tensors
def test_count_reduced_on_its_device(monkeypatch, config, count_on, want):
    """Issue 39: the device the step's count is all-reduced on, with CUDA's answers substituted (the group's backend
    configuration, its current device): never the CPU for a CUDA count when the group has a backend for CUDA"""
    import torch
    from distrib import losses as L
    from distrib.runtime import group as G, collectives as CO
    monkeypatch.setattr(G.dist, 'get_backend_config', lambda group=None: config)
    monkeypatch.setattr(torch.cuda, 'current_device', lambda: 0)
    assert L._sum_device(torch.device(count_on, 0) if count_on == 'cuda' else torch.device('cpu')).type == want
