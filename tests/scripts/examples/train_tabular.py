"""fastai's nbs/examples/train_tabular.py as a user runs it (`TabularDataLoaders.from_csv`, `tabular_learner`,
`partial(learn.distrib_ctx, gpu)()`, `fit_one_cycle`), with ADULT_SAMPLE replaced by a generated `adult.csv` of
its columns (`example_data.adult_sample`, written under `rank0_first`), a batch size for it, and distrib.fastai's
import; `report(learn)` added at the end. As shipped it draws its split without a seed, so every rank draws its own:
under distrib that ends the job before training, naming the fix; `--seed` seeds it (fastai's `set_seed`).
fastcore 2 has no `Param`: the arguments are fastcore 2's (`name:type=default, # help`).
Run: `python -m distrib.launch --nproc_per_node 2 tests/scripts/examples/train_tabular.py --seed 42`"""
from fastai.basics import *
from fastai.tabular.all import *
from fastai.callback.all import *
from distrib.fastai import *
from fastprogress import fastprogress
from fastai.callback.mixup import *
from fastcore.script import *
from example_data import adult_sample, report

torch.backends.cudnn.benchmark = True
fastprogress.MAX_COLS = 80

def get_dls(path, bs):
    dls = TabularDataLoaders.from_csv(path/'adult.csv', path=path, y_names="salary",
        cat_names = ['workclass', 'education', 'marital-status', 'occupation',
                 'relationship', 'race'],
        cont_names = ['age', 'fnlwgt', 'education-num'],
        procs = [Categorify, FillMissing, Normalize], bs=bs)
    return dls

@call_parse
def main(
    gpu:int=None, # GPU to run on
    epochs:int=2, # Number of epochs
    bs:int=8, # Batch size
    seed:int=None, # Seed of the random split (fastai's set_seed); none: each process draws its own
    fp16:int=0, # Use mixed precision training
    dump:int=0, # Print model; don't train
    runs:int=1, # Number of times to repeat training
):
    "Training of Tabular data 'ADULT_SAMPLE'."

    # gpu = setup_distrib(gpu)
    if gpu is not None: torch.cuda.set_device(gpu)

    path = rank0_first(adult_sample)
    if seed is not None: set_seed(seed)
    dls = get_dls(path, bs)

    if not gpu: print(f'epochs: {epochs};')

    for run in range(runs):
        print(f'Run: {run}')

        learn = tabular_learner(dls, metrics=accuracy)
        if dump: print(learn.model); exit()
        if fp16: learn = learn.to_fp16()

        n_gpu = torch.cuda.device_count()
        ctx = learn.parallel_ctx if gpu is None and n_gpu else learn.distrib_ctx

        with partial(ctx, gpu)(): # distributed training requires "-m distrib.launch"
            print(f"Training in {ctx.__name__} context on GPU {gpu if gpu is not None else list(range(n_gpu))}")
            learn.fit_one_cycle(epochs)
            report(learn)
