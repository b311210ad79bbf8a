"""What distrib's liveness, barriers and stall checks cost the job's store, per rank, at 8 to 16,384 ranks.

    python bench/liveness_scale.py                  # the table, then one JSON line (about a minute)
    python bench/liveness_scale.py --worlds 8 64    # fewer world sizes
    python bench/liveness_scale.py --no-capacity    # skip the store's capacity (client processes)

The real code of one rank (its watchdog's tick with the deadlock, stall and straggler checks, `store_barrier`,
`wait_for`, `agree_cancel`, `explain_failure`, a failure's report (`watched`), the launcher's `last_positions` and its
agent's `copy_at_records`) runs against a store that counts calls, keys and bytes per method (a dict, speaking the
calls of `torch.distributed.Store` that distrib uses); the other W-1 ranks are simulated by writing their heartbeats
(and barrier arrivals, and their part of the straggler check's rounds) straight into the dict, uncounted, once per
simulated second. Time is simulated too: the
modules' `time` is replaced by a clock that `sleep` advances, and the watchdog ticks once per simulated second, so
16,384 ranks run in seconds. Each phase runs each role of rank in it (the rank that waits, the rank it waits for,
...): calls per second per rank for each role, and in total (the sum over the W ranks).

Bytes are those of TCPStore's wire format: per key or value an 8-byte length and its bytes, one byte per command.

The store's capacity is measured on this machine: a `TCPStore` server (the legacy one and libuv's) in this process
and 4 client processes calling `check` as fast as they can (and, second, a watchdog's tick: the `set` of a 300-byte
value followed by a `multi_get` of 4 keys); the W at which a phase's total calls per second reach it is the W at
saturation. Last, the comparison with the figures of the protocol before issue 30 (`liveness_before.json`: this
benchmark's first version, run on the code of commit faab3c1), the table of the Performance page
(nbs/52_performance.ipynb).
"""
from __future__ import annotations
import argparse, datetime, json, math, multiprocessing as mp, os, sys, tempfile, time as _time, types
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's distrib

import torch.distributed as dist
from distrib.runtime import liveness, waits, stalls, stragglers, position, postmortem
from distrib.runtime.schema import JobStore, JobFailure
from distrib.runtime.position import rank_state, reset_rank_state
from distrib.runtime.world import World

WORLDS = (8, 64, 512, 4096, 16384)
SIM_HOST = 'simulated-host'  # the simulated ranks' host: not this one, so `proc_state` leaves them to heartbeats

# ------------------------------------------------------------------------------------------------------------------
# The counting store

class Count:
    "Calls, keys and bytes of one client, per method"
    def __init__(self): self.calls, self.keys, self.sent, self.recv = (defaultdict(int) for _ in range(4))
    def add(self, method:str, keys:int, sent:int, recv:int):
        self.calls[method] += 1; self.keys[method] += keys; self.sent[method] += sent; self.recv[method] += recv
    def total(self)->dict:
        return {'calls': sum(self.calls.values()), 'keys': sum(self.keys.values()),
                'bytes': sum(self.sent.values()) + sum(self.recv.values())}

def _b(v)->bytes: return v if isinstance(v, bytes) else str(v).encode()

class DictStore:
    """The job's store: a dict of bytes; `client(name)` gives a counting client. A `wait` lets the simulated clock
    `clock` run (the other ranks act meanwhile) until its keys are set or its timeout passed"""
    def __init__(self, clock=None): self.data, self.counts, self.clock = {}, defaultdict(Count), clock
    def client(self, name:str)->Client: return Client(self, name)
    def put(self, key:str, value): self.data[key] = _b(value)  # a simulated rank's write: not counted

class StoreTimeout(RuntimeError): "A wait or get past its timeout"

