"""fastai's nbs/examples/train_imagenette.py as a user runs it, in its form with fastai's older distributed API
(`gpu = setup_distrib(gpu)`, `torch.cuda.set_device(gpu)`, `learn.to_distributed(gpu)` when `num_distrib() > 1`),
with imagenette replaced by generated images of its layout (`example_data.imagenette`), `xresnet18` made narrower
(`--widen`), sizes for a CPU, and distrib.fastai's import; `report(learn)` added at the end.
fastcore 2 has no `Param`: the arguments are fastcore 2's (`name:type=default, # help`).
Run: `python -m distrib.launch --nproc_per_node 2 tests/scripts/examples/train_imagenette.py --epochs 2`"""
from fastai.basics import *
from fastai.vision.all import *
from fastai.callback.all import *
from distrib.fastai import *
from fastprogress import fastprogress
from fastai.vision.models.xresnet import *
from fastai.callback.mixup import *
from fastcore.script import *
from example_data import imagenette, report

torch.backends.cudnn.benchmark = True
fastprogress.MAX_COLS = 80

def get_dls(size, woof, bs, sh=0., workers=None):
    source = rank0_first(imagenette)
    if workers is None: workers = min(8, num_cpus())
    batch_tfms = [Normalize.from_stats(*imagenet_stats)]
    if sh: batch_tfms.append(RandomErasing(p=0.3, max_count=3, sh=sh))
    dblock = DataBlock(blocks=(ImageBlock, CategoryBlock),
                       splitter=GrandparentSplitter(valid_name='val'),
                       get_items=get_image_files, get_y=parent_label,
                       item_tfms=[RandomResizedCrop(size, min_scale=0.35), FlipItem(0.5)],
                       batch_tfms=batch_tfms)
    return dblock.dataloaders(source, path=source, bs=bs, num_workers=workers)

@call_parse
def main(
    gpu:int=None, # GPU to run on
    woof:int=0, # Use imagewoof (otherwise imagenette)
    lr:float=1e-2, # Learning rate
    size:int=32, # Size (px: 128,192,256)
    sqrmom:float=0.99, # sqr_mom
    mom:float=0.9, # Momentum
    eps:float=1e-6, # epsilon
    epochs:int=2, # Number of epochs
    bs:int=8, # Batch size
    mixup:float=0., # Mixup
    opt:str='ranger', # Optimizer (adam,rms,sgd,ranger)
    arch:str='xresnet18', # Architecture
    widen:float=0.25, # Width of the architecture's blocks, a multiple of xresnet's
    sh:float=0., # Random erase max proportion
    sa:int=0, # Self-attention
    sym:int=0, # Symmetry for self-attention
    beta:float=0., # SAdam softplus beta
    act_fn:str='Mish', # Activation function
    fp16:int=0, # Use mixed precision training
    pool:str='AvgPool', # Pooling method
    dump:int=0, # Print model; don't train
    runs:int=1, # Number of times to repeat training
    workers:int=0, # Number of workers
):
    "Training of Imagenette."

    gpu = setup_distrib(gpu)
    if gpu is not None: torch.cuda.set_device(gpu)
    if   opt=='adam'  : opt_func = partial(Adam, mom=mom, sqr_mom=sqrmom, eps=eps)
    elif opt=='rms'   : opt_func = partial(RMSprop, sqr_mom=sqrmom)
    elif opt=='sgd'   : opt_func = partial(SGD, mom=mom)
    elif opt=='ranger': opt_func = partial(ranger, mom=mom, sqr_mom=sqrmom, eps=eps, beta=beta)

    dls = get_dls(size, woof, bs, sh=sh, workers=workers)
    if not gpu: print(f'epochs: {epochs}; lr: {lr}; size: {size}; sqrmom: {sqrmom}; mom: {mom}; eps: {eps}')

    m,act_fn,pool = [globals()[o] for o in (arch,act_fn,pool)]

    for run in range(runs):
        print(f'Run: {run}')
        learn = Learner(dls, m(n_out=10, act_cls=act_fn, sa=sa, sym=sym, pool=pool, widen=widen), opt_func=opt_func,
                metrics=[accuracy,top_k_accuracy], loss_func=LabelSmoothingCrossEntropy())
        if dump: print(learn.model); exit()
        if fp16: learn = learn.to_fp16()
        cbs = MixUp(mixup) if mixup else []
        if num_distrib()>1: learn.to_distributed(gpu) # Requires `-m distrib.launch`
        learn.fit_flat_cos(epochs, lr, wd=1e-2, cbs=cbs)
        report(learn)
