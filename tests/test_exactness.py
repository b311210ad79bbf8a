"What W processes report equals what one process would: validation, predictions, training, buffers, saving, resume"
import json, re
import pytest

@pytest.mark.parametrize('world_size', [2, pytest.param(3, marks=pytest.mark.slow)])  # 3: CI runs it (-m slow)
def test_exactness(world_size, request):
    "tests/scripts/exactness.py in the shared job of `world_size` processes"
    out = request.getfixturevalue({2: 'together', 3: 'together3'}[world_size])('exactness')
    m = re.search(r'EXACT (\{.*\})', out)
    assert m, out
    res = json.loads(m.group(1))
    print(res)
    assert res['world_size'] == world_size
    assert set(res) == {'world_size', 'validate', 'epoch_valid_values', 'get_preds', 'training', 'resume'}
    assert max(res['validate'], res['epoch_valid_values'], res['get_preds']) <= 1e-6
    assert res['training'] <= 1e-5 and res['resume'] <= 1e-6
