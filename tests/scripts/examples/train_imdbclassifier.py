"""fastai's nbs/examples/train_imdbclassifier.py as a user runs it (`TextDataLoaders.from_folder`,
`text_classifier_learner` under `rank0_first`, `fine_tune` under `distrib_ctx`), with IMDB replaced by generated
reviews of its layout (`example_data.imdb`), an AWD_LSTM made smaller (`config`, no pretrained weights to
download), the DataLoaders built under `rank0_first` too (they tokenize into a folder beside the data, which two
processes would write at once), and distrib.fastai's import; `report(learn)` added at the end.
Run: `python -m distrib.launch --nproc_per_node 2 tests/scripts/examples/train_imdbclassifier.py --epochs 1`"""
from fastai.basics import *
from fastai.callback.all import *
from distrib.fastai import *
from fastprogress import fastprogress
from fastai.callback.mixup import *
from fastcore.script import *
from fastai.text.all import *
from example_data import imdb, report

torch.backends.cudnn.benchmark = True
fastprogress.MAX_COLS = 80
def pr(s):
    if rank_distrib()==0: print(s)

@call_parse
def main(
    lr:    Param("base Learning rate", float)=1e-2,
    bs:    Param("Batch size", int)=8,
    epochs:Param("Number of epochs", int)=1,
    fp16:  Param("Use mixed precision training", store_true)=False,
    dump:  Param("Print model; don't train", int)=0,
    runs:  Param("Number of times to repeat training", int)=1,
):
    "Training of IMDB classifier."
    path = rank0_first(imdb)
    dls = rank0_first(TextDataLoaders.from_folder, path, bs=bs, valid='test')
    config = awd_lstm_clas_config.copy()
    config.update(emb_sz=16, n_hid=24, n_layers=2)

    for run in range(runs):
        pr(f'Rank[{rank_distrib()}] Run: {run}; epochs: {epochs}; lr: {lr}; bs: {bs}')

        learn = rank0_first(text_classifier_learner, dls, AWD_LSTM, drop_mult=0.5, metrics=accuracy,
                            config=config, pretrained=False)
        if dump: pr(learn.model); exit()
        if fp16: learn = learn.to_fp16()

        with learn.distrib_ctx(): # distributed training requires "-m distrib.launch"
            learn.fine_tune(epochs, lr)
            report(learn)