class Client:
    "One client of a `DictStore`, counting each call (as `torch.distributed.Store` answers them, without blocking)"
    def __init__(self, store:DictStore, name:str): self.s, self.name = store, name
    def _n(self, method, keys, sent, recv): self.s.counts[self.name].add(method, keys, sent, recv)
    def set(self, key, value):
        v = _b(value); self.s.data[key] = v; self._n('set', 1, 1 + 16 + len(key) + len(v), 0)
    def multi_set(self, keys, values):
        vs = [_b(v) for v in values]; self.s.data.update(zip(keys, vs))
        self._n('multi_set', len(keys), 9 + sum(16 + len(k) + len(v) for k, v in zip(keys, vs)), 0)
    def append(self, key, value):
        v = _b(value); self.s.data[key] = self.s.data.get(key, b'') + v; self._n('append', 1, 1 + 16 + len(key) + len(v), 0)
    def get(self, key):
        if key not in self.s.data: raise StoreTimeout(f"get {key}: not set (a real store waits, then times out)")
        v = self.s.data[key]; self._n('get', 1, 9 + len(key), 8 + len(v)); return v
    def multi_get(self, keys):
        missing = [k for k in keys if k not in self.s.data]
        if missing: raise StoreTimeout(f"multi_get: {missing[:3]} not set")
        vs = [self.s.data[k] for k in keys]
        self._n('multi_get', len(keys), 9 + sum(8 + len(k) for k in keys), sum(8 + len(v) for v in vs)); return vs
    def add(self, key, n:int)->int:
        v = int(self.s.data.get(key, b'0')) + n; self.s.data[key] = str(v).encode()
        self._n('add', 1, 17 + len(key), 8); return v
    def check(self, keys)->bool:
        self._n('check', len(keys), 9 + sum(8 + len(k) for k in keys), 1)
        return all(k in self.s.data for k in keys)
    def wait(self, keys, timeout=None):
        self._n('wait', len(keys), 9 + sum(8 + len(k) for k in keys), 1)
        c = self.s.clock
        end = None if c is None else c.t + (timeout.total_seconds() if timeout is not None else 300.)
        while not all(k in self.s.data for k in keys):
            if c is None or c.t >= end: raise dist.DistStoreError(f"wait {keys}: timeout")
            c.sleep(min(end, c.next) - c.t)
    def compare_set(self, key, expected, desired):
        cur = self.s.data.get(key)
        if cur is None and _b(expected) == b'' or cur == _b(expected): self.s.data[key] = cur = _b(desired)
        self._n('compare_set', 1, 25 + len(key) + len(_b(expected)) + len(_b(desired)), 8 + len(cur or b''))
        return cur
    def delete_key(self, key):
        self._n('delete_key', 1, 9 + len(key), 1); return self.s.data.pop(key, None) is not None

# ------------------------------------------------------------------------------------------------------------------
# Simulated time

class Clock:
    """Simulated `time` module: `sleep` advances `monotonic` (and `time`) and runs `on_second` at each whole second
    it passes (the watchdog's tick, the simulated ranks' heartbeats)"""
    def __init__(self): self.t, self.on_second, self.next = 1000., None, 1001.
    def monotonic(self)->float: return self.t
    def time(self)->float: return 1.7e9 + self.t
    def perf_counter(self)->float: return self.t
    def sleep(self, s:float):
        end = self.t + max(s, 0.)
        while self.next <= end:
            self.t = self.next; self.next += 1.
            if self.on_second is not None: self.on_second()
        self.t = end

def use_clock(clock:Clock):
    "Replace `time` in distrib's runtime modules by `clock` (a module-like namespace)"
    fake = types.SimpleNamespace(monotonic=clock.monotonic, time=clock.time, sleep=clock.sleep,
                                 perf_counter=clock.perf_counter)
    for m in (liveness, waits, stalls, position):  # position: a declared long phase's start, on the same clock
        if hasattr(m, 'time'): m.time = fake
    return fake

# ------------------------------------------------------------------------------------------------------------------
# The simulated ranks

def training_pos(batch:int=3)->dict:
    return {'event': 'before_batch', 'epoch': 0, 'batch': batch, 'training': True, 'level': 3}
BACKWARD = {'event': 'backward', 'epoch': 0, 'batch': 3, 'training': True, 'level': 3, 'sync': True}
def coll_pos(name:str='all_reduce_sum', ident:int=7)->dict: return {'op': 'collective', 'name': name, 'id': ident}
def phase_pos(name:str='downloading the data set')->dict:
    return {'op': 'phase', 'name': name, 'id': None, 'phase': name}
def barrier_pos(name:str, ident)->dict: return {'op': 'barrier', 'name': name, 'id': ident}

class Ranks:
    "The W-1 simulated ranks: their heartbeats, written once per simulated second (`beat`)"
    def __init__(self, store:DictStore, world:int, me:int, prefix:str=''):
        self.s, self.w, self.me, self.pre = store, world, me, prefix
        self.pos, self.extra, self.since, self.n, self.rounds, self.round_n = {}, {}, {}, 0, False, 0
    def at(self, ranks, pos:dict, **extra):
        "Put ranks `ranks` at position `pos` (fields `extra` in their heartbeats)"
        for r in ranks:
            if r == self.me: continue
            if self.pos.get(r) != pos: self.since[r] = self.n
            self.pos[r], self.extra[r] = pos, extra
    def waiting(self)->int:
        "How many simulated ranks count in the `waiting` counter (they wait a second or more, or left distrib_ctx)"
        n = 0
        for r, p in self.pos.items():
            ex = self.extra[r]
            if ex.get('left') and not p.get('event') or ex.get('state') == 'exited': n += 1
            elif (p.get('op') in ('collective', 'setup', 'barrier') or p.get('sync')) and self.n - self.since[r] >= 1: n += 1
        return n
    def beat(self, own_counted:bool=False):
        "Each simulated rank publishes its heartbeat (uncounted), as `_Watchdog.heartbeat` writes it"
        self.s.put(f'{self.pre}waiting', self.waiting() + own_counted)
        self.n += 1
        cache = {}
        for r, p in self.pos.items():
            age, ex = self.n - self.since[r], self.extra[r]
            k = (json.dumps(p, sort_keys=True), age, json.dumps(ex, sort_keys=True))
            if k not in cache:
                hb = dict(pid=1, host=SIM_HOST, boot='b', ns='n', start='1', beat=self.n, state='running', code=None,
                          group='joined', pos=p, age=float(age), cancels=0, left=None, colls=7)
                hb.update(ex)
                cache[k] = json.dumps(hb)
            self.s.put(f'{self.pre}hb/{r}', cache[k])
        if not self.rounds: return
        if self.me != 0 and self.n % int(stragglers._STRAGGLER_EVERY) == 0: self.round(start=True)
        elif self.me == 0 and int(self.s.data.get(f'{self.pre}straggler', 0)) // JobStore.WAITING_GEN > self.round_n:
            self.round(start=False)  # the measured rank 0 started one

    def round(self, start:bool):
        """Rank 0 starts a round of the straggler check (the simulated one when `start`), and the other simulated
        ranks count themselves in its histogram at 20 ms per step (uncounted): the rank measured joins, reads, decides"""
        self.round_n += 1
        slot, b = self.round_n % stragglers._SLOTS, stragglers._time_bucket(0.020)
        keys = [self.pre + k for k in stragglers._round_keys(slot)]
        if start:
            for k in keys: self.s.put(k, 0)
            named = int(self.s.data.get(f'{self.pre}straggler', 0)) % JobStore.WAITING_GEN
            self.s.put(f'{self.pre}straggler', self.round_n * JobStore.WAITING_GEN + named)
        i, one = JobStore.bucket_field(b)
        self.s.put(keys[1 + i], int(self.s.data[keys[1 + i]]) + (self.w - 1) * one)
        self.s.put(keys[0], int(self.s.data[keys[0]]) + self.w - 1)

