"""What the survivors' agreement (`--on-failure continue`, issue 50) costs the job's store, per rank, at 3 to 16,384.

    python bench/survivors_scale.py                 # the table, then one JSON line (a few seconds)
    python bench/survivors_scale.py --worlds 3 64   # other world sizes

The real code runs against a store that counts calls and keys (`torch.distributed.HashStore` behind a counter): the
launcher's agent publishing one loss (`publish_loss`), then one survivor's `Survivors.notice` and `Survivors.agree`
in each of its roles, the other W-2 survivors simulated by writing their part of the agreement straight into the
store, uncounted: a survivor that arrives last (it sets the generation's key), one that arrives before the last
(it waits on that key), each with the step in flight done or not (the first with its count writes where it goes on).
Then the same after a second loss (generation 2). Printed: calls and keys per rank for each role, the most over the
roles, and the total over the W - losses survivors. Not counted: the new group's own creation
(`init_process_group`), which is torch's (gloo's rendezvous writes one key per rank and each rank reads the others'
addresses as it connects, as at the job's start).
"""
from __future__ import annotations
import argparse, json, threading, time
from collections import Counter
import torch.distributed as dist
from distrib.runtime.survivors import Survivors, publish_loss
from distrib.runtime.schema import JobStore

class CountingStore:
    "A `HashStore` that counts the calls and keys of each method distrib's survivors use"
    def __init__(self):
        self.s, self.calls, self.keys = dist.HashStore(), Counter(), Counter()
    def _n(self, m, k): self.calls[m] += 1; self.keys[m] += k
    def add(self, key, v): self._n('add', 1); return self.s.add(key, v)
    def set(self, key, v): self._n('set', 1); return self.s.set(key, v)
    def get(self, key): self._n('get', 1); return self.s.get(key)
    def check(self, keys): self._n('check', len(keys)); return self.s.check(keys)
    def multi_get(self, keys): self._n('multi_get', len(keys)); return self.s.multi_get(keys)
    def wait(self, keys, timeout=None):
        self._n('wait', len(keys))
        return self.s.wait(keys) if timeout is None else self.s.wait(keys, timeout)
    def reset(self): self.calls.clear(); self.keys.clear()
    def total(self)->dict: return {'calls': sum(self.calls.values()), 'keys': sum(self.keys.values())}

def simulate_others(store, gen:int, world:int, steps:int, ahead:bool, me_last:bool):
    """Write, uncounted, the other survivors' part of generation `gen`'s agreement (`world` survivors): their
    arrivals (all but this one; with `me_last` False, one arrives after this one, in a thread), their counts of
    steps (one of them `steps + 1` when `ahead`)"""
    p = JobStore.survivors_prefix(0) + f'gen/{gen}/'
    s = store.s
    s.add(p + f'at/{steps}', 1); s.set(p + f'src/{steps}', json.dumps(dict(epoch=1, batch=5, rank=0)))
    if ahead: s.add(p + f'at/{steps + 1}', 1); s.set(p + f'src/{steps + 1}', json.dumps(dict(epoch=1, batch=6,
                                                                                             rank=1)))
    s.add(p + 'arrived', world - 1 if me_last else world - 2)
    if not me_last:
        def last():
            time.sleep(0.05)
            if s.add(p + 'arrived', 1) == world: s.set(p + 'done', '1')
        threading.Thread(target=last, daemon=True).start()

def one_rank(W:int, losses:int, me_last:bool, ahead:bool)->dict:
    "Calls and keys of one survivor (start rank W-1) through `losses` losses, in the role given"
    store = CountingStore()
    sv = Survivors(store, W - 1, W)
    out = {}
    for n in range(1, losses + 1):
        publish_loss(store.s, 0, n - 1, -9)   # the agent's calls are counted apart (`agent`)
        world = W - n
        store.reset()
        sv.notice(1.)
        simulate_others(store, n, world, 20 + n, ahead, me_last)
        a = sv.agree(20 + n, dict(epoch=1, batch=5), 10.)
        assert (a.gen, a.world_size, a.rank) == (n, world, world - 1), a
        out[n] = store.total()
    return out

def agent()->dict:
    "The launcher's agent's calls for one loss"
    store = CountingStore()
    publish_loss(store, 0, 2, -9)
    return store.total()

def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument('--worlds', type=int, nargs='*', default=[3, 64, 1024, 16384])
    a = p.parse_args(argv)
    res = {'agent_per_loss': agent(), 'worlds': {}}
    ag = res['agent_per_loss']
    print(f"publishing a loss (the launcher's agent, or a survivor's watchdog): {ag['calls']} calls, {ag['keys']} keys")
    print(f"{'W':>6} {'loss':>4} {'role':<22} {'calls':>5} {'keys':>5}")
    for W in a.worlds:
        worst = {}
        for me_last in (True, False):
            for ahead in (False, True):
                role = f"{'last' if me_last else 'waiter'}, {'behind' if ahead else 'furthest on'}"
                for n, c in one_rank(W, 2, me_last, ahead).items():
                    print(f"{W:>6} {n:>4} {role:<22} {c['calls']:>5} {c['keys']:>5}")
                    w = worst.setdefault(n, {'calls': 0, 'keys': 0})
                    for k in w: w[k] = max(w[k], c[k])
        res['worlds'][W] = {n: dict(w, total_calls=w['calls'] * (W - n)) for n, w in worst.items()}
        for n, w in res['worlds'][W].items():
            print(f"{W:>6} {n:>4} {'most per rank; total':<22} {w['calls']:>5} {w['keys']:>5}   total over the "
                  f"{W - n} survivors <= {w['total_calls']} calls")
    print(json.dumps(res))

if __name__ == '__main__': main()
