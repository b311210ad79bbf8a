"""Schedules, lr_find, EarlyStopping, TerminateOnNaN, the loggers and GradientClip over two gloo processes, each
against the same run in one process with the global batch. One script runs every check
(tests/scripts/callbacks.py, in the shared job); each test reads its lines."""
import importlib.util
import pytest
from conftest import checked

@pytest.fixture(scope='module')
def out(together): return together('callbacks')

def test_one_cycle_under_ddp(out):
    "fit_one_cycle: weights and recorder values of one process with the global batch; fastai's lr curve, per step"
    for name in ['one_cycle_weights', 'one_cycle_lrs', 'one_cycle_values', 'flat_cos']: assert checked(out, name), out

def test_schedule_steps_per_optimizer_step(out):
    "With GradientAccumulation one value per optimizer step; a step the float16 scaler skips still counts"
    assert checked(out, 'one_cycle_accumulate') and checked(out, 'schedule_counts_skipped_steps'), out

def test_lr_find_under_ddp(out):
    "Same curve, stop and suggestions on every rank, equal to one process's; model and optimizer restored"
    for name in ['lr_find_same_on_ranks', 'lr_find_one_process', 'lr_find_restores']: assert checked(out, name), out

def test_gradient_clip_under_ddp(out):
    "The global gradient clipped once per step: after DDP's all-reduce, the window's end, the scaler's unscaling"
    for name in ['clip_weights', 'clip_accumulate', 'clip_fp16_after_unscale']: assert checked(out, name), out

def test_early_stopping_under_ddp(out):
    assert checked(out, 'early_stopping'), out

def test_nan_on_one_rank_stops_every_rank(out):
    "A NaN loss on rank 1 only, in training or in validation: both ranks stop at the same batch, the job goes on"
    assert checked(out, 'nan_one_rank_train') and checked(out, 'nan_one_rank_valid'), out

def test_csv_logger_rank0(out):
    assert checked(out, 'csv_logger') and checked(out, 'loggers_on_rank0_only'), out

@pytest.mark.skipif(importlib.util.find_spec('tensorboard') is None, reason='tensorboard is not installed')
def test_tensorboard_rank0(out):
    assert checked(out, 'tensorboard'), out

@pytest.mark.skipif(importlib.util.find_spec('matplotlib') is None, reason='matplotlib is not installed')
def test_lr_find_plots_on_rank0(out):
    assert checked(out, 'lr_find_plot_rank0'), out
