"""The shuffle of `DistributedDL(shuffle=True)` (issue 40): `index_shuffle`, a permutation of [0, n) computed per
position, is a bijection at awkward sizes, as uniform as `torch.randperm` (positions by values over many epochs),
independent between consecutive epochs; and the shards built on it keep the sharding rule (every index once per
epoch over the ranks, one order for every world size). The statistics run many epochs at once with the same cipher
(`_feistel`, the keys of each epoch's seed), checked equal to `index_shuffle` epoch by epoch."""
import math
import pytest, torch
from distrib.data import index_shuffle, shard_idxs, _feistel, _mix32, _round_keys

Z = 5.   # a statistic fails past 5 standard deviations (p ~ 3e-7): the seeds are fixed, so a test either passes or not

def chi2_limit(dof:int, z:float=Z)->float:
    "The chi-square value that `dof` degrees of freedom exceed with the probability of `z` sigmas (Wilson-Hilferty)"
    return dof * (1 - 2/(9*dof) + z*math.sqrt(2/(9*dof)))**3

def chi2(counts:torch.Tensor, expected:torch.Tensor)->float:
    return float(((counts.double() - expected)**2 / expected).sum())

def epochs_at_once(n:int, seeds)->torch.Tensor:
    "Rows `index_shuffle(arange(n), n, s)` for each s in `seeds`: the same cipher, keys broadcast over the rows"
    bits = (n - 1).bit_length()
    keys = torch.tensor([_round_keys(s, bits) for s in seeds], dtype=torch.int64)   # epochs x rounds
    ks = [keys[:, i:i+1] for i in range(keys.shape[1])]
    out = _feistel(torch.arange(n).expand(len(seeds), n), bits, ks)
    while (walk := out >= n).any(): out = torch.where(walk, _feistel(out, bits, ks), out)
    return out

@pytest.mark.parametrize('n', [5, 1000])
def test_epochs_at_once_is_index_shuffle(n):
    rows = epochs_at_once(n, range(20))
    for s in range(20): assert torch.equal(rows[s], index_shuffle(torch.arange(n), n, s))

AWKWARD = [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 31, 32, 33, 97, 127, 128, 255, 256, 257, 1000, 1023, 1024, 1025, 65521,
           65536, 65537, 1_000_003]

@pytest.mark.parametrize('n', AWKWARD)
def test_bijection(n):
    "A permutation of [0, n) for sizes 1, 2, primes, powers of two and their neighbours, at several seeds"
    for seed in (0, 1, 2**40, -7):
        assert torch.equal(index_shuffle(torch.arange(n), n, seed).sort().values, torch.arange(n)), (n, seed)

def test_bijection_every_block_width():
    "Every block width up to 18 bits, at 2^b - 1, 2^b and 2^b + 1: the code is the same, only the masks change"
    for b in range(1, 19):
        for n in (2**b - 1, 2**b, 2**b + 1):
            if n > 1: assert torch.equal(index_shuffle(torch.arange(n), n, b).sort().values, torch.arange(n)), n