class Full(stragglers.StepTimer):
    "A straggler check's timer with a full window of `own` seconds per step"
    def __init__(self, own:float=0.020): super().__init__(200); self.window = (own, 200)

class FakeLearn:
    "What `position()` reads of a loop: the loop protocol's `loop_position()` (distrib.loop) and `model`"
    def __init__(self, **pos):
        self._event, self.epoch, self.iter = pos.get('event', 'before_batch'), pos.get('epoch', 0), pos.get('batch', 0)
        self.training, self._n_level = pos.get('training', True), pos.get('level', 3)
        self.model = types.SimpleNamespace(require_backward_grad_sync=pos.get('sync', False))
        self.start_epoch = 0
    def loop_position(self)->dict:
        return dict(event=self._event, epoch=self.epoch, batch=self.iter, training=self.training, level=self._n_level,
                    start_epoch=0)

class Exit(BaseException): "`exit_now` called: the rank would end here"

# ------------------------------------------------------------------------------------------------------------------
# One rank: its watchdog ticks each second; its main thread may wait

class CancelBatchException(Exception): "A Cancel*Exception raised on some ranks (its name is what agree_cancel reads)"

class Rank:
    "This process as rank `me` of `world` ranks, its watchdog and main thread on `store`, under the clock `clock`"
    def __init__(self, store:DictStore, world:int, me:int, clock:Clock, timeout:float=20.):
        reset_rank_state()
        self.store, self.clock, self.w, self.me = store, clock, world, me
        self.world = World(rank=me, world_size=world, env='torchelastic', master_addr='127.0.0.1', master_port=1)
        self.main, own = store.client('main'), store.client('watchdog')
        self.dog = liveness._Watchdog(own, self.world, timeout)
        for k in JobStore.COUNTERS: store.put(k, 0)
        self.dog.halt.set()  # `end` and `linger` return at once instead of waiting for the main thread
        st = rank_state()
        st.job.world, st.job.store, st.job.dog = self.world, self.main, self.dog
        st.job.announce = liveness._local_at_record(self.world)  # as `start_liveness` sets it under distrib.launch
        st.job.checks, st.here.group, st.here.colls = (stalls._watch, stragglers.watch_stragglers), 'joined', 7
        self.ended = None
    def tick(self):
        "The watchdog's tick (its exception, had it one: the thread would count the store unreachable)"
        if self.ended is not None: return
        try: self.dog.tick()
        except Exit as e: self.ended = e
        if self.dog.ending and self.ended is None: self.ended = 'ending'

AT_DIR = tempfile.TemporaryDirectory(prefix='liveness_scale_at_')  # the ranks' at-records, as distrib.launch's

def _patch():
    """Run the real code without threads or exits: `running()` is true, `exit_now` raises `Exit`; the ranks keep their
    at-records in `AT_DIR`, as under distrib.launch (`DISTRIB_AT_DIR`)"""
    os.environ[JobStore.AT_DIR_ENV] = AT_DIR.name
    liveness.running = waits.running = lambda: True
    def _exit(code, line=None): raise Exit(line)
    liveness.exit_now = _exit
    stack = lambda limit=12: '  File "train.py", line 1, in <module>\n    learn.fit(1)\n' * 6
    stalls.main_stack = liveness.main_stack = stack
    stalls.print = lambda *a, **k: None  # the straggler's and stall's lines (a stall report lists ranks)

