"""fastai's nbs/examples/train_imdbclassifier.py as a user runs it (`TextDataLoaders.from_folder`,
`text_classifier_learner` under `rank0_first`, `fine_tune` under `distrib_ctx`), with IMDB replaced by generated
reviews of its layout (`example_data.imdb`), an AWD_LSTM made smaller (`config`, no pretrained weights to
download), the DataLoaders built under `rank0_first` too (they tokenize into a folder beside the data, which two
processes would write at once), and distrib.fastai's import; `report(learn)` added at the end.
fastcore 2 has no `Param`: the arguments are fastcore 2's (`name:type=default, # help`).
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
    lr:float=1e-2, # base Learning rate
    bs:int=8, # Batch size
    epochs:int=1, # Number of epochs
    fp16:store_true=False, # Use mixed precision training
    dump:int=0, # Print model; don't train
    runs:int=1, # Number of times to repeat training
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
