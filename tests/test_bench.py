"""bench/overhead.py: its loops compute what they claim, and the script runs end to end (figures printed, not judged);
bench/liveness_scale.py: its simulation runs, and a rank's store calls do not grow with the world size;
bench/shuffle.py (-m bench): every figure reported."""
import importlib.util, json, subprocess, sys
import pytest, torch
from torch.nn import functional as F
from fastcore.basics import noop
from conftest import ROOT
from distrib import Learner, DataLoaders, accuracy

@pytest.fixture(scope='module')
def bench():
    spec = importlib.util.spec_from_file_location('overhead', ROOT/'bench'/'overhead.py')
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

@pytest.mark.parametrize('every,lead', [(1, False), (3, True)])
def test_lockstep_changes_neither_loop(bench, every, lead):
    "Taking turns (A pausing inside its no_grad validation while B trains, with every=3) gives each loop's own result"
    torch.set_num_threads(1)
    ds = bench.make_data()
    alone = bench.raw_fit(bench.make_model(), *bench.seeded_loaders(*ds))
    with pytest.raises(StopIteration) as e: next(alone)
    alone = e.value.value
    learn = Learner(DataLoaders(*bench.seeded_loaders(*ds)), bench.make_model(), F.cross_entropy, metrics=accuracy)
    learn.logger = noop
    t_a, t_b, res_a, res_b = bench.lockstep(learn, bench.raw_fit(bench.make_model(), *bench.seeded_loaders(*ds), every=every), every, lead)
    assert torch.is_grad_enabled()
    assert t_a > 0 and t_b > 0
    assert res_a == alone
    assert max(abs(x - y) for x, y in zip(res_a, res_b)) < 1e-6

@pytest.mark.bench
def test_script_runs(tmp_path):
    "The whole script with the fewest repetitions: every section reports, both sides did the same work"
    r = subprocess.run([sys.executable, str(ROOT/'bench'/'overhead.py'), '--reps', '3', '--runs', '1'],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert 'B/A' in r.stdout
    res = json.loads(r.stdout.strip().splitlines()[-1])
    for k in ('ddp', 'ddp_ce', 'single'):
        assert res[k]['same_result'] and res[k]['max_result_diff'] < 1e-4, res[k]
        assert len(res[k]['a_reps']) == len(res[k]['b_reps']) == 3 and min(res[k]['a_reps'] + res[k]['b_reps']) > 0
    for k in ('data_nw0', 'data_nw2'): assert res[k]['own_shard'], res[k]
    assert res['dispatch']['b'] > 0

@pytest.mark.skipif(torch.cuda.is_available(), reason='a GPU is here: the scripts run on it (pytest -m bench, -m gpu)')
@pytest.mark.parametrize('script', ['overhead.py', 'strategies.py'])
def test_cuda_refused_without_a_gpu(script):
    "Without CUDA, `--device cuda` is refused in one line with exit code 2, before any job starts"
    r = subprocess.run([sys.executable, str(ROOT/'bench'/script), '--device', 'cuda'], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 2 and r.stdout == '', (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f'bench/{script}: --device cuda needs a CUDA GPU'), r.stderr

@pytest.mark.parametrize('script, args, says', [('overhead.py', ['--sections', 'ddp1'], 'ddp1: one process has no'),
                                                ('strategies.py', ['--ranks', '1'], '--ranks 1: one process trains')])
def test_one_process_sections_refused(script, args, says):
    "A world of one trains without DDP (distrib_ctx): the benchmarks refuse to measure DDP on one rank, in one line"
    r = subprocess.run([sys.executable, str(ROOT/'bench'/script), *args], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert r.returncode == 2 and r.stdout == '' and says in r.stderr, (r.returncode, r.stdout, r.stderr)

def test_liveness_scale_constant_per_rank():
    """bench/liveness_scale.py at W = 8 and 64 (simulated ranks and clock, a few seconds): each role of each phase
    makes as many store calls at 64 ranks as at 8, two per second in every phase a job spends time in (training,
    waiting in a collective, a barrier, rank0_first, agree_cancel), training with a distrib collective every batch
    included (issue 30: no store call per collective); an incident's calls per rank do not grow either"""
    r = subprocess.run([sys.executable, str(ROOT/'bench'/'liveness_scale.py'), '--worlds', '8', '64', '--no-capacity'],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])['phases']
    steady = ('training', 'waiting in a collective', 'waiting in a store barrier', "waiting for rank 0's status",
              'in agree_cancel')
    assert all(any(ph.startswith(s) for ph in res) for s in steady), list(res)
    for ph, by_w in res.items():
        for role, small in by_w['8']['roles'].items():
            big = by_w['64']['roles'][role]
            assert small['calls'] == big['calls'], (ph, role, small, big)
            if ph.startswith(steady): assert small['calls'] == 2.0, (ph, role, small)
    # the launcher: an `add` (the attempt's losses: which world's heartbeats), a `check` and a `multi_get` of the
    # heartbeats, the same of the at-records
    assert res['a failure being reported (per incident)']['64']['roles']['launcher']['calls'] == 5, res
    per_batch = res['training with a collective every batch (10 a second)']  # no store call per collective
    assert all(c['calls'] == 2.0 for w in ('8', '64') for c in per_batch[w]['roles'].values()), per_batch
    agent = res['a failure being reported (per incident)']['64']['roles']
    assert [c['calls'] for role, c in agent.items() if role.startswith("each node's agent")] == [1], agent

@pytest.mark.bench
def test_shuffle_script_runs():
    "bench/shuffle.py at N = 1e6 and 1e10, rank 7 of 8: every figure reported, DistributedSampler skipped past 1e6"
    r = subprocess.run([sys.executable, str(ROOT/'bench'/'shuffle.py'), '--n', '1e6,1e10', '--world', '8',
                        '--randperm-max', '1e6'], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = {(x['side'], x['n']): x for x in json.loads(r.stdout.strip().splitlines()[-1])}
    for n in (10**6, 10**10):
        assert {'first_batch_s', 'resume_first_batch_s', 'memory_mb', 'sampler_idx_per_s'} <= set(rows['distrib', n])
    assert 'memory_mb' in rows['torch', 10**6] and 'skipped' in rows['torch', 10**10]
    assert 'issue 40 target, N=1e10, rank 7 of 8' in r.stdout
