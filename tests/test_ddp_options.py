"""DDP options, communication hooks, the find_unused_parameters hint and RNN reset() under distrib_ctx, over two gloo
processes. One script runs every check (tests/scripts/ddp_options.py, in the shared job); each test reads its lines."""
import pytest
from conftest import checked

@pytest.fixture(scope='module')
def out(together): return together('ddp_options')

def test_options_reach_ddp(out):
    for name in ['ddp_options', 'ddp_static_graph', 'ddp_unknown_option']: assert checked(out, name), out

def test_comm_hooks(out):
    "fp16 rounds the averaged gradients to fp16, powersgd makes them low-rank after start_powerSGD_iter; bf16 needs NCCL"
    for name in ['comm_hook_fp16', 'comm_hook_powersgd', 'comm_hook_unknown']: assert checked(out, name), out
    assert checked(out, 'comm_hook_bf16') or checked(out, 'comm_hook_bf16_needs_nccl'), out

def test_find_unused_parameters_hint(out):
    assert checked(out, 'find_unused_hint') and checked(out, 'find_unused_fixed'), out

def test_rnn_reset_reaches_wrapped_module(out):
    assert checked(out, 'rnn_reset'), out
