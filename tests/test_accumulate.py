"""GradientAccumulation and MixedPrecision over two gloo processes. One script runs every check
(tests/scripts/accumulate.py, in the shared job); each test reads its lines."""
import pytest
from conftest import checked

@pytest.fixture(scope='module')
def out(together): return together('accumulate')

@pytest.mark.parametrize('strategy', ['single_auto_sync', 'multi_auto_sync', 'forced_sync'])
def test_strategy_matches_one_process_full_batch(out, strategy):
    "Weights equal (rtol 1e-5) to one process with batches of n_acc"
    assert checked(out, f'{strategy}_weights'), out

@pytest.mark.parametrize('strategy', ['single_auto_sync', 'multi_auto_sync', 'forced_sync'])
def test_strategy_allreduce_count(out, strategy):
    "single: one DDP all-reduce per optimizer step; multi: one per micro-batch; forced: none (its own all-reduce)"
    assert checked(out, f'{strategy}_allreduces'), out

def test_default_strategy(out):
    assert checked(out, 'default_single') and checked(out, 'default_find_unused_multi'), out
    assert checked(out, 'default_static_graph_multi') and checked(out, 'static_graph_refuses_no_sync'), out

def test_n_acc_not_a_multiple(out):
    assert checked(out, 'overshoot_mean'), out

def test_mixed_precision_under_ddp(out):
    assert checked(out, 'bf16_ddp') and checked(out, 'bf16_ddp_accumulate'), out
    for s in ['single_auto_sync', 'multi_auto_sync', 'forced_sync']: assert checked(out, f'fp16_scaler_ddp_{s}'), out
