"""Small generated data in the layout of the data sets fastai's example scripts download, and what the scripts
report, for tests/test_fastai_examples.py.

The data (the same on every rank and every run: a fixed generator, written by rank 0 under `rank0_first`, as
`untar_data` would): `imagenette` (`train/<class>/*.png`, `val/<class>/*.png`), `adult_sample` (`adult.csv` with
the columns fastai's ADULT_SAMPLE has), `imdb` (`train|test/pos|neg/*.txt`), `wikitext_tiny` (`train.txt`,
`valid.txt`: WikiText articles, ` = Title = ` lines). Sizes come from the environment: `EXAMPLE_DATA` (the folder,
default a temporary one per job), `EXAMPLE_BS` (the batch size per rank where a script has no `--bs`).

`report(learn)` is the one line each script adds at its end, where the fit ends (inside `distrib_ctx` when the
script has one): on every rank `get_preds()` and `validate()` (distrib combines the ranks'), then rank 0 writes
`EXAMPLE_OUT`/result.json (what fastai reported: `recorder.values`, `train_iter`, the predictions in dataset order,
`validate`) and `model.pth` (the trained weights and buffers). With `EXAMPLE_RECOMPUTE` (a `model.pth`), in a world
of one, it also loads those weights and reports `validate()` and `get_preds()` of them: one process's recomputation
of what the distributed run reported."""
import json, os, random, tempfile
from pathlib import Path
import torch
from fastai.torch_core import rank_distrib, num_distrib

DATA = Path(os.environ.get('EXAMPLE_DATA') or Path(tempfile.gettempdir())/'distrib-examples')
BS = int(os.environ.get('EXAMPLE_BS', '8'))
CLASSES = ['n01440764', 'n02102040', 'n02979186', 'n03000684', 'n03028079', 'n03394916', 'n03417042', 'n03425413',
           'n03445777', 'n03888605']   # imagenette's 10 folder names (top_k_accuracy's k is 5)

def _done(path:Path)->bool: return (path/'.done').exists()

def imagenette(n_train:int=8, n_valid:int=3, px:int=40)->Path:
    """`n_train` and `n_valid` PNG images of `px` x `px` per class in imagenette's layout; each class has its own
    colour, with noise, so that a model learns something in a few steps"""
    from PIL import Image
    path = DATA/'imagenette'
    if _done(path): return path
    g = torch.Generator().manual_seed(0)
    for split, n in (('train', n_train), ('val', n_valid)):
        for c, name in enumerate(CLASSES):
            (path/split/name).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                base = torch.tensor([(c*67) % 256, (c*131) % 256, (c*29) % 256]).view(3, 1, 1)   # a colour per class
                img = (base + torch.randint(-60, 60, (3, px, px), generator=g)).clamp(0, 255).to(torch.uint8)
                Image.fromarray(img.permute(1, 2, 0).numpy()).save(path/split/name/f'{name}_{i}.png')
    (path/'.done').touch()
    return path

def adult_sample(n:int=200)->Path:
    "`adult.csv` of `n` rows with the columns of fastai's ADULT_SAMPLE (a few missing values, a learnable salary)"
    import pandas as pd
    path = DATA/'adult_sample'
    if _done(path): return path
    path.mkdir(parents=True, exist_ok=True)
    r = random.Random(0)
    cat = {'workclass': ['Private', 'Self-emp', 'State-gov'], 'education': ['HS-grad', 'Bachelors', 'Masters'],
           'marital-status': ['Married', 'Never-married'], 'occupation': ['Sales', 'Tech-support', 'Craft', None],
           'relationship': ['Husband', 'Wife', 'Own-child'], 'race': ['White', 'Black', 'Other'],
           'sex': ['Male', 'Female'], 'native-country': ['United-States', 'Other']}
    rows = []
    for _ in range(n):
        row = {k: r.choice(v) for k, v in cat.items()}
        row.update({'age': r.randint(18, 80), 'fnlwgt': r.randint(20000, 400000),
                    'education-num': r.choice([9, 13, 14, None]), 'capital-gain': 0, 'capital-loss': 0,
                    'hours-per-week': r.randint(20, 60)})
        row['salary'] = '>=50k' if (row['age'] > 40) + (row['education'] != 'HS-grad') >= 2 else '<50k'
        rows.append(row)
    pd.DataFrame(rows).to_csv(path/'adult.csv', index=False)
    (path/'.done').touch()
    return path

WORDS = ['the', 'film', 'movie', 'a', 'story', 'actor', 'was', 'is', 'and', 'plot', 'scene', 'of', 'it', 'this']
GOOD, BAD = ['great', 'wonderful', 'loved', 'best'], ['awful', 'boring', 'hated', 'worst']

def imdb(n_train:int=24, n_test:int=12)->Path:
    "IMDB's layout (`train|test/pos|neg/<i>_<rating>.txt`): reviews of 5 to 40 words, the label in a few of them"
    path = DATA/'imdb'
    if _done(path): return path
    r = random.Random(0)
    for split, n in (('train', n_train), ('test', n_test)):
        for label, words in (('pos', GOOD), ('neg', BAD)):
            (path/split/label).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                text = [r.choice(WORDS + words) for _ in range(r.randint(5, 40))]
                (path/split/label/f'{i}_{7 if label == "pos" else 2}.txt').write_text(' '.join(text) + ' .')
    (path/'.done').touch()
    return path

def wikitext_tiny(n_train:int=12, n_valid:int=4)->Path:
    "WikiText's layout (`train.txt`, `valid.txt`): articles that open with a ` = Title = ` line, of 20 to 120 words"
    path = DATA/'wikitext_tiny'
    if _done(path): return path
    path.mkdir(parents=True, exist_ok=True)
    r = random.Random(0)
    for name, n in (('train.txt', n_train), ('valid.txt', n_valid)):
        lines = []
        for a in range(n):
            lines += [' \n', f' = Article {a} = \n', ' \n']
            lines += [' '.join(r.choice(WORDS + GOOD + BAD) for _ in range(r.randint(20, 120))) + ' . \n']
        (path/name).write_text(''.join(lines))
    (path/'.done').touch()
    return path

def _plain(model): return getattr(model, 'module', model)   # the model inside DDP, while distrib_ctx holds it

def _preds(learn, preds:bool)->dict:
    "`validate()`, and `get_preds()` if `preds`, of `learn` (predictions flattened)"
    res = {'validate': [float(v) for v in learn.validate()], 'preds': [], 'targs': []}
    if preds:
        p, t = learn.get_preds()
        res.update(preds=p.float().flatten().tolist(), targs=t.flatten().tolist())
    return res

def report(learn, preds:bool=True):
    """Write what `learn` reported (on rank 0) to EXAMPLE_OUT; see the module's docstring. `preds=False`: no
    `get_preds()` (fastai's on a plain `Learner` over a language model fails in one process too: its activation gets
    the model's list of outputs)"""
    out = os.environ.get('EXAMPLE_OUT')
    if not out: return
    res = dict(values=[[float(v) for v in vs] for vs in learn.recorder.values], train_iter=learn.train_iter,
               world=num_distrib() or 1, **_preds(learn, preds))
    recompute = os.environ.get('EXAMPLE_RECOMPUTE')
    if recompute and (num_distrib() or 1) == 1:
        _plain(learn.model).load_state_dict(torch.load(recompute))
        res['recomputed'] = _preds(learn, preds)
    if rank_distrib() == 0:
        Path(out).mkdir(parents=True, exist_ok=True)
        torch.save(_plain(learn.model).state_dict(), Path(out)/'model.pth')
        (Path(out)/'result.json').write_text(json.dumps(res))
