"What W processes report equals what one process would: validation, predictions, training, buffers, saving, resume"
import json, re
import pytest
from conftest import launch, SCRIPTS

@pytest.mark.parametrize('world_size', [2, 3])
def test_exactness(world_size, tmp_path):
    r = launch(SCRIPTS/'exactness.py', tmp_path, nproc=world_size, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    m = re.search(r'EXACT (\{.*\})', r.stdout)
    assert m, r.stdout
    res = json.loads(m.group(1))
    print(res)
    assert res['world_size'] == world_size
    assert set(res) == {'world_size', 'validate', 'epoch_valid_values', 'get_preds', 'training', 'resume'}
    assert max(res['validate'], res['epoch_valid_values'], res['get_preds']) <= 1e-6
    assert res['training'] <= 1e-5 and res['resume'] <= 1e-6
