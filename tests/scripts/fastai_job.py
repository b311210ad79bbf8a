"""fastai's own Learner under distrib.fastai: `python -m distrib.launch --nproc_per_node W fastai_job.py OUT CASE...`
runs each case on W processes with a per-rank batch of `B` and rank 0 writes what fastai reports to OUT (JSON);
tests/test_fastai.py runs the same cases with fastai alone, in one process, with the global batch W*B, and compares.
`mixup` and `cutmix` (fastai's MixUp and CutMix, which distrib.fastai makes draw by its rule: the reference is then
the same case under distrib_ctx in one process; rank 0 writes every rank's mixed inputs at a few steps),
`mix_shapes` (rank 1's batch wider at MixUp: the exchange raises),
`cancel_one` (rank 1 alone raises CancelFitException), `cancel_all` and `nan_one` (a NaN loss on rank 1 alone, under
fastai's TerminateOnNaNCallback) are cases too; `ckpt_stop` (fit_one_cycle
with distrib's Checkpoint, stopped by SIGUSR1 on rank 1 in the middle of epoch 1) and `ckpt_resume` (the same line,
resumed) write and read the checkpoints in $FASTAI_JOB_CKPT, with a per-rank batch of $FASTAI_JOB_BS (default B),
and fastai's MixUp when $FASTAI_JOB_MIX is set (its reference is then `mixup`), fastai's MixedPrecision (`to_fp16`)
with an enabled GradScaler on the CPU when $FASTAI_JOB_FP16 is set. $FASTAI_JOB_N, when set, is the training set's size
of every case that has no size of its own (`SIZES`): `data`'s `n_train` (no drop_last; default: `N_TRAIN`, drop_last).
Imported by the test for `run_case`, with fastai and no distrib context."""
import json, sys, time
from functools import partial
import torch
from torch import nn
from fastai.learner import Learner
from fastai.data.core import DataLoaders, Datasets, TfmdDL
from fastai.torch_core import TensorBase
from fasttransform import Transform   # fastai 2.8: fastcore.transform moved there
from fastai.losses import CrossEntropyLossFlat, LabelSmoothingCrossEntropyFlat
from fastai.metrics import accuracy, error_rate, top_k_accuracy, F1Score, AccumMetric
from fastai.optimizer import OptimWrapper
from fastai.callback.core import Callback, CancelFitException
from fastai.callback.training import GradientAccumulation
from fastai.callback.mixup import MixUp, CutMix
from fastai.callback.tracker import TerminateOnNaNCallback, EarlyStoppingCallback, ReduceLROnPlateau
from fastai.callback.fp16 import MixedPrecision
from fastai.callback.schedule import *  # noqa: fit_one_cycle, fit_flat_cos, fine_tune, lr_find on fastai's Learner
from fastai.data.block import DataBlock, CategoryBlock
from fastai.data.transforms import IndexSplitter
from fastai.metrics import Perplexity
from fastai.text.data import TextBlock
from fastai.text.learner import text_classifier_learner, language_model_learner
from fastai.text.models.awdlstm import AWD_LSTM, awd_lstm_lm_config, WeightDropout

B, N_TRAIN, N_VALID, N_IN, N_OUT = 8, 96, 37, 8, 3

_g = torch.Generator().manual_seed(0)
X = torch.randn(N_TRAIN + N_VALID, N_IN, generator=_g)
Y = (X[:, :3].sum(1) > 0).long() + (X[:, 3] > 1).long()
Y_IGN = Y.masked_fill(X[:, 4] > 0.3, -100)   # ~38% of the targets ignored, unevenly between ranks' halves
def get_x(i): return X[i]
def get_y(i): return Y[i]
def get_y_ign(i): return Y_IGN[i]
X_IMG = torch.randn(N_TRAIN + N_VALID, 2, 5, 6, generator=_g)   # images for CutMix: 2 channels, 5 x 6 pixels
Y_IMG = (X_IMG[:, 0, :3].mean((1, 2)) > 0).long() + (X_IMG[:, 1, 2:, 3:].mean((1, 2)) > .2).long()
def get_x_img(i): return X_IMG[i]
def get_y_img(i): return Y_IMG[i]