class Run:
    "A phase for one role: a rank, the simulated others, the clock; `snap` records the counts at each second"
    def __init__(self, world:int, me:int, timeout:float=20.):
        self.clock = Clock()
        use_clock(self.clock)
        self.store = DictStore(self.clock)
        self.ranks = Ranks(self.store, world, me)
        self.rank = Rank(self.store, world, me, self.clock, timeout)
        self.ranks.rounds = True
        self.snaps, self.hooks = [], []
        self.clock.on_second = self.second
        self.ranks.at(range(world), training_pos())
    def second(self):
        for h in self.hooks: h(self)
        self.ranks.beat(self.rank.dog.counted)
        self.rank.tick()
        self.snaps.append((self.clock.t, self.totals()))
    def totals(self)->dict:
        out = {'calls': 0, 'keys': 0, 'bytes': 0}
        for c in self.store.counts.values():
            for k, v in c.total().items(): out[k] += v
        return out
    def run(self, seconds:int):
        "Let `seconds` simulated seconds pass with the main thread idle (only the watchdog talks to the store)"
        self.clock.sleep(seconds)
    def rate(self, t0:float, t1:float)->dict:
        "Calls, keys and bytes per second between simulated times `t0` and `t1` (seconds since the start)"
        base = 1000.
        a = next(s for t, s in self.snaps if t >= base + t0)
        b = [s for t, s in self.snaps if t <= base + t1][-1]
        span = t1 - t0
        return {k: (b[k] - a[k]) / span for k in a}

def per_incident(run:Run, f)->dict:
    "Calls, keys and bytes that `f()` costs"
    a = run.totals()
    f()
    b = run.totals()
    return {k: b[k] - a[k] for k in a}

def _quiet(f):
    "`f()` with stderr sent to /dev/null (the stall report lists every rank)"
    saved = sys.stderr
    sys.stderr = open(os.devnull, 'w')
    try: return f()
    finally: sys.stderr.close(); sys.stderr = saved

# ------------------------------------------------------------------------------------------------------------------
# The phases: each a list of roles (name, how many of the W ranks play it, a function W -> counts per second)

HOLD = 3  # seconds: the deadlock hold (`stalls._MISMATCH_AFTER`)
WARM, SPAN = 5, 20  # seconds of each phase before counting (past the deadlock hold, 3 s), and counted

def training(W:int, me:int=1)->dict:
    """Every rank trains, its straggler check's timer full: its watchdog only (rank 0 also starts the straggler
    check's rounds, every `STRAGGLER_EVERY` seconds; the simulated rank 0 does when `me` is another rank)"""
    r = Run(W, me)
    learn = FakeLearn(**training_pos(0))
    position.track(learn)
    rank_state().here.timer = Full()
    def steps(run):
        learn.iter += 10  # ten steps a second
        run.ranks.at(range(W), training_pos(learn.iter))
    r.hooks.append(steps)
    r.run(WARM + SPAN)
    return r.rate(WARM, WARM + SPAN)

PER_BATCH = 10  # distrib collectives a second in "training with a collective every batch" (one per batch)

def training_collectives(W:int, me:int=1)->dict:
    """As `training`, with a distrib collective every batch, ten a second (a metric's all-reduce, the loss's count,
    TerminateOnNaNCallback): each entered through `doing('collective', 'all_reduce_sum')`, as `all_reduce_sum`
    enters it (the collective itself, gloo's or NCCL's, is no store call)"""
    r = Run(W, me)
    learn = FakeLearn(**training_pos(0))
    position.track(learn)
    rank_state().here.timer = Full()
    def steps(run):
        for _ in range(PER_BATCH):
            learn.iter += 1
            with position.doing('collective', 'all_reduce_sum'): pass
        run.ranks.at(range(W), training_pos(learn.iter))
    r.hooks.append(steps)
    r.run(WARM + SPAN)
    return r.rate(WARM, WARM + SPAN)

def in_phase(W:int, others:dict)->dict:
    "Rank 0 in a declared long phase, the others at `others` (a position): rank 0's watchdog"
    r = Run(W, 0)
    r.ranks.at(range(1, W), others)
    with position.long_phase('downloading the data set'): r.run(WARM + SPAN)
    return r.rate(WARM, WARM + SPAN)

def collective_wait(W:int)->dict:
    "Rank 1 waits in all_reduce_sum (past the deadlock hold) while rank 0 is in a declared long phase"
    r = Run(W, 1)
    r.ranks.at([0], phase_pos()); r.ranks.at(range(2, W), coll_pos())
    rank_state().here.colls = 6
    with position.doing('collective', 'all_reduce_sum'): r.run(WARM + SPAN)
    return r.rate(WARM, WARM + SPAN)

def _arrive_at(t:float, f):
    "A hook running `f(run)` once, at simulated second `t`"
    def hook(run):
        if run.clock.t >= 1000. + t and not hook.done: hook.done = True; f(run)
    hook.done = False
    return hook

