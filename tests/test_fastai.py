"""fastai's own Learner under distrib.fastai, against fastai alone: tests/scripts/fastai_job.py runs fastai cases on
2 and 3 processes with a batch of B per rank (`from distrib.fastai import *`, `with learn.distrib_ctx():`), and each
test runs the same case with fastai alone, in this process, with the global batch W*B, and compares weights
(<= 1e-5), what fastai reports (`recorder.values`, `validate`, <= 1e-6) and `get_preds` (every validation item once,
in order). Skipped where fastai is not installed: .ci/run makes a virtual environment with it (.venv-fastai)."""
import importlib.util, json, re, subprocess, sys, time
from pathlib import Path
import pytest, torch
pytest.importorskip('fastai', reason="fastai is not installed (pip install -e '.[fastai]')")
from conftest import launch, report, SCRIPTS

_spec = importlib.util.spec_from_file_location('fastai_job', SCRIPTS/'fastai_job.py')
job = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(job)
sys.modules.setdefault('fastai_job', job)   # what the job's export pickled refers to it by that name

EXACT = ['fit', 'sgd', 'one_cycle', 'flat_cos', 'fine_tune', 'bf16', 'grad_acc', 'trackers']
_runs = {}

def ran(nproc:int, names:tuple, tmp_path_factory)->dict:
    "What rank 0 wrote after running cases `names` on `nproc` processes (one job per set of cases, run once)"
    key = (nproc, names)
    if key not in _runs:
        out = tmp_path_factory.mktemp('fastai')/'out.json'
        r = launch(SCRIPTS/'fastai_job.py', out, *names, nproc=nproc, timeout=240)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
        _runs[key] = json.loads(out.read_text())
    return _runs[key]

def diff(a, b)->float:
    a, b = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item() if a.numel() else 0.

def compare(name:str, ours:dict, nproc:int, ref:dict|None=None)->dict:
    "Case `name` of the job against fastai alone with the global batch (or `ref`): the largest differences"
    ref = job.run_case(name, job.B*nproc) if ref is None else ref
    d = {'weights': diff(ours['weights'], ref['weights']), 'values': diff(ours['values'], ref['values'])}
    if 'preds' in ref:
        d.update(preds=diff(ours['preds'], ref['preds']), losses=diff(ours['losses'], ref['losses']),
                 validate=diff(ours['validate'], ref['validate']))
        n = (nproc*job.B//2 if name.startswith('text_lm') else job.N_TEXT_VALID if name.startswith('text') else
             job.N_VALID)
        assert ours['targs'] == ref['targs'] and len(ours['targs']) == n   # every item (an LM's: stream) once, in order
    print(f"\n{nproc} processes, {name}: " + ', '.join(f"{k} {v:.1e}" for k, v in d.items()))
    assert ours['rank_spread'] == 0                                     # every rank holds the same weights
    return d

@pytest.mark.parametrize('name', EXACT)
def test_as_one_process_2(name, tmp_path_factory):
    "2 ranks x B train and report as fastai alone in one process with 2B"
    ours = ran(2, tuple(EXACT), tmp_path_factory)[name]
    d = compare(name, ours, 2)   # the same epochs recorded: `trackers` stops where one process stops
    assert d['weights'] <= 1e-5 and all(v <= 1e-6 for k, v in d.items() if k != 'weights'), d
    if name == 'trackers': assert len(ours['values']) < 7, "EarlyStoppingCallback did not stop the fit: a void check"

@pytest.mark.parametrize('name', ['one_cycle', 'fine_tune'])
def test_as_one_process_3(name, tmp_path_factory):
    "3 ranks x B as one process with 3B (the validation set, 37 items, splits 13/12/12)"
    d = compare(name, ran(3, ('one_cycle', 'fine_tune'), tmp_path_factory)[name], 3)
    assert d['weights'] <= 1e-5 and all(v <= 1e-6 for k, v in d.items() if k != 'weights'), d

