import numpy as np
import pytest
import torch

from repgeom.metrics import DriftResult, drift


def test_known_answer():
    r = drift(torch.tensor([[3.0, 4.0], [3.0, 4.0]]))
    assert isinstance(r, DriftResult)
    assert isinstance(r.norm, float) and isinstance(r.ratio, float)
    assert (r.norm, r.ratio) == (5.0, 1.0)


def test_symmetric_data_has_no_drift():
    X = torch.tensor([[1.0, 2.0], [-1.0, -2.0], [3.0, 0.0], [-3.0, 0.0]])
    r = drift(X)
    assert r.norm == 0.0 and r.ratio == 0.0


def test_matches_numpy_with_offset():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 16)) + 10.0 * rng.normal(size=16)
    r = drift(torch.tensor(X, dtype=torch.float32))
    Xf = X.astype(np.float32).astype(np.float64)
    norm = np.linalg.norm(Xf.mean(axis=0))
    # float64 reductions of the same float32 data: ~1e-12 relative
    assert r.norm == pytest.approx(norm, rel=1e-10)
    assert r.ratio == pytest.approx(norm / np.linalg.norm(Xf, axis=1).mean(), rel=1e-10)
    assert 0.0 < r.ratio <= 1.0


@pytest.mark.parametrize(
    "X, match",
    [
        (torch.tensor([[float("nan"), 1.0]]), "NaN or Inf"),
        (torch.ones(4), "2-D"),
        (torch.ones(0, 3), "at least 1 rows"),
    ],
)
def test_errors(X, match):
    with pytest.raises(ValueError, match=match):
        drift(X)
