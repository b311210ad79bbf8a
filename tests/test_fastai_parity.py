"""distrib against fastai 2.8.12 on the same model, data, optimizer and batch order (tests/fastai_parity/cases.py):
fastai's numbers were recorded by tests/fastai_parity/record.py in a virtual environment of its own (fastai needs
fastcore 2.x; the file gives the versions), and each test runs the same fit in distrib, in this process, and
compares. One process: that W processes give what one gives is the job of the other tests."""
import importlib.util, json
from pathlib import Path
import pytest, torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from distrib import Learner, DataLoaders, accuracy, SaveModelCallback, EarlyStoppingCallback

HERE = Path(__file__).parent/'fastai_parity'
_spec = importlib.util.spec_from_file_location('fastai_parity_cases', HERE/'cases.py')
cases = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(cases)
RECORDED = json.loads((HERE/'fastai-2.8.12.json').read_text())

def run(name:str, path)->dict:
    "Case `name` in distrib: what record.py records in fastai"
    case = cases.CASES[name]
    (xt, yt), (xv, yv) = cases.data()
    dls = DataLoaders(DataLoader(TensorDataset(xt, yt), batch_size=cases.BS),
                      DataLoader(TensorDataset(xv, yv), batch_size=cases.BS))
    learn = Learner(dls, cases.model(), F.cross_entropy, opt_func=cases.OPTS[case['opt']], lr=case['lr'],
                    metrics=accuracy, path=path)
    learn.progress.enabled = False
    out = {}
    if case['run'] == 'one_cycle': learn.fit_one_cycle(case['n_epoch'], case['lr'])
    elif case['run'] == 'fit': learn.fit(case['n_epoch'], case['lr'])
    elif case['run'] == 'save_early':
        learn.fit(case['n_epoch'], case['lr'], cbs=[SaveModelCallback(), EarlyStoppingCallback(patience=1)])
    elif case['run'] == 'lr_find':
        out['valley'] = learn.lr_find(show_plot=False).valley
        out['n_lrs'] = len(learn.recorder.lrs)
    r = learn.recorder
    if case['run'] != 'lr_find':
        out['values'] = r.values
        out['smooth_loss_at_epoch_end'] = [r.losses[i - 1] for i in r.iters]
    out['weights'] = cases.flat(learn.model)
    return out

def max_diff(a, b)->float:
    a, b = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()

def test_recorded_with_fastai_2_8_12():
    "The recorded numbers are fastai 2.8.12's, with this repository's torch"
    v = RECORDED['versions']
    assert v['fastai'] == '2.8.12' and v['torch'].startswith('2.13.0'), v

@pytest.mark.parametrize('name, tol', [('one_cycle_sgd', 1e-6), ('adam', 1e-6)])
def test_training_as_fastai(name, tol, tmp_path):
    """The same weights and validation values as fastai to float32 round-off; the train_loss column differs:
    fastai's is the smoothed loss at the epoch's end, distrib's the epoch's mean; distrib's `recorder.losses`
    at the epoch's last step is fastai's column"""
    ours, theirs = run(name, tmp_path), RECORDED['cases'][name]
    weights = max_diff(ours['weights'], theirs['weights'])
    valid = max_diff([v[1:] for v in ours['values']], [v[1:] for v in theirs['values']])
    smooth = max_diff(ours['smooth_loss_at_epoch_end'], [v[0] for v in theirs['values']])
    mean_vs_smooth = max_diff([v[0] for v in ours['values']], [v[0] for v in theirs['values']])
    print(f"\n{name}: weights {weights:.1e}, valid values {valid:.1e}, smoothed train loss {smooth:.1e}; "
          f"train_loss columns differ by {mean_vs_smooth:.1e}")
    assert weights <= tol and valid <= tol and smooth <= tol
    assert mean_vs_smooth > 1e-3          # the columns are not the same statistic

def test_lr_find_as_fastai(tmp_path):
    "The same curve length and valley suggestion, and the weights put back"
    ours, theirs = run('lr_find', tmp_path), RECORDED['cases']['lr_find']
    rel = abs(ours['valley'] - theirs['valley'])/theirs['valley']
    print(f"\nlr_find: valley {ours['valley']:.6g} against {theirs['valley']:.6g} (rel {rel:.1e})")
    assert ours['n_lrs'] == theirs['n_lrs'] and rel <= 1e-6
    assert max_diff(ours['weights'], theirs['weights']) == 0

def test_save_model_early_stopping_as_fastai(tmp_path):
    "EarlyStopping stops after the same epoch; SaveModel loads the same best weights"
    ours, theirs = run('save_early', tmp_path), RECORDED['cases']['save_early']
    weights = max_diff(ours['weights'], theirs['weights'])
    print(f"\nsave_early: {len(ours['values'])} epochs (fastai {len(theirs['values'])}), weights {weights:.1e}")
    assert len(ours['values']) == len(theirs['values']) < cases.CASES['save_early']['n_epoch']
    assert weights <= 1e-6
