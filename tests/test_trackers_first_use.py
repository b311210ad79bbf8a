"""The experiment trackers on first use, in one process: `MLflowCallback()` with MLflow's default store, the error
that says what to install when the store needs SQLAlchemy, `WandbCallback` inside a run the script started, each
epoch logged once after a resume from a checkpoint written in the middle of an epoch, and a second `fit`'s position
(what a failure report names) its own, not the first's."""
import sys, types
import pytest, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from distrib import Learner, DataLoaders, Checkpoint, Callback

def new_learner(path, cbs=None):
    torch.manual_seed(0)
    x = torch.randn(32, 3); y = x.sum(1, keepdim=True)
    dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=8), DataLoader(TensorDataset(x, y), batch_size=8))
    learn = Learner(dls, nn.Linear(3, 1), nn.functional.mse_loss, opt_func=torch.optim.SGD, lr=0.1, cbs=cbs,
                    path=path)   # 4 steps an epoch
    learn.progress.enabled = False
    return learn

class Crash(Callback):
    "Raise at optimizer step `at` (counting from 1), as a job killed there"
    def __init__(self, at): self.at, self.n = at, 0
    def after_step(self):
        self.n += 1
        if self.n == self.at: raise RuntimeError('killed')

def crash_then_resume(path, tracker):
    """A job of 3 epochs killed at step 10 (epoch 2) whose last checkpoint is at step 6 (epoch 1, after which the
    tracker logged epoch 1), then the job again, resuming from step 6"""
    learn = new_learner(path, cbs=[tracker(), Checkpoint('ck', every_n_steps=6, every_epoch=False)])
    learn.add_cb(Crash(10))
    with pytest.raises(RuntimeError, match='killed'): learn.fit(3)
    learn = new_learner(path, cbs=[tracker(), Checkpoint('ck', every_n_steps=6, every_epoch=False)])
    learn.fit(3)
    assert learn.checkpoint.resumed_from.name == 'step-6.pth'
    return learn

@pytest.fixture
def mlflow_home(tmp_path, monkeypatch):
    pytest.importorskip('sqlalchemy'); pytest.importorskip('alembic')
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv('MLFLOW_TRACKING_URI', raising=False)
    return tmp_path

def test_mlflow_default_store_first_use(mlflow_home):
    "MLflowCallback() records a run in MLflow's default store (sqlite:///mlflow.db) and says so in one line"
    from distrib import MLflowCallback
    lines = []
    learn = new_learner(mlflow_home, cbs=MLflowCallback())
    learn.logger = lines.append
    learn.fit(2)
    cb = learn.m_lflow
    said = [l for l in lines if l.startswith('MLflowCallback:')]
    assert cb.uri.startswith('sqlite:///') and (mlflow_home/'mlflow.db').exists(), cb.uri
    assert said == [f"MLflowCallback: started run {cb.run_id} of experiment 'distrib' in {cb.uri}"], lines
    run = cb.client.get_run(cb.run_id)
    hist = sorted((m.step, m.value) for m in cb.client.get_metric_history(cb.run_id, 'epoch'))
    assert run.info.status == 'FINISHED' and hist == [(4, 0), (8, 1)], (run.info.status, hist)

def test_mlflow_database_store_says_what_to_install(tmp_path, monkeypatch):
    "Without SQLAlchemy, a database store is refused at creation, with the extra to install"
    pytest.importorskip('mlflow')
    from distrib import MLflowCallback
    monkeypatch.setitem(sys.modules, 'sqlalchemy', None)   # as mlflow-skinny alone
    with pytest.raises(ImportError, match=r"pip install 'distrib\[mlflow\]'"):
        MLflowCallback(f'sqlite:///{tmp_path}/mlflow.db')

def test_mlflow_resumed_mid_epoch_logs_each_epoch_once(mlflow_home):
    from distrib import MLflowCallback
    learn = crash_then_resume(mlflow_home, MLflowCallback)
    c, rid = learn.m_lflow.client, learn.m_lflow.run_id
    epochs = sorted(m.step for m in c.get_metric_history(rid, 'epoch'))
    steps = sorted(m.step for m in c.get_metric_history(rid, 'raw_loss'))
    assert len(c.search_runs([c.get_experiment_by_name('distrib').experiment_id])) == 1
    assert epochs == [4, 8, 12] and steps == list(range(1, 13)), (epochs, steps)