def barrier_wait(W:int)->dict:
    "Rank 1 in `store_barrier` (distrib_barrier, Learner.save, rank0_first) with W-2 others, rank 0 in a long phase"
    r = Run(W, 1)
    name, k = 'distrib_barrier()', 1
    key = JobStore(None).barrier_key(k, name)
    r.ranks.at([0], phase_pos()); r.ranks.at(range(2, W), barrier_pos(name, k), barriers=1)
    r.store.put(key, W - 2)
    def arrive(run):  # rank 0 arrives last: it sets the barrier's done key
        run.store.put(key, int(run.store.data[key]) + 1); run.store.put(JobStore.done_key(key), 'ok')
    r.hooks.append(_arrive_at(WARM + SPAN + 1, arrive))
    waits.store_barrier(name, None)
    return r.rate(WARM, WARM + SPAN)

def rank0_wait(W:int)->dict:
    "Rank 1 in `wait_for` rank 0's status (rank0_first's wait) while rank 0 runs the function in a long phase"
    r = Run(W, 1)
    key = JobStore(None).announce_key(1)
    r.ranks.at([0], phase_pos()); r.ranks.at(range(2, W), barrier_pos("run f (rank0_first)'s wait for rank 0", key))
    r.hooks.append(_arrive_at(WARM + SPAN + 1, lambda run: run.store.put(key, '')))
    waits.wait_for(1, 0, "run f (rank0_first)'s wait for rank 0", None)
    return r.rate(WARM, WARM + SPAN)

def cancel_wait(W:int)->dict:
    "Rank 1 in `agree_cancel` with W-2 others, while rank 0 has not raised it yet (still in its batch)"
    r = Run(W, 1)
    learn = FakeLearn(**training_pos(3))
    position.track(learn)
    what = "the check that every rank raised CancelBatchException"
    key = JobStore(None).cancel_key(1, 'CancelBatchException', 3)[0]
    r.ranks.at([0], training_pos(3)); r.ranks.at(range(2, W), dict(training_pos(3), op='barrier', name=what,
                                                                    id='cancel/1'), cancels=1)
    r.store.put(key, W - 2)
    def arrive(run): run.store.put(key, int(run.store.data[key]) + 1); run.store.put(JobStore.done_key(key), 'ok')
    r.hooks.append(_arrive_at(WARM + SPAN + 1, arrive))
    waits.agree_cancel(CancelBatchException(), None)
    return r.rate(WARM, WARM + SPAN)

def stalled(W:int)->dict:
    "Rank 1 stuck in a callback (a stall, reported at 5 s) while the others wait for it in the gradient all-reduce"
    os.environ['DISTRIB_STALL_REPORT'] = '5'
    try:
        r = Run(W, 1)
        position.track(FakeLearn(**training_pos(3)))
        r.ranks.at(range(W), BACKWARD)
        for q in range(W):
            if q != 1: r.store.put(JobStore(None).stack_key(q), stalls.main_stack())
        _quiet(lambda: r.run(WARM + SPAN))
    finally: del os.environ['DISTRIB_STALL_REPORT']
    return r.rate(WARM - 1, WARM + SPAN)  # the report at 5 s included

def stall_waiter(W:int)->dict:
    "A rank waiting in the gradient all-reduce for the stalled rank 1"
    r = Run(W, 2)
    position.track(FakeLearn(**BACKWARD))
    r.ranks.at(range(W), BACKWARD); r.ranks.at([1], training_pos(3))
    r.run(WARM + SPAN)
    return r.rate(WARM, WARM + SPAN)

LEFT = {'error': 'RuntimeError: Expected to have finished reduction in the prior iteration',
        'where': 'the batch (forward and loss) (epoch 0, training batch 4)'}

def deadlock_examiner(W:int)->dict:
    """The caught one-rank error at scale: rank 1 left distrib_ctx by an exception and waits in gather_object, every
    other rank waits in the gradient all-reduce. Rank 0's watchdog (the examiner) from the start of the wait to its
    verdict: calls per second over that time (and the seconds to the verdict)"""
    r = Run(W, 0)
    position.track(FakeLearn(**BACKWARD))
    r.ranks.at(range(2, W), BACKWARD); r.ranks.at([1], coll_pos('gather_object', 8), left=LEFT)
    for _ in range(60):
        r.run(1)
        if int(r.store.data['failures']): break
    secs = len(r.snaps)
    out = r.rate(HOLD, secs)
    out['verdict_s'] = secs
    return out

def deadlock_other(W:int)->dict:
    "Another rank waiting in the gradient all-reduce, until it reads rank 0's verdict (published 5 s in) and ends"
    r = Run(W, 2)
    position.track(FakeLearn(**BACKWARD))
    r.ranks.at([0] + list(range(3, W)), BACKWARD); r.ranks.at([1], coll_pos('gather_object', 8), left=LEFT)
    def verdict(run):
        run.store.put('failures', 1)
        run.store.put('failure/1', JobFailure('verdict', cause=1, text='a deadlock', blame={
            1: {'how': 'left distrib_ctx', 'where': 'gather_object'}}).encode())
    r.hooks.append(_arrive_at(5, verdict))
    for _ in range(10):
        r.run(1)
        if r.rank.ended is not None: break
    return r.rate(HOLD, len(r.snaps))

