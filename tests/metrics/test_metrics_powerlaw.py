"""alpha-ReQ against a spectrum with a known exponent, an independent numpy fit and reptrix."""

import numpy as np
import pytest
import torch

from repgeom.metrics import alpha_req


def with_spectrum(lam: np.ndarray, rng: np.random.Generator, offset: float = 0.0) -> np.ndarray:
    """2d points +-sqrt(lam_i) e_i in a random orthonormal frame (plus a common offset): the
    centred scatter matrix has exactly the eigenvalues `lam`."""
    d = len(lam)
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    F = np.diag(np.sqrt(lam)) @ Q.T
    return np.concatenate([F, -F]) + offset * rng.normal(size=d)


def fit_numpy(X: np.ndarray, first: int, last: int) -> tuple[float, float]:
    """The same weighted line from numpy's SVD and polyfit (weights 1/i on the squared
    residuals, which polyfit takes as their square roots), and its R^2."""
    Xc = X - X.mean(axis=0)
    lam = np.linalg.svd(Xc, compute_uv=False) ** 2
    i = np.arange(first, last + 1)
    y = np.log(lam[first - 1 : last])
    slope, intercept = np.polyfit(np.log(i), y, 1, w=np.sqrt(1.0 / i))
    pred = slope * np.log(i) + intercept
    r2 = 1 - ((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    return -slope, r2


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.3])
def test_exact_power_law_gives_its_exponent_and_r2_one(alpha):
    lam = np.arange(1, 129, dtype=np.float64) ** -alpha
    X = with_spectrum(lam, np.random.default_rng(0), offset=30.0)
    result = alpha_req(torch.tensor(X))
    # exact in exact arithmetic; float64 eigenvalues of the smallest (128^-2.3 = 1.4e-5 of the
    # largest) are accurate relative to themselves (gram_eigh), well within 1e-8
    assert result.alpha == pytest.approx(alpha, abs=1e-8)
    assert result.r2 == pytest.approx(1.0, abs=1e-10)
    assert (result.first, result.last) == (11, 100)


def test_scale_does_not_change_alpha():
    X = torch.randn(300, 120, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    X = X * torch.arange(1, 121, dtype=torch.float64) ** -0.7
    a, b = alpha_req(X), alpha_req(1e3 * X)
    assert a.alpha == pytest.approx(b.alpha, rel=1e-12)
    assert a.r2 == pytest.approx(b.r2, rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_an_independent_numpy_fit_on_noisy_spectra(seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(400, 150)) * np.arange(1, 151) ** -rng.uniform(0.3, 1.2)
    X = X @ np.linalg.qr(rng.normal(size=(150, 150)))[0]
    result = alpha_req(torch.tensor(X, dtype=torch.float32), ranks=(5, 120))
    alpha, r2 = fit_numpy(X.astype(np.float32).astype(np.float64), 5, 120)
    assert 0.9 < r2 < 1.0 and result.r2 < 1.0  # noisy: a fit, not an exact power law
    # float32 states, both sides computed in float64 from them: agreement to rounding
    assert result.alpha == pytest.approx(alpha, rel=1e-9)
    assert result.r2 == pytest.approx(r2, rel=1e-9)


def test_matches_reptrix_alpha():
    alpha_module = pytest.importorskip(
        "reptrix.alpha", reason="reptrix not installed: pip install --no-deps reptrix==0.1.0")
    rng = np.random.default_rng(3)
    X = rng.normal(size=(600, 160)) * np.arange(1, 161) ** -0.8
    X = (X @ np.linalg.qr(rng.normal(size=(160, 160)))[0]).astype(np.float32)
    theirs = alpha_module.get_alpha(torch.tensor(X))[0]  # its default range: ranks 11..100
    # reptrix reads the spectrum through sklearn's PCA of the float32 states (float32 SVD):
    # about 1e-6 relative on the eigenvalues, far less on the fitted slope
    assert alpha_req(torch.tensor(X)).alpha == pytest.approx(theirs, rel=1e-4)


def test_range_is_cut_to_the_positive_eigenvalues():
    lam = np.arange(1, 21, dtype=np.float64) ** -1.0
    X = with_spectrum(np.concatenate([lam, np.zeros(30)]), np.random.default_rng(1))
    result = alpha_req(torch.tensor(X), ranks=(2, 100))
    assert result.last == 20
    assert result.alpha == pytest.approx(1.0, abs=1e-8)


@pytest.mark.parametrize("ranks, match", [((5, 5), "first < last"), ((0, 9), "ranks"),
                                          ((40, 60), "positive")])
def test_bad_ranks_are_named(ranks, match):
    X = torch.randn(50, 30, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=match):
        alpha_req(X, ranks=ranks)


def test_a_direction_the_states_do_not_use_is_not_fitted():
    """A LayerNorm output lies in a hyperplane: its last eigenvalue is float32 rounding (about
    2e-15 of the largest), which must not enter the fit."""
    X = torch.randn(256, 40, generator=torch.Generator().manual_seed(0))
    X = X * torch.arange(1, 41) ** -0.5
    Y = torch.nn.functional.layer_norm(X, (40,))
    assert alpha_req(Y, ranks=(2, 40)).last == 39
    # and the fit does not move with the rounding: the same states, rounded otherwise
    Z = (Y.double() * (1 + 1e-7 * torch.randn(256, 40, generator=torch.Generator().manual_seed(1),
                                             dtype=torch.float64))).float()
    Z = Z - Z.mean(dim=1, keepdim=True)
    assert alpha_req(Z, ranks=(2, 40)).alpha == pytest.approx(alpha_req(Y, ranks=(2, 40)).alpha,
                                                            rel=1e-4)