def _texts(n:int, seed:int=0)->list:
    """`n` generated texts of a 12-word vocabulary, of 3 to 33 words (so of 1 to 5 chunks of `SEQ`), with a label:
    whether 'cat' and 'dog' make more than a sixth of the words"""
    import random
    g, words, out = random.Random(seed), 'the cat dog sat ran on a mat log big small red'.split(), []
    for _ in range(n):
        ws = [g.choice(words) for _ in range(g.choice([3, 5, 7, 9, 12, 15, 20, 26, 33]))]
        out.append((' '.join(ws), int(ws.count('cat') + ws.count('dog') > len(ws)//6)))
    return out
SEQ, N_TEXT_TRAIN, N_TEXT_VALID = 8, 56, 17
DRAWN = ('text_sorted', 'text_lm_shuffle')   # shuffled by distrib's rule: the reference follows it in one process
TEXTS = _texts(N_TEXT_TRAIN + N_TEXT_VALID)
def text_x(i): return TEXTS[i][0]
def text_y(i): return TEXTS[i][1]
def text_tok(s): return s.split()   # a tokenizer that needs no download: the words

def text_dls(bs:int, lm:bool=False, shuffle:bool=False):
    """fastai's text DataLoaders of the generated texts (`TextBlock`, a `SortedDL` per split; `lm`: `LMDataLoader`s of
    the texts as a corpus), the training loader shuffled when `shuffle`"""
    blk = TextBlock(text_tok, min_freq=1, seq_len=SEQ, is_lm=lm)
    db = DataBlock(blocks=(blk,) if lm else (blk, CategoryBlock), get_x=text_x, get_y=None if lm else text_y,
                   splitter=IndexSplitter(list(range(N_TEXT_TRAIN, N_TEXT_TRAIN + N_TEXT_VALID))))
    return db.dataloaders(list(range(N_TEXT_TRAIN + N_TEXT_VALID)), bs=bs, num_workers=0, shuffle=shuffle, seq_len=SEQ)

def text_learner(bs:int, lm:bool=False, shuffle:bool=False):
    """fastai's `text_classifier_learner` (or `language_model_learner` when `lm`) over `text_dls(bs//2)`, a tiny AWD_LSTM,
    no pretrained weights, no dropout, fastai's RNNRegularizer on (its defaults, alpha 2, beta 1: its terms are means
    over the batch's padded length, which distrib pads every rank's batch to: the global batch's); the classifier's
    BatchNorm layers are `nn.Identity` (torch's SyncBatchNorm does not run on the CPU: with them each rank would
    normalise by its own rows)"""
    dls, cfg = text_dls(bs//2, lm, shuffle), dict(emb_sz=8, n_hid=10, n_layers=2)   # half: more batches
    torch.manual_seed(0)
    if lm:
        learn = language_model_learner(dls, AWD_LSTM, config=dict(awd_lstm_lm_config, **cfg), pretrained=False,
                                       drop_mult=0., metrics=[accuracy, Perplexity()])
    else:
        learn = text_classifier_learner(dls, AWD_LSTM, seq_len=SEQ, config=cfg, pretrained=False, drop_mult=0.,
                                        lin_ftrs=[6], ps=[0.], metrics=accuracy)
        for lbd in learn.model[1].layers: lbd[0] = nn.Identity()
    for m in learn.model.modules():
        if isinstance(m, WeightDropout): m._setweights = partial(_no_weight_dropout, m)
    learn.remove_cb(learn.progress)
    return learn

def _no_weight_dropout(wd):
    """fastai's `WeightDropout._setweights` without dropout: the weights cloned, as it does in eval mode (fastai
    2.8.12's, at p=0 in training under torch 2.14, hands the LSTM `F.dropout`'s input, its Parameter, which the LSTM
    then registers, and the next `reset` fails: `cannot assign 'torch.FloatTensor' as parameter 'weight_hh_l0'`)"""
    for layer in wd.layer_names: setattr(wd.module, layer, getattr(wd, f'{layer}_raw').clone())

class RecordText(Callback):
    """At each training batch, the number of words of each row (`lens`, by batch) and whether fastai's
    SentenceEncoder feeds it right (`misfed`: the rows with a word at the start of a chunk of `SEQ` are not the
    first ones, so that rows[:real_bs] feeds padding for some and skips others)"""
    run_valid = False
    def __init__(self): self.lens, self.misfed = [], 0
    def before_batch(self):
        x = self.xb[0]
        self.lens.append((x != 1).sum(1).tolist())
        for i in range(0, x.shape[1], SEQ):
            has = x[:, i] != 1
            self.misfed += int(not has[:int(has.sum())].all())

class SetEpoch(Callback):
    "Before each epoch's training pass, `set_epoch(epoch)` on the training loader (what distrib_ctx does)"
    def before_train(self): self.learn.dls.train.set_epoch(self.epoch)

class RecordFirst(Callback):
    "The first 3 tokens of each row of each epoch's first training batch (`first`, by epoch)"
    run_valid = False
    def __init__(self): self.first = []
    def before_batch(self):
        if self.iter == 0: self.first.append(self.xb[0][:, :3].tolist())

class TensorIn(TensorBase): "The inputs' type, so that the batch transform leaves the targets alone"

class Scale(Transform):
    "An item transform with its decode: the inputs times 2"
    def encodes(self, x:torch.Tensor): return TensorIn(x*2)
    def decodes(self, x:TensorIn): return x/2

class Shift(Transform):
    "A batch transform (`after_batch`) with its decode: the inputs plus 0.5"
    def encodes(self, x:TensorIn): return x + 0.5
    def decodes(self, x:TensorIn): return x - 0.5

def data_tfms(bs:int):
    """`data(bs)` through fastai's pipelines: an item transform (`Scale`) and a batch transform (`Shift`), both with
    their decodes (the case `tfms`)"""
    dss = [Datasets(list(range(a, b)), tfms=[[get_x, Scale()], [get_y]])
           for a, b in ((0, N_TRAIN), (N_TRAIN, N_TRAIN + N_VALID))]
    kw = dict(shuffle=False, num_workers=0, after_batch=[Shift()])
    return DataLoaders(TfmdDL(dss[0], bs=bs, drop_last=True, **kw), TfmdDL(dss[1], bs=bs, **kw))

def dls_api(learn)->dict:
    """fastai's DataLoaders API on `learn.dls` (each rank's shards under distrib_ctx): `n_inp`, `decode_batch` and
    `show_batch(show=False)` undo both transforms (this rank's first validation item is item `N_TRAIN + rank`),
    `test_dl` over the validation items gives, through `get_preds`, every item's prediction once, in order"""
    dv, r = learn.dls.valid, _rank() if _world() > 1 else 0
    b = dv.one_batch()
    x0 = dv.decode_batch(b)[0][0]
    shown = learn.dls.train.show_batch(show=False, max_n=3)
    assert learn.dls.n_inp == 1 and len(b) == 2 and isinstance(b[0], TensorIn), (learn.dls.n_inp, type(b[0]))
    assert torch.allclose(b[0][0], X[N_TRAIN + r]*2 + 0.5), "the transforms did not run on this rank's item"
    assert torch.allclose(x0, X[N_TRAIN + r]), f"decode_batch: {x0} is not item {N_TRAIN + r}'s input"
    assert torch.allclose(shown[2][0][0], X[r]), "show_batch's decoded first item is not this rank's first"
    preds, targs = learn.get_preds(dl=learn.dls.test_dl(list(range(N_TRAIN, N_TRAIN + N_VALID))))
    assert targs is None and len(preds) == N_VALID, (targs, len(preds))
    return dict(test_preds=preds.tolist())

def data(bs:int, ignore:bool=False, image:bool=False, n_train:int|None=None):
    """fastai DataLoaders of a fixed synthetic 3-class problem: the training loader in order, with drop_last;
    `ignore`: some targets are -100 (ignored by the loss, as a language model's padding); `image`: 2 x 5 x 6 inputs;
    `n_train`: items 1 to `n_train` train (up to 132: some are then validation items too; not item 0, whose target
    `ignore` ignores: the padding of an epoch, which repeats its first items, would train it twice unseen), without
    drop_last"""
    x, y = (get_x_img, get_y_img) if image else (get_x, get_y_ign if ignore else get_y)
    dss = [Datasets(list(range(a, b)), tfms=[[x], [y]])
           for a, b in ((0, N_TRAIN) if n_train is None else (1, n_train + 1), (N_TRAIN, N_TRAIN + N_VALID))]
    kw = dict(shuffle=False, num_workers=0)   # fastai's default forks a worker per CPU at each pass: 0.7 s per epoch
    return DataLoaders(TfmdDL(dss[0], bs=bs, drop_last=n_train is None, **kw), TfmdDL(dss[1], bs=bs, **kw))

def _mean_acc(p, t): return (p.argmax(-1) == t).float().mean()

def splitter(m): return [list(m[0].parameters()), list(m[2].parameters())]

SIZES = {'size101': 101, 'size101_acc': 101, 'size101_ignore': 101, 'size101_ls': 101, 'size17': 17}

def learner(bs:int, opt:str='adam', ignore:bool=False, image:bool=False, tfms:bool=False,
            n_train:int|None=None, loss_func=None)->Learner:
    """The same model (seeded), loss, metrics and optimizer on every rank and in the reference; `ignore`: targets
    with -100, `CrossEntropyLossFlat(ignore_index=-100)`; `image`: the images' data and a model that flattens them;
    `tfms`: the data through fastai's item and batch transforms (`data_tfms`); `n_train`: `data`'s; `loss_func`:
    in place of `CrossEntropyLossFlat(ignore_index=-100)`"""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(N_IN, 16), nn.ReLU(), nn.Linear(16, N_OUT))
    kw = dict(opt_func=partial(OptimWrapper, opt=torch.optim.SGD)) if opt == 'sgd' else {}
    if image: model = nn.Sequential(nn.Flatten(), nn.Linear(X_IMG[0].numel(), 16), nn.ReLU(), nn.Linear(16, N_OUT))
    else: kw['splitter'] = splitter
    dls = data_tfms(bs) if tfms else data(bs, ignore, image, n_train)
    learn = Learner(dls, model, loss_func=loss_func or CrossEntropyLossFlat(ignore_index=-100),
                    metrics=[accuracy, error_rate, partial(top_k_accuracy, k=2), F1Score(average='macro'),
                             AccumMetric(_mean_acc, flatten=False)], **kw)
    learn.remove_cb(learn.progress)
    return learn

class AddToLoss(Callback):
    """Add `k` times a mean over the batch of the predictions to `loss_grad` after the loss function (as fastai's
    `RNNRegularizer` does): `order` 20, after distrib.fastai's `ItemMean` (9.5), the square of the predictions;
    any other order, the squared differences of neighbouring outputs"""
    run_valid = False
    def __init__(self, order:float, k:float): self.order, self.k = order, k
    def after_loss(self):
        p = self.learn.pred.float()
        add = p.pow(2).mean() if self.order > 9.5 else (p[:, 1:] - p[:, :-1]).pow(2).mean()
        self.learn.loss_grad = self.learn.loss_grad + self.k*add

class CancelOn(Callback):
    "Raise CancelFitException at training batch 2 of epoch 0, on rank `rank` (None: every rank)"
    def __init__(self, rank): self.rank = rank
    def after_batch(self):
        import os
        if self.training and self.epoch == 0 and self.iter == 2 and self.rank in (None, int(os.environ.get('RANK', 0))):
            print(f"CANCEL rank {os.environ.get('RANK')} at {time.time():.3f}", flush=True)
            raise CancelFitException()

class NaNOn(Callback):
    "Make the loss NaN at training batch 2 of epoch 0, on rank `rank` alone (before `TerminateOnNaNCallback`'s check)"
    def __init__(self, rank): self.rank = rank
    def after_loss(self):
        if self.training and self.epoch == 0 and self.iter == 2 and _rank() == self.rank:
            print(f"NAN rank {_rank()} at {time.time():.3f}", flush=True)
            self.learn.loss_grad = self.learn.loss_grad * float('nan')
            self.learn.loss = self.learn.loss_grad.clone()

class SignalAt(Callback):
    "Send `sig` to this process after training batch `it` of epoch `epoch`, on rank `rank`; each step sleeps `secs`"
    def __init__(self, sig, rank, epoch, it, secs=0.2):
        self.sig, self.rank, self.at, self.secs = sig, rank, (epoch, it), secs
    def after_batch(self):
        import signal
        if not self.training: return
        # steps long beside the stop agreement's all-reduce, which runs every k steps, k <= 0.5 s / step (preemption's
        # _MAX_WAIT): at 0.2 s a step, the stop comes within 2 steps of the signal, inside the epoch of 8 (at 0.05 s it
        # came up to 9 steps later on a loaded machine, past the epoch's end)
        time.sleep(self.secs)
        if (self.epoch, self.iter) == self.at and _rank() == self.rank: signal.raise_signal(self.sig)

class RecordX(Callback):
    "Keep the training inputs after the mix (MixUp's and CutMix's order is 0) at the fit's steps `steps`"
    order = 1
    def __init__(self, steps=(0, 1, 5, 7)): self.steps, self.seen = steps, {}
    def before_batch(self):
        if self.training and self.train_iter in self.steps: self.seen[self.train_iter] = self.xb[0].tolist()

class WidenOn(Callback):
    """On rank `rank`, one column more in the inputs while MixUp (order 0) mixes them (`order=-1` widens, `order=1`
    narrows again): that rank's batch differs in shape from the others' at the exchange"""
    def __init__(self, rank, order): self.rank, self.order = rank, order
    def before_batch(self):
        if _rank() != self.rank: return
        x = self.xb[0]
        self.learn.xb = (torch.cat([x, x[:, :1]], 1) if self.order < 0 else x[:, :N_IN],)

class CpuScaler(Callback):
    """fastai's `MixedPrecision` makes a CUDA `GradScaler`, disabled on a machine without CUDA: at the first training
    pass of a fit (before `Checkpoint` restores the loop's state there) this puts an enabled CPU one in its place, its
    scale growing every 3 steps, and keeps its last state at `after_fit` (before `MixedPrecision` drops it)"""
    order = 9
    def __init__(self, out): self.out, self.done = out, False
    def before_fit(self): self.done = False
    def before_train(self):
        if not self.done: self.learn.scaler = torch.amp.GradScaler('cpu', init_scale=2.**10, growth_interval=3)
        self.done = True
    def after_fit(self): self.out['scaler'] = self.learn.scaler.state_dict()

class _TrainStart(Callback):
    "Note when a training pass starts (the first callback of `before_train`)"
    order, t0 = -10**7, 0.
    def before_train(self): self.t0 = time.perf_counter()
class _TrainEnd(Callback):
    "Add the pass's seconds to `start.secs` (the last callback of `after_train`)"
    order = 10**7
    def __init__(self, start): self.start, self.secs = start, 0.
    def after_train(self): self.secs += time.perf_counter() - self.start.t0

def timed_fit(learn, epochs:int=20)->dict:
    """`learn.fit(epochs, 1e-2)` timed, per training step (the fit's steps, `learn.train_iter`), in ms: `step_ms` the
    fit's wall time (its validations included), `train_ms` the training passes' alone (`before_train` to
    `after_train`, every callback included), `main_cpu_ms` and `process_cpu_ms` the CPU time of this process's main
    thread and of all its threads (gloo's included) over the fit (bench/fastai_distributed.py)"""
    start = _TrainStart(); end = _TrainEnd(start)
    t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
    learn.fit(epochs, 1e-2, cbs=[start, end])
    t, c, p, n = time.perf_counter() - t0, time.thread_time() - c0, time.process_time() - p0, learn.train_iter
    return dict(step_ms=t*1000/n, train_ms=end.secs*1000/n, main_cpu_ms=c*1000/n, process_cpu_ms=p*1000/n)

def checkpointed(learn, name:str, out:dict):
    """fit_one_cycle with distrib's Checkpoint (`ckpt_stop`: SIGUSR1 on rank 1 after batch 1 of epoch 1 stops every
    rank with a checkpoint, `Preempted`; `ckpt_resume`: resumes from it); returns False when the fit was stopped"""
    import os, signal
    from pathlib import Path
    from distrib.callback.checkpoint import Checkpoint
    from distrib.callback.preemption import Preempted
    learn.path = Path(os.environ['FASTAI_JOB_CKPT'])
    ck = Checkpoint(signals=('SIGTERM', 'SIGUSR1'), keep_last=None)
    cbs = [ck] + ([SignalAt(signal.SIGUSR1, 1, 1, 1)] if name == 'ckpt_stop' else [])
    if os.environ.get('FASTAI_JOB_MIX'): cbs.append(MixUp(0.4))
    if os.environ.get('FASTAI_JOB_FP16'): learn.to_fp16(); cbs.append(CpuScaler(out))
    try: learn.fit_one_cycle(2, 1e-2, cbs=cbs)
    except Preempted as e:
        s = torch.load(e.file, weights_only=True)
        out['preempted'] = dict(code=e.code, file=str(e.file), epoch=s['epoch'], batch=s['batch'], n_iter=s['n_iter'])
        return False
    out['resumed_from'] = None if ck.resumed_from is None else str(ck.resumed_from)
    return True

def run_case(name:str, bs:int)->dict:
    "Case `name` with batch size `bs` per process: what fastai reports"
    if name.startswith('text_'):
        learn, out = text_learner(bs, lm=name.startswith('text_lm'), shuffle=name in DRAWN), {}
    else:
        learn, out = learner(bs, 'sgd' if name == 'sgd' else 'adam', ignore=name.startswith('ignore') or
                             name.endswith('_ignore'), image=name == 'cutmix', tfms=name == 'tfms',
                             n_train=SIZES.get(name, job_n()),
                             loss_func=LabelSmoothingCrossEntropyFlat() if name.endswith('_ls') else None), {}
    mix = name in ('mixup', 'cutmix')   # distrib's draws: the reference is under distrib_ctx in one process too
    ctx = (learn.distrib_ctx() if hasattr(learn, 'distrib_ctx') and (mix or bs == job_bs() and _world() > 1)
           else _null())
    if name in DRAWN and isinstance(ctx, _null):   # one process, distrib's rule by hand (distrib_ctx on one rank
        from distrib.fastai.data import ShardedDL   # leaves the loaders alone): its order, set_epoch every epoch
        learn.dls.loaders[0] = ShardedDL(learn.dls.train, 0, 1)
        learn.add_cb(SetEpoch())
    with ctx:
        if name == 'fit': learn.fit(2, 1e-2)
        elif name == 'sgd': learn.fit(2, 0.1)
        elif name == 'one_cycle': learn.fit_one_cycle(2, 1e-2)
        elif name == 'flat_cos': learn.fit_flat_cos(2, 1e-2)
        elif name == 'fine_tune': learn.fine_tune(1, 1e-2, freeze_epochs=1)
        elif name == 'bf16': learn.to_bf16(); learn.fit(1, 1e-2)
        elif name == 'grad_acc': learn.fit(2, 1e-2, cbs=GradientAccumulation(n_acc=4*bs*_world()))
        elif name == 'ignore': learn.fit(2, 1e-2)
        elif name == 'tfms': learn.fit_one_cycle(2, 1e-2)
        elif name in SIZES:   # the training set not a multiple of the global batch: its last global batch uneven
            learn.fit_one_cycle(2, 1e-2, cbs=GradientAccumulation(n_acc=2*bs*_world()) if name.endswith('_acc') else [])
        elif name == 'trackers':   # fastai's trackers decide on the synced values: on every rank as one process does
            learn.fine_tune(6, 1e-2, freeze_epochs=1, cbs=[ReduceLROnPlateau(min_delta=0.05, patience=0, factor=2.),
                                                          EarlyStoppingCallback('accuracy', min_delta=.03, patience=1)])
        elif name in ('add_loss', 'add_loss_acc'):   # callbacks adding to loss_grad after the loss function
            cbs = [AddToLoss(20, 0.5), AddToLoss(1, 0.3)]
            if name == 'add_loss_acc': cbs.append(GradientAccumulation(n_acc=2*bs*_world()))
            learn.fit_one_cycle(2, 1e-2, cbs=cbs)
        elif name == 'text_clas':
            learn.fine_tune(2, 3e-2, freeze_epochs=1)
        elif name == 'text_sorted':   # shuffled: SortedDL's batches of similar lengths
            rec = RecordText()
            learn.fit(2, 1e-2, cbs=rec)
            out['lens'], out['misfed'] = rec.lens, rec.misfed
        elif name in ('text_lm', 'text_lm_shuffle'):
            rec = RecordFirst()
            learn.fit_one_cycle(2, 1e-2, cbs=rec)
            out['first'] = rec.first
        elif name == 'ignore_acc': learn.fit(2, 1e-2, cbs=GradientAccumulation(n_acc=2*bs*_world()))
        elif mix:
            rec = RecordX()
            learn.fit_one_cycle(2, 1e-2, cbs=[MixUp(0.4) if name == 'mixup' else CutMix(1.), rec])
            out['mix_x'] = {str(k): v for k, v in rec.seen.items()}
        elif name == 'lr_find':
            r = learn.lr_find(num_it=20, show_plot=False)
            out['valley'], out['lrs'] = r.valley, learn.recorder.lrs
            out['losses'] = [float(l) for l in learn.recorder.losses]
        elif name == 'save':   # SaveModelCallback, save and export under distrib_ctx: rank 0 writes, atomically
            import tempfile
            from pathlib import Path
            from fastai.callback.tracker import SaveModelCallback
            from distrib.runtime.collectives import broadcast_object
            learn.path = Path(broadcast_object(tempfile.mkdtemp() if _rank() == 0 else None))
            learn.fit(2, 1e-2, cbs=SaveModelCallback())
            learn.save('final'); learn.export('export.pkl')
            out['files'] = sorted(str(p.relative_to(learn.path)) for p in learn.path.rglob('*'))
            out['export'] = str(learn.path/'export.pkl')
        elif name == 'timing':   # ms per training step, over 20 epochs (bench/fastai_distributed.py)
            learn.fit(1, 1e-2); out.update(timed_fit(learn))
        elif name in ('ckpt_stop', 'ckpt_resume'):
            if not checkpointed(learn, name, out):
                out['weights'] = torch.cat([p.detach().float().flatten() for p in learn.model.parameters()]).tolist()
                return out
        elif name == 'mix_shapes':   # rank 1's batch one column wider at MixUp: its exchange refuses it
            learn.fit(1, 1e-2, cbs=[WidenOn(1, -1), MixUp(0.4), WidenOn(1, 1)])
        elif name in ('cancel_one', 'cancel_all'):
            learn.fit(2, 1e-2, cbs=CancelOn(1 if name == 'cancel_one' else None))
        elif name == 'nan_one':   # a NaN loss on rank 1 alone: fastai's TerminateOnNaNCallback cancels there only
            learn.fit(2, 1e-2, cbs=[NaNOn(1), TerminateOnNaNCallback()])
        if name != 'lr_find': out['values'] = [[float(v) for v in row] for row in learn.recorder.values]
        if name == 'tfms': out.update(dls_api(learn))   # after the values: get_preds resets the Recorder's
        if name not in ('lr_find', 'save', 'timing'):   # LMLearner.get_preds (concat_dim=1) needs reorder=False
            preds, targs, losses = learn.get_preds(with_loss=True, **({'reorder': False} if 'lm' in name else {}))
            out['preds'], out['targs'], out['losses'] = preds.tolist(), targs.tolist(), losses.tolist()
            out['validate'] = [float(v) for v in learn.validate()]
        if name == 'text_clas':   # fastai's predict: a test_dl of one item, which one rank reads and the other not
            p = learn.predict(TEXTS[-1][0])
            out['predict'] = [str(p[0]), int(p[1]), p[2].tolist()]
    out['weights'] = torch.cat([p.detach().float().flatten() for p in learn.model.parameters()]).tolist()
    return out

class _null:
    def __enter__(self): return self
    def __exit__(self, *a): return False

def _rank()->int:
    import os
    return int(os.environ.get('RANK', 0))

def job_bs()->int:
    "The per-rank batch of a launched job: $FASTAI_JOB_BS, default B"
    import os
    return int(os.environ.get('FASTAI_JOB_BS', B))

def job_n()->int|None:
    "The training set's size of a case without a size of its own: $FASTAI_JOB_N, default None (`data`'s `N_TRAIN`)"
    import os
    n = os.environ.get('FASTAI_JOB_N')
    return None if n is None else int(n)

def _world()->int:
    import os
    return int(os.environ.get('WORLD_SIZE', 1))

if __name__ == '__main__':
    from distrib.fastai import *  # noqa: the one-line change: was `from fastai.distributed import *`
    from distrib.runtime.collectives import all_reduce_sum
    import os
    import fastai_job   # noqa: the cases as that module's, so that what export pickles names it, not __main__
    import distrib.fastai.losses as dfa   # ItemMean's module: its start_sum is counted
    path, names, res, started = sys.argv[1], sys.argv[2:], {}, []
    dfa.start_sum = (lambda f: lambda n: started.append(1) or f(n))(dfa.start_sum)   # ItemMean's all-reduces of a count
    for name in names:
        k = len(started)
        res[name] = fastai_job.run_case(name, fastai_job.job_bs())
        res[name]['count_all_reduces'] = len(started) - k
        w = torch.tensor(res[name]['weights'], dtype=torch.float64)   # every rank holds the same weights
        spread = (all_reduce_sum(w) / _world() - w).abs().max().item()
        res[name]['rank_spread'] = all_reduce_sum(torch.tensor(spread, dtype=torch.float64)).item()
        for key in ('mix_x', 'lens', 'misfed', 'first'):   # every rank's mixed inputs, text lengths, misfed chunks...
            if key not in res[name]: continue
            import torch.distributed as dist
            every = [None] * _world()
            dist.all_gather_object(every, res[name][key])
            res[name][key] = every
        print(f"CASE {name} done", flush=True)
    import os
    if int(os.environ['RANK']) == 0:
        with open(path, 'w') as f: json.dump(res, f)