def _report(err:BaseException):
    """`err` leaving the main thread's block (`liveness.watched`, as `run_as_rank` runs it): reported, then settled;
    the record written to a temporary file: never to `os.devnull`, which an `ErrorRecord` written by a rename would
    replace by a regular file when run as root"""
    with tempfile.TemporaryDirectory() as d:
        try:
            with liveness.watched(os.path.join(d, 'rec'), start=False): raise err
        except type(err): pass

def _fail_in_a_collective():
    "This rank's collective raises (no process group here: torch.distributed's all_reduce raises); it reports why"
    import torch
    try: dist.all_reduce(torch.zeros(1))
    except Exception as e: _report(waits.explain_failure(e, 60.))

def failure_first(W:int)->dict:
    "Rank 0 was killed; rank 1's collective raises first: it explains it (reads every heartbeat once) and reports"
    r = Run(W, 1)
    r.ranks.at(range(W), BACKWARD)
    r.run(3)
    r.rank.ended = 'no ticks'  # the main thread's calls only
    return per_incident(r, _fail_in_a_collective)

def failure_other(W:int)->dict:
    "Another rank whose collective raised: it waits for the first one's report, and reports its consequence"
    r = Run(W, 2)
    r.ranks.at(range(W), BACKWARD)
    r.run(3)
    r.rank.ended = 'no ticks'
    r.store.put('explain', 1); r.store.put('failures', 1)
    r.store.put('failure/1', JobFailure('peer', rank=1, summary='PeerFailedError: ...',
                                        blame={0: {'how': 'closed its connection'}}).encode())
    return per_incident(r, _fail_in_a_collective)

def exit_launcher(W:int)->dict:
    "The launcher's agent publishing rank 1's exit without a goodbye (`LauncherView.record_exit`): calls per incident"
    store = DictStore()
    ranks = Ranks(store, W, -1, prefix='distrib/liveness/0//')
    ranks.at(range(W), coll_pos()); ranks.beat()
    postmortem.LauncherView.record_exit(store.client('launcher'), 1, 0)
    return store.counts['launcher'].total()

def exit_reader(W:int)->dict:
    """Another rank, waiting in a collective, that learns the exit from the `failures` counter its tick reads anyway,
    then reports its consequence: its calls from the record to its end (its tick's two included)"""
    r = Run(W, 2)
    r.ranks.at(range(W), coll_pos())
    own = lambda: {k: sum(r.store.counts[n].total()[k] for n in ('main', 'watchdog')) for k in ('calls', 'keys', 'bytes')}
    with position.doing('collective', 'all_reduce_sum'):
        r.run(WARM)
        a = own()
        launcher = r.store.client('launcher')
        postmortem.LauncherView.record_exit(launcher, 1, 0, restart_count=None)  # its keys unprefixed, as this run's
        for _ in range(5):
            r.run(1)
            if r.rank.ended is not None: break
    assert r.rank.ended is not None, "the record did not end the rank"
    b = own()
    return {k: b[k] - a[k] for k in a}

def launcher_summary(W:int)->dict:
    "The launcher's failure summary: the ranks' last positions read from the store (per incident)"
    store = DictStore()
    ranks = Ranks(store, W, -1, prefix='distrib/liveness/0//')
    ranks.at(range(W), BACKWARD); ranks.beat()
    for q in range(W): store.put(f'distrib/liveness/0//at/{q}', json.dumps({'pos': coll_pos(), 'colls': 7}))
    c = store.client('launcher')
    postmortem.LauncherView.last_positions(c, 0, W)
    return store.counts['launcher'].total()

NODE = 8  # ranks per node, for the launcher's agents

def agent_copy(W:int)->dict:
    """The launcher's agent of one node of `NODE` ranks, when the run failed: it copies its workers' at-records
    (`LauncherView.copy_at_records`, the records written by the real `_AtRecord`) into the store (per incident)"""
    store = DictStore()
    with tempfile.TemporaryDirectory() as d:
        for q in range(NODE):
            reset_rank_state()
            rec = liveness._AtRecord(JobStore.at_record_path(d, q))
            rank_state().job.announce = rec
            with position.doing('collective', 'all_reduce_sum'): pass
            rec.close()
        reset_rank_state()
        postmortem.LauncherView(d).copy_at_records(store.client('agent'), range(NODE))
    return store.counts['agent'].total()

