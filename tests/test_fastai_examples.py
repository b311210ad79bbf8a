"""fastai's example scripts (the fastai repository's nbs/examples) as their users run them, under distrib.fastai:
tests/scripts/examples/ holds our adaptations of `distrib.py` (as fastai_distrib.py), `train_imagenette.py`,
`train_tabular.py`, `train_imdbclassifier.py` and `train_wt2.py`, each with fastai's calls and flow, its data set
replaced by generated data of the same layout (tests/scripts/examples/example_data.py), a smaller model and
`from distrib.fastai import *`. Each runs on 2 processes with a batch of B per rank, and alone in one process with
the global batch 2B. Their models have BatchNorm (vision, tabular) or dropout and random augmentation, whose draws
and statistics are each rank's on CPU (SyncBatchNorm needs CUDA), so the weights are not compared; what is: the
metrics and losses the 2-process run reported (`recorder.values`, `validate`, `get_preds`, every validation item
once in order) against one process's recomputation from the 2-process run's weights, the number of training steps
against one process's with 2B, and the BatchNorm warning, once per job. Skipped where fastai or torchvision is
missing (.ci/run's .venv-fastai has both)."""
import json, os, re, subprocess, sys, time
import pytest, torch
pytest.importorskip('fastai', reason="fastai is not installed (pip install -e '.[fastai]')")
pytest.importorskip('torchvision', reason="fastai.vision needs torchvision (.ci/run installs torchvision==0.29.1)")
from conftest import launch, SCRIPTS, ROOT

EX = SCRIPTS/'examples'
B = 8
# the warning, not the source line Python prints under it
BN_WARNING = r"UserWarning: \d+ BatchNorm layer\(s\) normalise with each rank's own batch statistics"

@pytest.fixture(scope='module')
def data(tmp_path_factory):
    "The generated data sets, shared by the module's runs (written once, by the first run's rank 0)"
    return tmp_path_factory.mktemp('example-data')

def _env(data, out, **more)->dict:
    return {'EXAMPLE_DATA': str(data), 'EXAMPLE_OUT': str(out), 'PYTHONPATH': str(ROOT), **more}

def on_two(script:str, data, out, *args, bs:int=B)->tuple:
    "Run `script` on 2 processes x `bs`: (its result.json, its output, seconds)"
    t = time.time()
    r = launch(EX/script, *args, nproc=2, timeout=400, env=_env(data, out, EXAMPLE_BS=str(bs)))
    secs, text = time.time() - t, r.stdout + r.stderr
    assert r.returncode == 0, text[-6000:]
    return json.loads((out/'result.json').read_text()), text, secs