def _inverse(y:torch.Tensor, n:int, seed:int)->torch.Tensor:
    "The position of each element `y` in `index_shuffle`'s permutation: the rounds undone in reverse, walked back"
    bits = (n - 1).bit_length()
    keys = _round_keys(seed, bits)
    lo_bits = bits - bits // 2
    m_hi, m_lo = (1 << (bits // 2)) - 1, (1 << lo_bits) - 1
    def decrypt(x):
        hi, lo = x >> lo_bits, x & m_lo
        for i in reversed(range(len(keys))):
            if i % 2 == 0: hi = hi ^ (_mix32(lo ^ keys[i]) & m_hi)
            else: lo = lo ^ (_mix32(hi ^ keys[i]) & m_lo)
        return (hi << lo_bits) | lo
    x = decrypt(y)
    while (walk := x >= n).any(): x = torch.where(walk, decrypt(x), x)
    return x

@pytest.mark.parametrize('n', [2**40 + 3, 10**10, 2**62])
def test_bijection_huge(n):
    """At 2^40 + 3 (the worst ratio of block to n: about 2), 1e10 and 2^62, sampled: every element is in [0, n),
    inverting the cipher gives each position back (so no two positions share an element), and 10^6 positions give
    10^6 distinct elements"""
    g = torch.Generator().manual_seed(0)
    pos = torch.cat([torch.arange(10**5), n - 1 - torch.arange(10**5),
                     (torch.rand(8 * 10**5, generator=g, dtype=torch.float64) * (n - 1)).long()])
    for seed in (0, 3):
        y = index_shuffle(pos, n, seed)
        assert 0 <= y.min() and y.max() < n
        assert torch.equal(_inverse(y, n, seed), pos)
        assert len(torch.unique(y)) == len(torch.unique(pos))

def test_inverse_on_small_n():
    "The test's inverse is right: on a whole small permutation it gives arange back"
    for n in (2, 5, 300, 70000):
        assert torch.equal(_inverse(index_shuffle(torch.arange(n), n, 1), n, 1), torch.arange(n))

@pytest.mark.parametrize('n', [2, 3, 5, 6, 7, 10, 17, 40])
def test_uniform_positions_by_values(n):
    """Over 200,000 epochs (50,000 from n = 17), each position holds each value 1/n of the time: a chi-square of the
    n x n table of counts ((n-1)^2 degrees of freedom). With 8 rounds where n <= 256 (24 now), n = 5 and 6 fail."""
    E = 200_000 if n < 17 else 50_000
    p = epochs_at_once(n, range(E))
    counts = torch.zeros(n * n, dtype=torch.int64).index_add_(0, (torch.arange(n) * n + p).flatten(),
                                                               torch.ones(E * n, dtype=torch.int64))
    assert chi2(counts, torch.full((n * n,), E / n)) < chi2_limit((n - 1)**2)

@pytest.mark.parametrize('n', [10**7, 2**40 + 3])
def test_uniform_values_of_large_n(n):
    """At large n, 200,000 consecutive positions (a rank's first batches) spread their values evenly over 100
    buckets of [0, n), and so do 200,000 positions spread over the whole range"""
    for pos in (torch.arange(200_000), torch.arange(200_000) * (n // 200_000)):
        counts = torch.bincount(index_shuffle(pos, n, 11) * 100 // n, minlength=100)
        assert chi2(counts, torch.full((100,), len(pos) / 100)) < chi2_limit(99)

def test_neighbours_independent():
    """Neighbouring positions hold unrelated values: over 5,000 epochs of n = 1000, the pair of 16ths of [0, n) the
    values at positions i and i+1 fall in has the distribution of a uniform permutation's (no value twice)"""
    n, E = 1000, 5_000
    b = epochs_at_once(n, range(E)) * 16 // n
    counts = torch.zeros(256, dtype=torch.int64).index_add_(0, (b[:, :-1] * 16 + b[:, 1:]).flatten(),
                                                            torch.ones(E * (n - 1), dtype=torch.int64))
    s = torch.bincount(torch.arange(n) * 16 // n, minlength=16).double()
    expected = (s[:, None] * s[None, :] - torch.diag(s)).flatten() / (n * (n - 1)) * E * (n - 1)
    assert chi2(counts, expected) < chi2_limit(255)

@pytest.mark.parametrize('n', [2, 3, 5, 8, 13])
def test_consecutive_epochs_independent(n):
    """The value at a position in epoch e and in epoch e+1 are independent: their joint counts over 100,000 epochs
    are uniform over the n x n pairs (n^2 - 1 degrees of freedom), at the first and the last position"""
    E = 100_000
    p = epochs_at_once(n, range(E))
    for col in (0, n - 1):
        counts = torch.bincount(p[:-1, col] * n + p[1:, col], minlength=n * n)
        assert chi2(counts, torch.full((n * n,), (E - 1) / n**2)) < chi2_limit(n * n - 1)

def test_consecutive_epochs_uncorrelated():
    "The orders of consecutive epochs (seed + epoch) of 10^6 samples: rank correlation within 5 / sqrt(n) of 0"
    n = 10**6
    for epoch in range(3):
        a, b = (shard_idxs(n, 0, 1, shuffle=True, seed=5, epoch=e)[:].double() for e in (epoch, epoch + 1))
        r = torch.corrcoef(torch.stack([a, b]))[0, 1].item()   # the orders are ranks already: Spearman's rho
        assert abs(r) < 5 / math.sqrt(n), (epoch, r)
        r_pos = torch.corrcoef(torch.stack([a, torch.arange(n).double()]))[0, 1].item()   # value against position
        assert abs(r_pos) < 5 / math.sqrt(n), (epoch, r_pos)

def test_order_is_fixed():
    """The order is part of what a checkpoint resumes: these values change only with a new checkpoint version (a
    mid-epoch resume of an older one refuses an order it did not write)"""
    assert index_shuffle(torch.arange(10), 10, 0).tolist() == [1, 4, 5, 3, 0, 6, 8, 7, 2, 9]
    assert index_shuffle(torch.arange(5), 10**10, 3).tolist() == [412228228, 771903701, 611185248, 8581464050,
                                                                  5757159864]

@pytest.mark.parametrize('W', [1, 2, 3, 8, 1000])
def test_every_index_once_per_epoch(W):
    """Over the W ranks of an epoch, every index of n = 100,003 (a prime) is read once, plus the padding: the first
    total - n of the epoch's order again"""
    n = 100_003
    total = -(-n // W) * W
    got = torch.cat([shard_idxs(n, r, W, shuffle=True, seed=1, epoch=4)[:] for r in range(W)])
    order = index_shuffle(torch.arange(n), n, 5)   # seed + epoch
    assert torch.equal(got.sort().values, torch.cat([torch.arange(n), order[:total - n]]).sort().values)

def test_global_batches_do_not_depend_on_world_size():
    "Global batch k of G = 24 samples: the same set on 1, 2, 3, 4, 6, 8, 12 and 24 ranks (batch G // W each)"
    n, G = 10_000, 24
    order = index_shuffle(torch.arange(n), n, 9)
    for W in (1, 2, 3, 4, 6, 8, 12, 24):
        shards = [shard_idxs(n, r, W, shuffle=True, seed=2, epoch=7) for r in range(W)]
        B = G // W
        for k in (0, 1, 200, n // G - 1):
            got = torch.cat([s[k*B:(k+1)*B] for s in shards]).sort().values
            assert torch.equal(got, order[k*G:(k+1)*G].sort().values), (W, k)