@pytest.mark.parametrize('name', ['ignore', 'ignore_acc'])
def test_items_alike_over_ranks(name, tmp_path_factory):
    """Targets with -100 (CrossEntropyLossFlat(ignore_index=-100)), a different number on each rank at most steps:
    2 ranks x B train as one process with 2B, every item of a global batch weighing alike (distrib.fastai.ItemMean),
    without and with GradientAccumulation: without, the count travels with DDP's all-reduce of the gradients (no
    all-reduce of its own); with it, one all-reduce of the count per micro-batch. What fastai reports of the losses
    is each rank's batch mean weighed by its batch size (fastai's own, not a mean over items): only the weights are
    compared"""
    ours = ran(2, ('ignore', 'ignore_acc'), tmp_path_factory)[name]
    ref = job.run_case(name, 2*job.B)
    d = diff(ours['weights'], ref['weights'])
    print(f"\n2 processes, {name}: weights {d:.1e}, the count's own all-reduces {ours['count_all_reduces']}")
    assert ours['rank_spread'] == 0 and d <= 1e-5, d
    assert (ours['count_all_reduces'] == 0) == (name == 'ignore'), ours['count_all_reduces']

@pytest.mark.parametrize('name', ['add_loss', 'add_loss_acc'])
def test_loss_additions_weighed_as_one_process(name, tmp_path_factory):
    """Callbacks that add to `loss_grad` after the loss function (as fastai's RNNRegularizer does), one of an order
    above ItemMean's (20) and one below (1): 2 ranks x B train and report as one process with 2B, the count travelling
    with the gradients (`add_loss`) or in an all-reduce of its own (`add_loss_acc`, under GradientAccumulation): the
    additions are weighed as one process weighs them"""
    d = compare(name, ran(2, ('add_loss', 'add_loss_acc'), tmp_path_factory)[name], 2)
    assert d['weights'] <= 1e-5 and all(v <= 1e-6 for k, v in d.items() if k != 'weights'), d

SIZES = tuple(job.SIZES)

@pytest.mark.parametrize('name', SIZES)
def test_any_size_as_one_process(name, tmp_path_factory):
    """A training set that is not a multiple of the global batch (101 items, 2 ranks x 8 against one process x 16,
    fit_one_cycle, drop_last=False; 17 items: rank 1 has nothing in the last step): every item trains once, the last
    global batch is one process's (7 rows on rank 0, 6 on rank 1; 1 and none), and the weights and what fastai reports
    are one process's: with CrossEntropyLossFlat, GradientAccumulation, ignored targets (the count travels with the
    gradients; what fastai reports of the loss is then a mean of the ranks' batch means weighed by rows: only the
    weights are compared) and a loss that is a batch mean (LabelSmoothingCrossEntropyFlat: weighed by rows)"""
    ours = ran(2, SIZES, tmp_path_factory)[name]
    d = compare(name, ours, 2)
    exact = {k: v for k, v in d.items() if k == 'weights' or not name.endswith('_ignore')}
    assert d['weights'] <= 1e-5 and all(v <= 1e-6 for k, v in exact.items() if k != 'weights'), d

TEXT = ('text_clas', 'text_sorted')

def test_text_classifier_as_one_process(tmp_path_factory):
    """fastai's text_classifier_learner (a tiny AWD_LSTM, SortedDL loaders, no dropout, no shuffle, from the same
    starting weights, fastai's RNNRegularizer on: its terms are means over the padded length, every rank's batch padded
    to the global batch's) fine_tuned on 2 ranks x B as one process with 2B: weights, what fastai reports, get_preds
    (every item once, in order), and fastai's `predict` of one text (a test_dl of one item: rank 1 reads none)"""
    ours = ran(2, TEXT, tmp_path_factory)['text_clas']
    ref = job.run_case('text_clas', 2*job.B)
    d = compare('text_clas', ours, 2, ref)
    assert d['weights'] <= 1e-5 and all(v <= 1e-6 for k, v in d.items() if k != 'weights'), d
    assert ours['predict'][:2] == ref['predict'][:2] and diff(ours['predict'][2], ref['predict'][2]) <= 1e-6, \
        (ours['predict'], ref['predict'])

