import math

import numpy as np
import pytest
import torch

from repgeom.metrics import (
    isotropic_cosine_baseline,
    isotropic_mean_cosine_chance,
    mean_cosine_similarity,
)


def _brute_force_mean_cosine(X: np.ndarray) -> float:
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    C = U @ U.T
    n = len(X)
    return float((C.sum() - np.trace(C)) / (n * (n - 1)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_equals_brute_force(dtype):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 7)) + rng.normal(size=7)  # offset so the mean cosine is not ~0
    got = mean_cosine_similarity(torch.tensor(X, dtype=dtype))
    ref = _brute_force_mean_cosine(torch.tensor(X, dtype=dtype).double().numpy())
    # same float64 arithmetic in a different order: agreement to ~1e-14
    assert got == pytest.approx(ref, abs=1e-12)


def test_all_same_direction_is_one():
    X = torch.tensor([[1.0, 2.0], [2.0, 4.0], [0.5, 1.0]])
    assert mean_cosine_similarity(X) == pytest.approx(1.0, abs=1e-12)


def test_centred_gaussian_is_about_zero():
    n, d = 4000, 32
    X = torch.randn(n, d, generator=torch.Generator().manual_seed(1))
    # exact standard deviation under isotropy: sqrt(2 / (d n (n-1))); allow 5 sigma
    sigma = math.sqrt(2.0 / (d * n * (n - 1)))
    assert abs(mean_cosine_similarity(X)) < 5 * sigma


def test_zero_row_is_an_error():
    with pytest.raises(ValueError, match="all-zero row"):
        mean_cosine_similarity(torch.tensor([[0.0, 0.0], [1.0, 0.0]]))


@pytest.mark.parametrize(
    "X, match",
    [
        (torch.tensor([[1.0, float("nan")], [0.0, 1.0]]), "NaN or Inf"),
        (torch.ones(1, 4), "at least 2 rows"),
        (torch.ones(4), "2-D"),
    ],
)
def test_errors(X, match):
    with pytest.raises(ValueError, match=match):
        mean_cosine_similarity(X)


def test_mean_chance_matches_brute_force_monte_carlo():
    n, d, draws = 40, 8, 3000
    rng = np.random.default_rng(123)
    means = np.array([_brute_force_mean_cosine(rng.normal(size=(n, d))) for _ in range(draws)])
    sigma = math.sqrt(2.0 / (d * n * (n - 1)))  # exact std of the mean cosine
    assert means.std() == pytest.approx(sigma, rel=0.05)  # sanity of the reference itself
    for q in (0.5, 0.95):
        got = isotropic_mean_cosine_chance(n, d, quantile=q, n_draws=draws, seed=0)
        # two independent Monte-Carlo quantile estimates from 3000 draws each: standard error
        # of each ~0.03-0.05 sigma here, so 0.25 sigma is > 3 combined standard errors
        assert got == pytest.approx(np.quantile(means, q), abs=0.25 * sigma)


def test_mean_chance_large_n_approaches_chi_square_limit():
    from scipy.stats import chi2

    n, d = 3000, 64
    limit = (chi2.ppf(0.95, d) / d - 1) / (n - 1)
    # CLT limit is exact up to O(1/n); Monte-Carlo error of the 95th percentile with 2000
    # draws is ~3% of its value
    assert isotropic_mean_cosine_chance(n, d) == pytest.approx(limit, rel=0.1)


def test_mean_chance_is_deterministic():
    first = isotropic_mean_cosine_chance(100, 16, seed=3)
    assert first == isotropic_mean_cosine_chance(100, 16, seed=3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n=1, d=8), "n must be"),
        (dict(n=10, d=1), "d must be"),
        (dict(n=10, d=8, quantile=1.0), "quantile"),
        (dict(n=10, d=8, n_draws=2), "n_draws"),
        (dict(n=10.5, d=8), "n must be"),
    ],
)
def test_mean_chance_errors(kwargs, match):
    n, d = kwargs.pop("n"), kwargs.pop("d")
    with pytest.raises(ValueError, match=match):
        isotropic_mean_cosine_chance(n, d, **kwargs)


@pytest.mark.parametrize("d", [16, 128, pytest.param(768, marks=pytest.mark.slow)])
def test_godey_baseline_matches_monte_carlo_of_one_pair(d):
    # Godey et al. 2024, appendix B: the 95th percentile of the cosine of pairs of N(0, I_d)
    # draws. 200,000 independent pairs: the quantile's standard error is ~0.4% of its value.
    rng = np.random.default_rng(d)
    a, b = rng.normal(size=(2, 200_000, d)).astype(np.float32)
    cosines = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert isotropic_cosine_baseline(d) == pytest.approx(np.quantile(cosines, 0.95), rel=0.02)


def test_godey_baseline_is_the_papers_scale_and_far_above_the_mean_chance():
    # ~1.645 / sqrt(d) for large d (normal limit of sqrt(d) * cosine); appendix B's Fig. 18
    # reads about 0.15 at d = 128, where the mean over 4096 states has a chance level ~5e-5.
    assert isotropic_cosine_baseline(128) == pytest.approx(1.645 / math.sqrt(128), rel=0.02)
    assert isotropic_mean_cosine_chance(4096, 128) < 1e-3 * isotropic_cosine_baseline(128)
    assert isotropic_cosine_baseline(128, quantile=0.5) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize(
    "d, kwargs, match",
    [(1, {}, "d must be"), (8, dict(quantile=1.0), "quantile"), (8.5, {}, "d must be")],
)
def test_godey_baseline_errors(d, kwargs, match):
    with pytest.raises(ValueError, match=match):
        isotropic_cosine_baseline(d, **kwargs)