def alone(script:str, data, out, *args, recompute=None, bs:int=2*B)->dict:
    """Run `script` as one process (no launcher) with the global batch `bs`; with `recompute` (a model.pth), it also
    reports `validate()` and `get_preds()` of those weights"""
    drop = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'TORCHELASTIC_RUN_ID')
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(_env(data, out, EXAMPLE_BS=str(bs), **({'EXAMPLE_RECOMPUTE': str(recompute)} if recompute else {})))
    r = subprocess.run([sys.executable, EX/script, *args], env=env, capture_output=True, text=True, timeout=400,
                       cwd=ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    return json.loads((out/'result.json').read_text())

def diff(a, b)->float:
    a, b = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item() if a.numel() else 0.

def check(name:str, script:str, data, tmp_path, args2=(), args1=(), bn:bool=True, preds:bool=True)->dict:
    """`script` on 2 processes against one process with the global batch, which recomputes the 2-process run's
    metrics and predictions from its weights; returns the differences"""
    ours, out, secs = on_two(script, data, tmp_path/'two', *args2)
    one = alone(script, data, tmp_path/'one', *args1, recompute=tmp_path/'two'/'model.pth')
    rec = one['recomputed']
    d = {'validate': diff(ours['validate'], rec['validate']), 'preds': diff(ours['preds'], rec['preds']),
         'last epoch': diff(ours['values'][-1][1:], rec['validate'])}
    print(f"\n{name}: 2 processes x {B} in {secs:.0f} s; against one process's recomputation from its weights: "
          + ', '.join(f"{k} {v:.1e}" for k, v in d.items())
          + f"; {ours['train_iter']} training steps (one process x {2*B}: {one['train_iter']})")
    assert ours['world'] == 2 and one['world'] == 1
    assert ours['targs'] == rec['targs'] == one['targs'] and (len(ours['targs']) > 0) == preds   # all, in order
    assert ours['train_iter'] == one['train_iter'], (ours['train_iter'], one['train_iter'])   # the global batch
    assert all(v <= 1e-5 for v in d.values()), d
    warned = len(re.findall(BN_WARNING, out))
    assert warned == (1 if bn else 0), warned   # once per job, on rank 0
    return d

def test_distrib(data, tmp_path):
    "distrib.py: xresnet, to_fp16, MixUp, fit_flat_cos under distrib_ctx(), the data fetched under rank0_first"
    check('distrib.py', 'fastai_distrib.py', data, tmp_path)

def test_train_imagenette(data, tmp_path):
    """train_imagenette.py with fastai's older API: gpu = setup_distrib(gpu), torch.cuda.set_device(gpu) when it is
    not None, learn.to_distributed(gpu) when num_distrib() > 1, ranger, LabelSmoothingCrossEntropy, MixUp, two runs
    (two Learners: the BatchNorm warning still once)"""
    check('train_imagenette.py', 'train_imagenette.py', data, tmp_path,
          ('--bs', str(B), '--mixup', '0.2', '--runs', '2'), ('--bs', str(2*B), '--mixup', '0.2'))

def test_train_tabular(data, tmp_path):
    "train_tabular.py, its split seeded (--seed): tabular_learner, partial(learn.distrib_ctx, gpu)(), fit_one_cycle"
    check('train_tabular.py', 'train_tabular.py', data, tmp_path, ('--bs', str(B), '--seed', '42'),
          ('--bs', str(2*B), '--seed', '42'))

def test_train_tabular_unseeded_split_ends_the_job(data, tmp_path):
    """train_tabular.py as fastai ships it: no seed, so each rank's RandomSplitter draws its own split. The job ends
    before training, on every rank, naming the fix, quickly (no hang, no training on two splits)"""
    t = time.time()
    r = launch(EX/'train_tabular.py', '--bs', str(B), nproc=2, timeout=300, env=_env(data, tmp_path/'out'))
    secs, out = time.time() - t, r.stdout + r.stderr
    print(f"\nunseeded split: the job ended in {secs:.1f} s (imports and the data included), rc {r.returncode}")
    assert r.returncode != 0, out[-4000:]
    assert 'items of each loader (CRC32 of their indices or names)' in out, out[-4000:]
    assert 'Seed your splitter: RandomSplitter(seed=...) or set_seed(...) before building the DataLoaders' in out
    assert not (tmp_path/'out'/'result.json').exists()   # it did not train

def test_train_imdbclassifier(data, tmp_path):
    "train_imdbclassifier.py: TextDataLoaders.from_folder, text_classifier_learner under rank0_first, fine_tune"
    check('train_imdbclassifier.py', 'train_imdbclassifier.py', data, tmp_path, ('--bs', str(B), '--epochs', '1'),
          ('--bs', str(2*B), '--epochs', '1'), bn=True)   # the classifier's head has BatchNorm1d: warned once

def test_train_wt2(data, tmp_path):
    """train_wt2.py: LMDataLoader, get_language_model(AWD_LSTM), rnn_cbs, fit_one_cycle under distrib_ctx (without
    get_preds, which fails on this plain Learner in one process too)"""
    check('train_wt2.py', 'train_wt2.py', data, tmp_path, ('--bs', str(B), '--epochs', '2'),
          ('--bs', str(2*B), '--epochs', '2'), bn=False, preds=False)