PHASES = {  # phase: [(role, ranks playing it at world size W, function W -> counts)]
    'training': [('rank 0 (starts the straggler rounds)', lambda W: 1, lambda W: training(W, 0)),
                 ('other rank', lambda W: W - 1, training)],
    'training with a collective every batch (10 a second)': [
        ('rank 0', lambda W: 1, lambda W: training_collectives(W, 0)),
        ('other rank', lambda W: W - 1, training_collectives)],
    'waiting in a collective (rank 0 in a long phase)': [('waiting rank', lambda W: W - 1, collective_wait),
                                                         ('rank 0', lambda W: 1, lambda W: in_phase(W, coll_pos()))],
    'waiting in a store barrier for rank 0': [('waiting rank', lambda W: W - 1, barrier_wait),
                                             ('rank 0', lambda W: 1, lambda W: in_phase(W, barrier_pos('distrib_barrier()', 1)))],
    "waiting for rank 0's status (rank0_first)": [('waiting rank', lambda W: W - 1, rank0_wait),
                                                 ('rank 0', lambda W: 1, lambda W: in_phase(W, barrier_pos('w', 'rank0_only/1')))],
    'in agree_cancel': [('waiting rank', lambda W: W - 1, cancel_wait), ('rank 0 (at work)', lambda W: 1, training)],
    'a stall being examined': [('stalled rank', lambda W: 1, stalled), ('waiting rank', lambda W: W - 1, stall_waiter)],
    'a deadlock being examined': [('rank 0 (examines)', lambda W: 1, deadlock_examiner),
                                  ('other rank', lambda W: W - 1, deadlock_other)],
}
INCIDENTS = {  # per incident, not per second
    'a failure being reported (per incident)': [('first rank whose collective failed', lambda W: 1, failure_first),
                                                ('other ranks whose collective failed', lambda W: W - 2, failure_other),
                                                ('launcher', lambda W: 1, launcher_summary),
                                                (f"each node's agent ({NODE} ranks; copies their at-records)",
                                                 lambda W: W // NODE, agent_copy)],
    "a rank's exit recorded by its launcher (per incident)": [('launcher (publishes it)', lambda W: 1, exit_launcher),
                                                              ('other rank (reads it, ends)', lambda W: W - 1,
                                                               exit_reader)],
}

def measure(worlds, phases=None)->dict:
    "{phase: {W: {'roles': {role: counts}, 'total': counts}}}"
    _patch()
    out = {}
    for name, roles in {**PHASES, **INCIDENTS}.items():
        if phases and not any(p in name for p in phases): continue
        out[name] = {}
        for W in worlds:
            res, tot = {}, {'calls': 0., 'keys': 0., 'bytes': 0.}
            for role, n, f in roles:
                c = f(W)
                res[role] = c
                for k in tot: tot[k] += n(W) * c[k]
            out[name][W] = {'roles': res, 'total': tot}
            reset_rank_state()
    return out

# ------------------------------------------------------------------------------------------------------------------
# The store's capacity on this machine

def _client(port:int, op:str, secs:float, q):
    "A client process: `op` in a loop for `secs` seconds; puts its number of calls on `q`"
    import torch.distributed as dist
    c = dist.TCPStore('127.0.0.1', port, is_master=False, timeout=datetime.timedelta(seconds=30))
    c.set('hb/0', 'x' * 300)
    for k in ('failures', 'waiting', 'straggler'): c.add(k, 0)
    n, end = 0, _time.monotonic() + secs
    me = os.getpid()
    while _time.monotonic() < end:
        for _ in range(50):
            if op == 'check': c.check(['hb/0'])
            else: c.set(f'hb/{me}', 'x' * 300); c.multi_get(['failures', 'waiting', 'straggler', 'hb/0']); n += 1
        n += 50
    q.put(n)

def capacity(libuv:bool, op:str='check', clients:int=4, secs:float=4.)->float:
    "Calls per second a TCPStore server in this process answers to `clients` processes calling `op` in a loop"
    server = dist.TCPStore('127.0.0.1', 0, None, True, datetime.timedelta(seconds=30), wait_for_workers=False,
                           use_libuv=libuv)
    ctx = mp.get_context('spawn')
    q = ctx.Queue()
    ps = [ctx.Process(target=_client, args=(server.port, op, secs, q)) for _ in range(clients)]
    for p in ps: p.start()
    n = sum(q.get(timeout=120) for _ in ps)
    for p in ps: p.join(30)
    return n / secs

def saturation(totals:dict, cap:float)->float|None:
    """The W at which a phase's total calls per second (`totals`: {W: calls/s}) reach `cap`: interpolated on a log-log
    scale between the measured W, extrapolated from the last two beyond them; None when it never grows"""
    ws = sorted(totals)
    pts = [(math.log(w), math.log(max(totals[w], 1e-9))) for w in ws]
    lc = math.log(cap)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if y0 <= lc <= y1: return math.exp(x0 + (lc - y0) * (x1 - x0) / (y1 - y0))
    (x0, y0), (x1, y1) = pts[-2], pts[-1]
    if lc < pts[0][1]: return math.exp(pts[0][0] + (lc - pts[0][1]) / max((y1 - y0) / (x1 - x0), 1e-9))
    slope = (y1 - y0) / (x1 - x0)
    return math.exp(x1 + (lc - y1) / slope) if slope > 0 else None

# ------------------------------------------------------------------------------------------------------------------

def _fmt(x:float)->str: return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"

def table(res:dict, worlds, cap:float|None)->str:
    "The Markdown table: per phase and W, calls per second per rank (each role) and in total; W at saturation"
    head = '| phase | role | ' + ' | '.join(f'W = {w:,}' for w in worlds) + ' |'
    lines = [head, '|' + '---|' * (len(worlds) + 2)]
    for ph, by_w in res.items():
        per = 'per incident' in ph
        for role in next(iter(by_w.values()))['roles']:
            lines.append(f'| {ph} | {role}, calls{"" if per else "/s"} | ' +
                         ' | '.join(_fmt(by_w[w]['roles'][role]['calls']) for w in worlds) + ' |')
        sat = '' if per or cap is None else saturation({w: by_w[w]['total']['calls'] for w in worlds}, cap)
        sat = '' if sat == '' else (f'; saturates the store at W ≈ {sat:,.0f}' if sat else '; never saturates')
        lines.append(f'| {ph} | **total{"" if per else "/s"}**{sat} | ' +
                     ' | '.join(_fmt(by_w[w]['total']['calls']) for w in worlds) + ' |')
        lines.append(f'| {ph} | total keys read/written{"" if per else "/s"}, MB{"" if per else "/s"} | ' +
                     ' | '.join(f"{_fmt(by_w[w]['total']['keys'])}, {by_w[w]['total']['bytes']/1e6:.2f}"
                                for w in worlds) + ' |')
    return '\n'.join(lines)

BEFORE = Path(__file__).with_name('liveness_before.json')  # this benchmark's figures for the protocol of faab3c1
BEFORE_CAPACITY = 57_000  # calls/s: the legacy server's `check`, 4 clients, measured with the before-figures

def compare(before:dict, after:dict, worlds, cap:float|None)->str:
    """The Markdown table of the Performance page: per phase and W, the calls per second of the busiest rank and of
    all ranks together, before (`before`: the JSON of `BEFORE`) and after (`after`), and the W at which the store
    saturates"""
    head = ('| phase | | ' + ' | '.join(f'W = {w:,}' for w in worlds) + ' | store saturated at |')
    lines = [head, '|' + '---|' * (len(worlds) + 3)]
    for ph, by_w in after.items():
        per = 'per incident' in ph
        old = before['phases'].get(ph, {})
        for label, get in (('busiest rank', lambda d: max(r['calls'] for r in d['roles'].values())),
                           ('all ranks', lambda d: d['total']['calls'])):
            cells = []
            for w in worlds:
                a, b = by_w.get(w) or by_w.get(str(w)), old.get(str(w))
                cells.append(f"{_fmt(get(b)) if b else '?'} → **{_fmt(get(a))}**")
            sat = ''
            if label == 'all ranks' and not per:
                s_b = saturation({w: old[str(w)]['total']['calls'] for w in worlds if str(w) in old}, BEFORE_CAPACITY) \
                      if len([w for w in worlds if str(w) in old]) > 1 else None
                s_a = saturation({w: by_w[w]['total']['calls'] for w in worlds}, cap) if cap else None
                sat = f"W ≈ {_fmt(s_b) if s_b else '?'} → **W ≈ {_fmt(s_a) if s_a else '?'}**"
            unit = 'calls per incident' if per else 'calls/s'
            lines.append(f"| {ph} | {label}, {unit} | " + ' | '.join(cells) + f" | {sat} |")
    return '\n'.join(lines)

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--worlds', type=int, nargs='+', default=list(WORLDS))
    p.add_argument('--phases', nargs='*', help='only the phases whose names contain one of these words')
    p.add_argument('--no-capacity', action='store_true', help="skip the store's capacity")
    p.add_argument('--clients', type=int, default=4, help='client processes for the capacity (default 4)')
    p.add_argument('--capacity-of', default='libuv tick', help="the capacity the W at saturation is computed from: "
                   "'libuv tick' (default: distrib.launch's store, the calls distrib makes), 'legacy check', ...")
    a = p.parse_args(argv)
    t0 = _time.perf_counter()
    res = measure(a.worlds, a.phases)
    sim_s = _time.perf_counter() - t0
    caps = {}
    if not a.no_capacity:
        for libuv in (False, True):
            for op in ('check', 'tick'):
                caps[f"{'libuv' if libuv else 'legacy'} {op}"] = capacity(libuv, op, a.clients)
    cap = caps.get(a.capacity_of)
    print(table(res, a.worlds, cap))
    if caps:
        print(f"\nThe store's capacity on this machine ({a.clients} client processes, calls/s): " +
              ', '.join(f"{k}: {v:,.0f}" for k, v in caps.items()) +
              " ('tick': a set of 300 B and a multi_get of 4 keys, counted as 2 calls)")
    if BEFORE.exists():
        print(f"\nBefore (the protocol of faab3c1, {BEFORE.name}; saturation at {BEFORE_CAPACITY:,} calls/s) → "
              f"after (this code; saturation at {a.capacity_of}):\n")
        print(compare(json.loads(BEFORE.read_text()), res, a.worlds, cap))
    print(f"(simulation: {sim_s:.1f} s)")
    print(json.dumps({'worlds': a.worlds, 'phases': res, 'capacity': caps, 'sim_s': sim_s}))

if __name__ == '__main__': main()
