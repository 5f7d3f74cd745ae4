import numpy as np
import pytest
import torch

from repgeom.metrics import anisotropy


def _svd_reference(X: np.ndarray) -> float:
    Xc = X.astype(np.float64) - X.astype(np.float64).mean(axis=0)
    s = np.linalg.svd(Xc, compute_uv=False)
    return float(s[0] ** 2 / (s**2).sum())


@pytest.mark.parametrize("method", ["auto", "covariance", "svd"])
def test_rank_one_is_one(method):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(300, 1, generator=g) @ torch.randn(1, 40, generator=g) + 3.0
    # float64 eigen/SVD of an exactly rank-one matrix: the other eigenvalues are ~1e-16 relative
    assert anisotropy(X, method=method) == pytest.approx(1.0, abs=1e-10)


def test_isotropic_gaussian_is_about_one_over_d():
    d, n = 16, 20000
    X = torch.randn(n, d, generator=torch.Generator().manual_seed(1))
    a = anisotropy(X)
    # sample covariance of n >> d isotropic points: top eigenvalue ~ (1 + sqrt(d/n))^2 ~ 1.06
    # times the mean eigenvalue (Marchenko-Pastur edge), so A lies a few % above 1/d
    assert 1.0 / d < a < 1.15 / d


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_routes_agree_and_match_numpy(dtype):
    g = torch.Generator().manual_seed(2)
    X = (torch.randn(500, 24, generator=g) * torch.linspace(0.2, 3.0, 24)).to(dtype)
    cov = anisotropy(X, method="covariance")
    svd = anisotropy(X, method="svd")
    # both routes run in float64 on the same (upcast) data: agreement limited by float64 only;
    # the issue asks for 1e-6
    assert cov == pytest.approx(svd, abs=1e-6)
    assert cov == pytest.approx(_svd_reference(X.float().numpy()), abs=1e-6)


def test_auto_uses_svd_when_n_below_d():
    X = torch.randn(10, 50, generator=torch.Generator().manual_seed(3))
    # n < d: the d x d covariance is rank-deficient but its top eigenvalue is still right
    assert anisotropy(X) == pytest.approx(anisotropy(X, method="covariance"), abs=1e-9)
    assert anisotropy(X) == pytest.approx(_svd_reference(X.numpy()), abs=1e-9)


def test_invariant_to_constant_offset():
    g = torch.Generator().manual_seed(4)
    X = torch.randn(2000, 32, generator=g, dtype=torch.float64) * torch.linspace(0.5, 2, 32,
                                                                                  dtype=torch.float64)
    offset = torch.randn(32, generator=g, dtype=torch.float64)
    offset = offset / offset.norm() * 1e4
    # float64 centring: an offset of norm 1e4 costs ~1e4 * 1e-16 relative, far below 1e-6
    assert anisotropy(X + offset) == pytest.approx(anisotropy(X), abs=1e-6)


def test_numpy_input():
    X = np.random.default_rng(5).normal(size=(100, 8))
    assert anisotropy(X) == pytest.approx(_svd_reference(X), abs=1e-10)


@pytest.mark.parametrize(
    "X, match",
    [
        (torch.tensor([[1.0, float("nan")], [0.0, 1.0]]), "NaN or Inf"),
        (torch.tensor([[1.0, float("inf")], [0.0, 1.0]]), "NaN or Inf"),
        (torch.ones(1, 4), "at least 2 rows"),
        (torch.ones(4), "2-D"),
        (torch.ones(2, 3, 4), "2-D"),
        (torch.ones(5, 4), "zero variance"),
    ],
)
def test_errors(X, match):
    with pytest.raises(ValueError, match=match) as err:
        anisotropy(X)
    assert "X" in str(err.value)  # names the argument (or says what X is)


def test_unknown_method():
    with pytest.raises(ValueError, match="method"):
        anisotropy(torch.randn(5, 3), method="eig")