@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    wandb = pytest.importorskip('wandb')
    monkeypatch.chdir(tmp_path)   # W&B's run directories
    monkeypatch.setenv('WANDB_MODE', 'offline'); monkeypatch.setenv('WANDB_SILENT', 'true')
    for k in ('CACHE', 'DATA', 'CONFIG'): monkeypatch.setenv(f'WANDB_{k}_DIR', str(tmp_path/f'wandb-{k.lower()}'))
    yield wandb
    if wandb.run is not None: wandb.run.finish()

def test_wandb_logs_into_the_scripts_run(tmp_path, wandb_offline):
    "After the script's wandb.init(), WandbCallback logs into that run, after its steps, and leaves it open"
    from distrib import WandbCallback, offline_history
    wandb = wandb_offline
    run = wandb.init(project='first-use', dir=str(tmp_path))
    run.log({'before': 1.})                       # step 0, the script's
    learn = new_learner(tmp_path, cbs=WandbCallback())
    learn.fit(2)
    assert wandb.run is run and learn.wandb.run is None   # still the script's, not finished by the callback
    run.log({'after': 2.})
    run.finish()
    wandb.teardown()     # W&B's service writes the run's file after finish() returns; teardown waits for it
    dirs = sorted((tmp_path/'wandb').glob('offline-run-*'))
    rows = offline_history(dirs[0])['history']
    assert len(dirs) == 1, dirs
    steps = [r['_step'] for r in rows if 'raw_loss' in r]
    assert steps == list(range(1, 9)) and [r['_step'] for r in rows if 'epoch' in r] == [4, 8], rows
    assert [r['_step'] for r in rows if 'before' in r] == [0] and [r['_step'] for r in rows if 'after' in r] == [9]
    assert offline_history(dirs[0])['config']['n_epoch'] == 2

class FakeRun:
    "A W&B run as `wandb.init(resume='allow')` returns it for a run holding steps up to `step` (W&B's `run.step`)"
    def __init__(self, step): self.id, self.step, self.rows, self.config = 'r1', step, [], types.SimpleNamespace()
    def log(self, row, step, commit=None): self.rows.append((step, row))
    def finish(self, exit_code=0): pass

def test_wandb_resumed_run_skips_the_steps_it_holds(tmp_path, wandb_offline):
    """Resumed from a checkpoint at step 6, in a run that holds steps up to 8 (W&B's `run.step` of a resumed run;
    W&B offline cannot resume, hence a run object standing for one): steps 9 to 12 are logged, epoch 2 once"""
    from distrib import WandbCallback
    learn = new_learner(tmp_path, cbs=[WandbCallback(), Checkpoint('ck', every_n_steps=6, every_epoch=False)])
    learn.add_cb(Crash(7))
    with pytest.raises(RuntimeError, match='killed'): learn.fit(3)    # the checkpoint at step 6
    cb = WandbCallback()
    run = FakeRun(step=9)
    cb.wandb = types.SimpleNamespace(run=None, init=lambda **kw: run)
    learn = new_learner(tmp_path, cbs=[cb, Checkpoint('ck', every_n_steps=6, every_epoch=False)])
    learn.fit(3)
    assert [s for s, _ in run.rows] == [9, 10, 11, 12] and [r['epoch'] for _, r in run.rows if 'epoch' in r] == [2]

def test_second_fit_reports_its_own_position(tmp_path):
    "During a second fit's before_fit, the position a failure report names is the new fit's, not the first's last"
    from distrib.runtime.position import track, position, describe
    seen = []
    class Where(Callback):
        def before_fit(self): seen.append(describe(position()))
    learn = new_learner(tmp_path)
    track(learn)
    try:
        learn.fit(3)
        learn.fit(1, cbs=Where())
    finally: track(None)
    assert seen == ['before_fit (epoch 0)'], seen
