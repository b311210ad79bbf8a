"""The Recorder's per-step records, fastai's plots and the experiment trackers (W&B offline, MLflow's file store) over
two gloo processes; one script runs every check (tests/scripts/trackers.py, in the shared job); each test reads
its lines."""
import pytest
from conftest import checked

@pytest.fixture(scope='module')
def out(together): return together('trackers')

def test_recorder_steps_under_ddp(out):
    "Each step's loss is the global batch's (one process with batches of 12), smoothed as fastai's, on both ranks"
    assert checked(out, 'recorder_steps_global_batch'), out

def test_plots_rank0_only(out):
    "plot_loss, plot_sched and plot_metrics draw on rank 0 only; plot_loss's figure is written as a PNG"
    assert checked(out, 'plots_rank0_only'), out

def test_wandb_one_run_continued_after_restart(out):
    "One W&B offline run id for the job, every step and epoch once, the config, the model artifact after a resume"
    assert checked(out, 'wandb_one_run_resumed'), out

def test_mlflow_one_run_continued_after_restart(out):
    "One MLflow run in the experiment, every epoch's metrics at its step, finished, the model file as an artifact"
    assert checked(out, 'mlflow_one_run_resumed'), out

def test_trackers_imported_lazily(out):
    "Importing distrib (and its WandbCallback, MLflowCallback) imports neither wandb nor mlflow"
    assert checked(out, 'trackers_imported_lazily'), out

def test_trackers_rank0_writes(out):
    "Rank 0 alone opens the runs; both runs' ids are those of the first job"
    assert checked(out, 'trackers_rank0_writes'), out
