"""bench/strategies.py runs end to end with the smallest settings: the configurations report, all did the same work.
Two of the four (each launch costs seconds): DDP, and compiled FSDP; tests/test_compile.py covers compiling."""
import json, subprocess, sys
from conftest import ROOT

def test_script_runs():
    r = subprocess.run([sys.executable, str(ROOT/'bench'/'strategies.py'), '--hidden', '64', '--layers', '2',
                        '--steps', '2', '--warmup', '1', '--batch', '2', '--timeout', '600',
                        '--configs', 'ddp,fsdp_compiled'],
                       capture_output=True, text=True, timeout=1800, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert 'steps/s' in r.stdout and 'peak MiB/rank' in r.stdout
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res['world_size'] == 2 and list(res['results']) == ['ddp', 'fsdp_compiled']
    ddp_state = sum(res['results']['ddp']['state_mib'][0].values())
    for name, c in res['results'].items():
        assert c['params'] == 2*(64*64 + 64) and c['steps_per_s'] > 0 and len(c['peak_mib']) == 2, (name, c)
        assert c['max_weight_diff'] <= 1e-5, (name, c['max_weight_diff'])      # the same training everywhere
        share = sum(c['state_mib'][0].values())/ddp_state                      # FSDP: about 1/W of DDP's
        assert abs(share - (0.5 if name.startswith('fsdp') else 1.)) < 0.01, (name, share)
