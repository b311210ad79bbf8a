"""Run the cases of cases.py in fastai and print what they give, as JSON: per case the Recorder's values per epoch
(fastai's `train_loss` column is the smoothed loss at the epoch's end), the final weights, the epochs run, and
lr_find's valley suggestion; with the versions used. Run in a virtual environment with fastai (outside this
repository; it needs fastcore 2.x, which the development tools' pin excludes):

    python3.11 -m venv /work/venvs/fastai && . /work/venvs/fastai/bin/activate
    pip install torch==2.13.0 && pip install fastai==2.8.12 torch==2.13.0
    python tests/fastai_parity/record.py > tests/fastai_parity/fastai-2.8.12.json
"""
import contextlib, json, platform, sys, tempfile
from functools import partial
from pathlib import Path
import torch
from torch.nn import functional as F
import fastai, fastcore
from fastai.data.core import DataLoaders
from fastai.data.load import DataLoader
from fastai.learner import Learner
from fastai.metrics import accuracy
from fastai.optimizer import OptimWrapper
import fastai.callback.schedule   # noqa: F401 (adds fit_one_cycle and lr_find to Learner)
from fastai.callback.tracker import SaveModelCallback, EarlyStoppingCallback
sys.path.insert(0, str(Path(__file__).parent))
from cases import CASES, OPTS, BS, data, model, flat

def run(case:dict, path)->dict:
    (xt, yt), (xv, yv) = data()
    dls = DataLoaders(DataLoader(list(zip(xt, yt)), bs=BS, shuffle=False, drop_last=False),
                      DataLoader(list(zip(xv, yv)), bs=BS, shuffle=False, drop_last=False))
    learn = Learner(dls, model(), loss_func=F.cross_entropy, metrics=accuracy, path=path, lr=case['lr'],
                    opt_func=partial(OptimWrapper, opt=OPTS[case['opt']]))
    out = {}
    with learn.no_bar(), learn.no_logging():
        if case['run'] == 'one_cycle': learn.fit_one_cycle(case['n_epoch'], case['lr'])
        elif case['run'] == 'fit': learn.fit(case['n_epoch'], case['lr'])
        elif case['run'] == 'save_early':
            learn.fit(case['n_epoch'], case['lr'], cbs=[SaveModelCallback(), EarlyStoppingCallback(patience=1)])
        elif case['run'] == 'lr_find':
            out['valley'] = float(learn.lr_find(show_plot=False).valley)
            out['n_lrs'] = len(learn.recorder.lrs)
    if case['run'] != 'lr_find':
        out['values'] = [[float(v) for v in vals] for vals in learn.recorder.values]
        out['smooth_loss_at_epoch_end'] = [float(learn.recorder.losses[i - 1]) for i in learn.recorder.iters]
    out['weights'] = flat(learn.model)
    return out

with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(sys.stderr):   # fastai's messages: not the JSON
    results = {name: run(case, d) for name, case in CASES.items()}
print(json.dumps({'made_by': 'tests/fastai_parity/record.py', 'versions': {
    'fastai': fastai.__version__, 'fastcore': fastcore.__version__, 'torch': torch.__version__,
    'python': platform.python_version()}, 'cases': results}, indent=1))