def test_text_batches_sorted(tmp_path_factory):
    """A shuffled SortedDL under distrib_ctx on 2 ranks: every training batch of every rank is sorted by length, the
    two ranks' batch k interleaved (rank r's row j at j*W + r) is one process's batch of 2B sorted as SortedDL sorts
    it (lengths non-increasing), fastai's SentenceEncoder feeds every chunk right (0 misfed), the epochs differ"""
    ours, W = ran(2, TEXT, tmp_path_factory)['text_sorted'], 2
    lens, misfed = ours['lens'], ours['misfed']
    assert misfed == [0]*W, misfed
    assert len({len(l) for l in lens}) == 1 and len(lens[0]) == 2*(job.N_TEXT_TRAIN//(W*job.B//2)), [len(l) for l in lens]
    glob = [[lens[j % W][k][j // W] for j in range(W*job.B//2)] for k in range(len(lens[0]))]
    for g in glob: assert g == sorted(g, reverse=True), g
    n = len(glob)//2
    assert glob[:n] != glob[n:], "the two epochs read their batches in the same order: a void check of the shuffle"
    print(f"\nglobal batches' lengths: {glob}")

LM = ('text_lm', 'text_lm_shuffle')

def test_language_model_as_one_process(tmp_path_factory):
    """fastai's language_model_learner (a tiny AWD_LSTM, LMDataLoader, RNNRegularizer on, no dropout, no shuffle)
    on 2 ranks x B/2 as one process with B: each rank reads its streams r, r+W, ... of one process's B-stream layout,
    continuous, the hidden state carried as one process carries it; fastai's `get_preds` on it (LMLearner's,
    concat_dim=1, reorder=False as fastai alone needs): every stream's predictions, targets and losses as one
    process's. Measured: weights 3.0e-8, recorder values 3.8e-6 (its perplexity, exp of the loss)"""
    ours = ran(2, LM, tmp_path_factory)['text_lm']
    ref = job.run_case('text_lm', 2*job.B)
    d = {k: diff(ours[k], ref[k]) for k in ('weights', 'values', 'validate', 'preds', 'losses')}
    print(f"\n2 processes, text_lm: " + ', '.join(f"{k} {v:.1e}" for k, v in d.items()))
    assert ours['rank_spread'] == 0 and d['weights'] <= 1e-6 and d['values'] <= 1e-5 and d['validate'] <= 1e-5, d
    assert ours['targs'] == ref['targs'] and len(ours['targs']) == 2*job.B//2, len(ours['targs'])   # the streams
    assert d['preds'] <= 1e-6 and d['losses'] <= 1e-6, d

@pytest.mark.parametrize('name', ['text_sorted', 'text_lm_shuffle'])
def test_text_shuffle_drawn_by_distrib(name, tmp_path_factory):
    """The shuffle of a loader that orders its items itself (SortedDL's length-sorted chunks, LMDataLoader's
    documents), drawn by distrib's rule: epoch e's order is the loader's own shuffle, at the global batch, with
    Python's and numpy's generators seeded seed + e (ShardedDL's seed, default 0) on every rank, whatever the world
    size. So 2 ranks x B train as one process with 2B reading a ShardedDL of one rank (the same rule): the same global
    batches (the ranks' first batch of each epoch, interleaved, is one process's), weights, what fastai reports; and
    the epochs' orders differ. The language model's values within its bound (perplexity, exp of the loss: 2.6e-6)"""
    import distrib.fastai  # noqa: the reference is the same case under distrib_ctx in one process (distrib's draws)
    ours, W = ran(2, TEXT if name == 'text_sorted' else LM, tmp_path_factory)[name], 2
    ref = job.run_case(name, 2*job.B)
    d, tol = compare(name, ours, 2, ref), (1e-6 if name == 'text_sorted' else 1e-5)
    assert d['weights'] <= 1e-5 and all(v <= tol for k, v in d.items() if k != 'weights'), d
    key = 'lens' if name == 'text_sorted' else 'first'
    glob = [[ours[key][j % W][e][j // W] for j in range(W*len(ours[key][0][e]))] for e in range(len(ref[key]))]
    assert glob == ref[key], (glob, ref[key])
    assert len(glob) > 1 and (glob[:len(glob)//2] != glob[len(glob)//2:] if key == 'lens' else glob[0] != glob[1]), \
        "the epochs read the same order: a void check of the shuffle"

@pytest.mark.parametrize('nproc', [2, 3])
def test_fastai_pipelines(nproc, tmp_path_factory):
    """fastai's DataLoaders stay fastai's under distrib_ctx: an item and a batch transform run on each rank's shard,
    `n_inp`, `decode_batch` and `show_batch(show=False)` undo them on that rank's items (checked in the job), and
    `get_preds(dl=dls.test_dl(items))` returns every item's prediction once, in order, as one process's; training
    (`fit_one_cycle`) and what fastai reports are one process's with the global batch"""
    ours = ran(nproc, ('tfms',), tmp_path_factory)['tfms']
    d = compare('tfms', ours, nproc)
    tp = diff(ours['test_preds'], ours['preds'])
    print(f"test_dl's predictions against the validation's: {tp:.1e}")
    assert d['weights'] <= 1e-5 and all(v <= 1e-6 for k, v in d.items() if k != 'weights'), d
    assert len(ours['test_preds']) == job.N_VALID and tp == 0

def test_lr_find(tmp_path_factory):
    "lr_find's curve and suggestion as one process's; every rank has the weights put back"
    ours, ref = ran(2, ('lr_find', 'save'), tmp_path_factory)['lr_find'], job.run_case('lr_find', 2*job.B)
    rel = abs(ours['valley'] - ref['valley'])/ref['valley']
    print(f"\nlr_find: valley rel {rel:.1e}, losses {diff(ours['losses'], ref['losses']):.1e}, "
          f"weights {diff(ours['weights'], ref['weights']):.1e}")
    assert rel <= 1e-5 and diff(ours['lrs'], ref['lrs']) <= 1e-12 and diff(ours['losses'], ref['losses']) <= 1e-6
    assert diff(ours['weights'], ref['weights']) <= 1e-6 and ours['rank_spread'] == 0

def test_save_and_export_once_on_rank0(tmp_path_factory):
    """SaveModelCallback, learn.save and learn.export under distrib_ctx: the files once (no temporary left), and the
    export is the plain Learner, which load_learner opens in this process (no process group) with the trained weights"""
    from fastai.learner import load_learner
    ours = ran(2, ('lr_find', 'save'), tmp_path_factory)['save']
    assert ours['files'] == ['export.pkl', 'models', 'models/final.pth', 'models/model.pth'], ours['files']
    learn = load_learner(ours['export'])
    assert type(learn.model) is torch.nn.Sequential
    w = torch.cat([p.detach().flatten() for p in learn.model.parameters()]).tolist()
    assert diff(w, ours['weights']) == 0

MIX = ('mixup', 'cutmix')

def mix_x_diff(ours:dict, ref:dict, nproc:int)->float:
    """The largest difference between each rank's mixed inputs (`ours['mix_x']`, by rank) and one process's global
    mix at that rank's positions i*W + r, at the recorded steps"""
    d = 0.
    for step, glob in ref['mix_x'][0].items():
        for r in range(nproc):
            d = max(d, diff(ours['mix_x'][r][step], torch.tensor(glob)[r::nproc].tolist()))
    return d

@pytest.mark.parametrize('nproc', [2, 3])
@pytest.mark.parametrize('name', MIX)
def test_mix_as_one_process(name, nproc, tmp_path_factory):
    """fastai's MixUp and CutMix (fit_one_cycle): W ranks x B train and report as the same script under distrib_ctx
    in one process with W*B, distrib.fastai's draws pairing items across ranks: each rank's mixed inputs are the
    global mix at its positions (its partners exchanged right), and the weights and recorder values follow"""
    import distrib.fastai  # noqa: the reference is the same case under distrib_ctx in one process (distrib's draws)
    ours = ran(nproc, MIX, tmp_path_factory)[name]
    ref = job.run_case(name, job.B*nproc)
    ref['mix_x'] = [ref['mix_x']]
    assert sorted(ref['mix_x'][0]) == sorted(ours['mix_x'][0]) == ['0', '1', '5', '7']
    dx = mix_x_diff(ours, ref, nproc)
    d = compare(name, ours, nproc, ref)
    print(f"mixed inputs {dx:.1e}")
    assert dx == 0, dx
    assert d['weights'] <= 1e-5 and all(v <= 1e-6 for k, v in d.items() if k != 'weights'), d

def test_mix_differs_from_per_rank_mixing(tmp_path_factory):
    """The check above can fail: 2 ranks' MixUp differs from one process's when each rank mixes within its own batch,
    as fastai's MixUp does on each rank (here: the one-process mix of each rank's batch alone)"""
    import distrib.fastai  # noqa
    ours, alone = ran(2, MIX, tmp_path_factory)['mixup'], job.run_case('mixup', job.B)   # one rank's batch of B
    assert mix_x_diff(ours, {'mix_x': [alone['mix_x']]}, 1) > 1e-2

def test_mix_shapes_differ_ends_the_job():
    """MixUp under distrib_ctx with rank 1's batch of another shape than rank 0's: the exchange's header says so, and
    the job ends with a ValueError naming both ranks (gloo would abort on a receive of another size; NCCL would wait)"""
    r = launch(SCRIPTS/'fastai_job.py', '/dev/null', 'mix_shapes', nproc=2, timeout=180)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and re.search(r"rank [01]'s batch differs in shape or dtype from rank [01]'s", out), \
        out[-4000:]

@pytest.mark.parametrize('nproc', [2, 3])
def test_cancel_on_one_rank_ends_the_job(nproc):
    "CancelFitException on rank 1 alone: the job ends within 30 s, naming rank 1; never a hang"
    t0 = time.time()
    r = launch(SCRIPTS/'fastai_job.py', '/dev/null', 'cancel_one', nproc=nproc, timeout=180)
    out = r.stdout + r.stderr
    at = re.search(r'^CANCEL rank 1 at ([\d.]+)', out, re.M)
    assert at, out[-4000:]
    secs = time.time() - float(at.group(1))
    report(f'fastai, CancelFitException on rank 1 of {nproc}', secs, 'the cancel')
    assert r.returncode != 0 and 'CancelFitException was raised on rank 1' in out, out[-4000:]
    assert secs <= 30, secs

def test_nan_on_one_rank_ends_the_job():
    """A NaN loss on rank 1 alone: fastai's TerminateOnNaNCallback raises CancelFitException there only, and the job
    ends within 30 s, naming rank 1; never a hang"""
    r = launch(SCRIPTS/'fastai_job.py', '/dev/null', 'nan_one', nproc=2, timeout=180)
    out = r.stdout + r.stderr
    at = re.search(r'^NAN rank 1 at ([\d.]+)', out, re.M)
    assert at, out[-4000:]
    secs = time.time() - float(at.group(1))
    report('fastai, TerminateOnNaNCallback on rank 1 of 2', secs, 'the NaN loss')
    assert r.returncode != 0 and 'CancelFitException was raised on rank 1' in out, out[-4000:]
    assert secs <= 30, secs

def test_cancel_on_every_rank_ends_the_fit():
    "CancelFitException on every rank at the same point: the fit ends on every rank, the job goes on"
    r = launch(SCRIPTS/'fastai_job.py', '/dev/null', 'cancel_all', nproc=2, timeout=180)
    assert r.returncode == 0 and (r.stdout + r.stderr).count('CASE cancel_all done') == 2, r.stderr[-4000:]

def test_torchrun(tmp_path):
    "The same script launched by torchrun in place of distrib.launch trains as one process with the global batch"
    out = tmp_path/'out.json'
    r = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2',
                        SCRIPTS/'fastai_job.py', out, 'one_cycle'], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-4000:]
    d = compare('one_cycle', json.loads(out.read_text())['one_cycle'], 2)
    assert d['weights'] <= 1e-5 and all(v <= 1e-6 for k, v in d.items() if k != 'weights'), d

def test_notebook_launch():
    "From a notebook: notebook_launch runs the case on 2 processes, as one process with the global batch"
    import distrib.fastai  # noqa: fastai's Learner gets distrib_ctx (the reference below is not under it)
    from distrib.launch.notebook import notebook_launch
    ours = notebook_launch(job.run_case, 'one_cycle', job.B, nprocs=2, timeout=150)
    ours['rank_spread'] = 0   # one rank's return value: the others' weights are checked by the launched tests
    d = compare('one_cycle', ours, 2)
    assert d['weights'] <= 1e-5 and all(v <= 1e-6 for k, v in d.items() if k != 'weights'), d

def run_ckpt(tmp_path, nproc:int, bs:int, case:str, d, mix:bool=False, fp16:bool=False, n:int|None=None)->dict:
    """Case `case` (`ckpt_stop`, `ckpt_resume`) on `nproc` x `bs`, its checkpoints in `d`, with MixUp if `mix`, with
    fastai's MixedPrecision and a GradScaler on the CPU if `fp16`, over `n` training items if given (`job.job_n`)"""
    out = tmp_path/f'{case}-{nproc}.json'
    env = {'FASTAI_JOB_BS': str(bs), 'FASTAI_JOB_CKPT': str(d), **({'FASTAI_JOB_MIX': '1'} if mix else {}),
           **({'FASTAI_JOB_FP16': '1'} if fp16 else {}), **({'FASTAI_JOB_N': str(n)} if n is not None else {})}
    r = launch(SCRIPTS/'fastai_job.py', out, case, nproc=nproc, timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return json.loads(out.read_text())[case]

def test_checkpoint_resumes_mid_epoch(tmp_path):
    """distrib's Checkpoint on fastai's Learner: fit_one_cycle on 2 processes x 6, stopped by SIGUSR1 on rank 1 alone
    in the middle of epoch 1 (every rank stops at the same step, with a checkpoint, `Preempted`), then the same line
    resumed on 2 processes x 6, on 3 x 4 and on 1 x 12 (the global batch kept): each ends as fastai alone in one
    process with 12, uninterrupted (weights <= 1e-5, recorder values, validate, get_preds <= 1e-6)"""
    import shutil
    def run(nproc, bs, case, d): return run_ckpt(tmp_path, nproc, bs, case, d)
    stop = run(2, 6, 'ckpt_stop', tmp_path/'stop')['preempted']
    print(f"\nstopped: {stop}")
    assert stop['code'] == 128 + 10 and stop['epoch'] == 1 and 0 < stop['batch'] < stop['n_iter'] == 8, stop
    ref = job.run_case('one_cycle', 12)
    for nproc, bs in ((2, 6), (3, 4), (1, 12)):
        d = tmp_path/f'resume{nproc}'
        shutil.copytree(tmp_path/'stop', d)
        ours = run(nproc, bs, 'ckpt_resume', d)
        assert ours['resumed_from'] == str(d/'checkpoints'/Path(stop['file']).name), ours['resumed_from']
        diffs = {k: diff(ours[k], ref[k]) for k in ('weights', 'values', 'preds', 'losses', 'validate')}
        print(f"resumed on {nproc} x {bs}: " + ', '.join(f"{k} {v:.1e}" for k, v in diffs.items()))
        assert ours['targs'] == ref['targs'] and ours['rank_spread'] == 0
        assert diffs['weights'] <= 1e-5 and all(v <= 1e-6 for k, v in diffs.items() if k != 'weights'), diffs

@pytest.mark.parametrize('n', (98, 101))
def test_checkpoint_resumes_mid_epoch_any_size(tmp_path, monkeypatch, n):
    """The same over `n` training items, which the global batch 12 does not divide: 9 steps per epoch on every world,
    the last global batch of 98 % 12 = 2 items (on 3 x 4: rank 2's share empty) or of 101 % 12 = 5 (on 3 x 4: 2, 2 and
    1 rows). Stopped on 2 x 6 mid-epoch, resumed on 3 x 4 and on 1 x 12: each ends as fastai alone in one process with
    12 over the same `n` items, uninterrupted"""
    import shutil
    stop = run_ckpt(tmp_path, 2, 6, 'ckpt_stop', tmp_path/'stop', n=n)['preempted']
    print(f"\n{n} items, stopped: {stop}")
    assert stop['code'] == 128 + 10 and stop['epoch'] == 1 and 0 < stop['batch'] < stop['n_iter'] == 9, stop
    monkeypatch.setenv('FASTAI_JOB_N', str(n))
    ref = job.run_case('one_cycle', 12)
    assert len(ref['values']) == 2 and ref['preds'], ref.keys()
    for nproc, bs in ((3, 4), (1, 12)):
        d = tmp_path/f'resume{nproc}'
        shutil.copytree(tmp_path/'stop', d)
        ours = run_ckpt(tmp_path, nproc, bs, 'ckpt_resume', d, n=n)
        assert ours['resumed_from'] == str(d/'checkpoints'/Path(stop['file']).name), ours['resumed_from']
        diffs = {k: diff(ours[k], ref[k]) for k in ('weights', 'values', 'preds', 'losses', 'validate')}
        print(f"{n} items, resumed on {nproc} x {bs}: " + ', '.join(f"{k} {v:.1e}" for k, v in diffs.items()))
        assert ours['targs'] == ref['targs'] and ours['rank_spread'] == 0
        assert diffs['weights'] <= 1e-5 and all(v <= 1e-6 for k, v in diffs.items() if k != 'weights'), diffs

def test_distributed_dl_named():
    "fastai.distributed's DistributedDL, named under `from distrib.fastai import *`, stops at once saying what to use"
    from distrib.fastai import DistributedDL
    with pytest.raises(NotImplementedError, match=r'learn.distrib_ctx\(\) shards .* ShardedDL\(dl, rank, world_size\)'):
        DistributedDL(job.data(8).train, rank=0, world_size=2)

def test_checkpoint_resumes_mixup_on_another_world(tmp_path):
    """fit_one_cycle with fastai's MixUp and distrib's Checkpoint on 2 processes x 6, stopped mid-epoch, resumed on
    3 x 4: MixUp's draws go on from fastai's restored `train_iter`, and the fit ends as the same script under
    distrib_ctx in one process with 12, uninterrupted"""
    import shutil, distrib.fastai  # noqa: the reference is under distrib_ctx in one process (distrib's draws)
    stop = run_ckpt(tmp_path, 2, 6, 'ckpt_stop', tmp_path/'stop', mix=True)['preempted']
    assert stop['epoch'] == 1 and 0 < stop['batch'] < stop['n_iter'], stop
    shutil.copytree(tmp_path/'stop', tmp_path/'resume')
    ours, ref = run_ckpt(tmp_path, 3, 4, 'ckpt_resume', tmp_path/'resume', mix=True), job.run_case('mixup', 12)
    diffs = {k: diff(ours[k], ref[k]) for k in ('weights', 'values', 'preds', 'losses', 'validate')}
    print(f"\nMixUp, stopped on 2 x 6, resumed on 3 x 4: " + ', '.join(f"{k} {v:.1e}" for k, v in diffs.items()))
    assert ours['resumed_from'] is not None and ours['rank_spread'] == 0
    assert diffs['weights'] <= 1e-5 and all(v <= 1e-6 for k, v in diffs.items() if k != 'weights'), diffs

def test_checkpoint_resumes_grad_scaler(tmp_path):
    """fastai's MixedPrecision with distrib's Checkpoint: its GradScaler's loss scale and growth count are saved and
    go on in the resumed fit (on 3 x 4 after a stop on 2 x 6). On the CPU, fastai's scaler (CUDA's) is disabled: the
    job puts an enabled CPU GradScaler in its place, growing every 3 steps, so the 16 steps of fit_one_cycle(2) end
    at 2**(10 + 16 // 3) with a growth count of 16 % 3, as the uninterrupted fit does (a fresh scaler at the resume
    would end at 2**11). The weights are fit_one_cycle's: the scale is a power of 2, unscaled exactly."""
    import shutil
    stop = run_ckpt(tmp_path, 2, 6, 'ckpt_stop', tmp_path/'stop', fp16=True)['preempted']
    assert stop['epoch'] == 1 and 0 < stop['batch'] < stop['n_iter'], stop
    shutil.copytree(tmp_path/'stop', tmp_path/'resume')
    ours = run_ckpt(tmp_path, 3, 4, 'ckpt_resume', tmp_path/'resume', fp16=True)
    print(f"\nGradScaler after the resumed fit: {ours['scaler']}")
    assert ours['resumed_from'] is not None and ours['rank_spread'] == 0
    assert ours['scaler']['scale'] == 2.**(10 + 16 // 3) and ours['scaler']['_growth_tracker'] == 16 % 3, ours['scaler']
    assert diff(ours['weights'], job.run_case('one_cycle', 12)['weights']) <= 1e-5

NBS = Path(__file__).resolve().parent.parent/'nbs'
FASTAI_NBS = sorted(NBS.glob('44*_fastai*.ipynb'))

@pytest.mark.parametrize('nb', FASTAI_NBS, ids=lambda p: p.stem)
def test_notebook_checks(nb):
    """Every code cell of distrib.fastai's notebooks, in order, in one namespace: the check cells below each
    definition, which `nbdev_test` skips (`#| notest`: its environment has no fastai), run here where fastai is"""
    assert len(FASTAI_NBS) >= 7, FASTAI_NBS
    ns = {'__name__': f'nbcheck_{nb.stem.replace(".", "_")}'}
    for k, cell in enumerate(json.loads(nb.read_text())['cells']):
        src = ''.join(cell['source'])
        if cell['cell_type'] != 'code' or re.search(r'#\|\s*(eval:\s*false|slow)', src): continue
        try: exec(compile(src, f'{nb.name}, cell {k}', 'exec'), ns)
        except Exception as e: raise AssertionError(f"{nb.name}, cell {k} raised {e!r}:\n{src}") from e

@pytest.mark.parametrize('victim', ['2', '2v'])
def test_survivors_go_on(tmp_path, victim):
    """fastai's own Learner under `python -m distrib.launch --on-failure continue`, 3 processes: rank 2 SIGKILLed
    before the backward of batch 5 of epoch 1, or (`2v`) in epoch 1's validation pass, which the survivors then do
    again (tests/scripts/fastai_survivors.py); the two survivors go on in their
    own processes, their next step within 10 s of the kill, every global step of the 3 epochs once on each, and end
    with the weights and `recorder.values` (the smoothed training loss, the validation loss and the five metrics) of
    fastai alone in one process with the global batch of 6 (1e-5)"""
    job = SCRIPTS/'fastai_survivors.py'
    ref = subprocess.run([sys.executable, str(job), str(tmp_path), 'ref'], capture_output=True, text=True, timeout=180,
                         cwd=SCRIPTS.parent.parent)
    assert ref.returncode == 0, ref.stderr[-3000:]
    r = launch(job, tmp_path, victim, nproc=3, launcher_args=('--on-failure', 'continue'), timeout=240)
    text = f"exit code {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    assert r.returncode == 0 and 'DONE world 2' in r.stdout, text
    at = 'the validation pass of epoch 1, again' if victim.endswith('v') else 'epoch 1 batch 5'
    line = re.search(rf'^distrib: lost rank 2 killed by SIGKILL; 2 survivor\(s\) go on .* from {at}.*$', r.stderr,
                     re.M)
    assert line, text
    killed = float(re.search(r'^KILL_AT (\S+)$', r.stdout, re.M)[1])
    for rank in (0, 1):
        steps = [(int(p), int(e), int(b), float(t)) for p, e, b, t in
                 re.findall(r'^STEP (\d+) (\d+) (\d+) (\S+)$', (tmp_path/f'steps{rank}.txt').read_text(), re.M)]
        assert len({p for p, *_ in steps}) == 1, (rank, 'another process', steps[:3])
        assert [(e, b) for _, e, b, _ in steps] == [(e, b) for e in range(3) for b in range(16)], (rank, steps)
        after = min(t for *_, t in steps if t > killed)
        assert after - killed <= 10, (rank, after - killed)
    got, want = torch.load(tmp_path/'weights.pt'), torch.load(tmp_path/'ref.pt')
    dw = max((got[k] - want[k]).abs().max().item() for k in want)
    vals, ref_vals = torch.load(tmp_path/'values.pt'), torch.load(tmp_path/'ref-values.pt')
    dv = max(abs(a - b) for va, vb in zip(vals, ref_vals) for a, b in zip(va, vb))   # the smoothed loss included
    assert dw <= 1e-5 and dv <= 1e-5, (dw, dv, vals, ref_vals)
    print(f"\nSURVIVORS fastai, {victim}: first step of a survivor {after - killed:.2f} s after the kill, "
          f"weights {dw:.1e}, recorder.values {dv:.1e} from one process; {line[0]}")
