"""What `distrib.data.items_fingerprint` costs the pre-flight check per fit: one process, datasets of 10^6 items as
fastai and torch hold them (file paths, a DataFrame's row labels, a `random_split` Subset's indices).
Run: `python bench/items_fingerprint.py [N]` (prints seconds per fingerprint, best of 3)."""
import sys, time
from pathlib import Path
import torch
from torch.utils.data import TensorDataset, random_split
from distrib.data import items_fingerprint

class Items:
    "fastai's Datasets / TfmdLists: the items are an attribute"
    def __init__(self, items): self.items = items

def best(f, n:int=3)->float:
    out = []
    for _ in range(n):
        t = time.perf_counter(); f(); out.append(time.perf_counter() - t)
    return min(out)

if __name__ == '__main__':
    N = int(sys.argv[1]) if len(sys.argv) > 1 else 10**6
    cases = {'file paths (fastai image items)': Items([Path(f'train/n{i % 10:08d}/img_{i}.JPEG') for i in range(N)]),
             'random_split Subset indices': random_split(TensorDataset(torch.zeros(N)), [N - N//5, N//5])[0]}
    try:
        import pandas as pd
        cases["a DataFrame's row labels (fastai tabular)"] = Items(pd.DataFrame({'x': range(N)}).sample(frac=1.))
    except ImportError: pass
    for name, ds in cases.items():
        print(f"{name}, {len(getattr(ds, 'items', ds)):,} items: {best(lambda: items_fingerprint(ds)):.3f} s")
