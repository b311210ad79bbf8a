"""distrib_ctx(compile=...) under DDP and FSDP on two gloo processes. One script runs every check
(tests/scripts/compile.py, in the shared job; tiny models: compiling on CPU takes seconds per graph); each test
reads its lines."""
import pytest
from conftest import checked

@pytest.fixture(scope='module')
def out(together): return together('compile')

@pytest.mark.parametrize('strategy', ['ddp', 'fsdp'])
def test_compiled_equals_eager(out, strategy):
    "Compiled after wrapping (graphs were compiled), weights and recorded values within 1e-6 of eager"
    assert checked(out, f'compile_{strategy}_equals_eager'), out

@pytest.mark.parametrize('strategy', ['ddp', 'fsdp'])
def test_keys_without_orig_mod(out, strategy): assert checked(out, f'compile_{strategy}_keys'), out

def test_model_compiled_by_the_user(out): assert checked(out, 'compile_precompiled_model'), out

def test_bad_options(out):
    assert checked(out, 'compile_small_bucket_refused') and checked(out, 'compile_unknown_option'), out
