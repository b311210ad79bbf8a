"""fastai's nbs/examples/distrib.py as a user runs it (xresnet, `to_fp16`, `MixUp`, `fit_flat_cos` under
`distrib_ctx`, the data fetched under `rank0_first`), with imagenette's images replaced by generated ones of its
layout (`example_data.imagenette`), a smaller xresnet and distrib.fastai's import; `report(learn)` added at the end.
Run: `python -m distrib.launch --nproc_per_node 2 tests/scripts/examples/fastai_distrib.py` (named so that its
folder on sys.path does not hide the `distrib` package)."""
from fastai.vision.all import *
from distrib.fastai import *
from fastai.vision.models.xresnet import *
from example_data import imagenette, report, BS

path = rank0_first(imagenette)
dls = DataBlock(
    blocks=(ImageBlock, CategoryBlock),
    splitter=GrandparentSplitter(valid_name='val'),
    get_items=get_image_files, get_y=parent_label,
    item_tfms=[RandomResizedCrop(32), FlipItem(0.5)],
    batch_tfms=Normalize.from_stats(*imagenet_stats)
).dataloaders(path, path=path, bs=BS)

learn = Learner(dls, xresnet18(n_out=10, widen=0.25), metrics=[accuracy,top_k_accuracy]).to_fp16()
with learn.distrib_ctx(): learn.fit_flat_cos(2, 1e-3, cbs=MixUp(0.1)); report(learn)
