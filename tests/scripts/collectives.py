"Under 2 processes: broadcast_object, all_reduce_mean and gather_object give every rank the same, correct answer"
import torch
from distrib import (rank_distrib, num_distrib, setup_distrib, teardown_distrib, broadcast_object, all_reduce_mean,
                     gather_object)

setup_distrib(timeout=60)
r, ws = rank_distrib(), num_distrib()
assert ws == 2

# broadcast_object: src's object everywhere, from either rank
assert broadcast_object({'rank': r, 'seed': 100 + r}) == {'rank': 0, 'seed': 100}
assert broadcast_object(['x', r], src=1) == ['x', 1]
try: broadcast_object(r, src=2); raise AssertionError('src=2 should fail')
except ValueError as e: assert 'interval [0, 1]' in str(e)

# all_reduce_mean: element-wise mean, input untouched, ints and bools give floats
t = torch.tensor([1., 2., 3.]) * (r + 1)  # rank 0: [1,2,3], rank 1: [2,4,6]
m = all_reduce_mean(t)
assert torch.equal(m, torch.tensor([1.5, 3., 4.5])), m
assert torch.equal(t, torch.tensor([1., 2., 3.]) * (r + 1)), 'the input must not change'
assert torch.equal(all_reduce_mean(torch.tensor([r, 3])), torch.tensor([0.5, 3.]))
assert torch.equal(all_reduce_mean(torch.tensor([r == 0, True])), torch.tensor([0.5, 1.]))

# gather_object: a list in rank order, everywhere or only on dst
assert gather_object(f'r{r}') == ['r0', 'r1']
g = gather_object({'n': r * 10}, dst=1)
assert g == ([{'n': 0}, {'n': 10}] if r == 1 else None), g
teardown_distrib()
print(f'rank {r} OK')
