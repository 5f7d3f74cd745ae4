"""Linear CKA from the unbiased HSIC (Song et al. 2012): ~0 on independent states where the
biased form reads ~0.2, the biased value for many rows, and two independent implementations."""

import numpy as np
import pytest
import torch

from repgeom.metrics import linear_cka, linear_cka_unbiased


def hsic1_numpy(K: np.ndarray, L: np.ndarray) -> float:
    """Song et al. 2012 (JMLR 13), theorem 2, written from the formula with n x n matrices."""
    n = K.shape[0]
    K, L = K.copy(), L.copy()
    np.fill_diagonal(K, 0.0)
    np.fill_diagonal(L, 0.0)
    one = np.ones(n)
    return (np.trace(K @ L) + (one @ K @ one) * (one @ L @ one) / ((n - 1) * (n - 2))
            - 2.0 / (n - 2) * (one @ K @ L @ one)) / (n * (n - 3))


def cka_u_numpy(X: np.ndarray, Y: np.ndarray) -> float:
    K, L = X @ X.T, Y @ Y.T  # uncentred: the estimator is translation invariant
    return hsic1_numpy(K, L) / np.sqrt(hsic1_numpy(K, K) * hsic1_numpy(L, L))


@pytest.mark.parametrize("n, d1, d2", [(8, 3, 5), (32, 8, 8), (200, 20, 7), (50, 80, 120)])
def test_equals_the_formula_written_with_gram_matrices(n, d1, d2):
    rng = np.random.default_rng(n + d1)
    X = rng.normal(size=(n, d1)) + 5.0
    Y = X @ rng.normal(size=(d1, d2)) + rng.normal(size=(n, d2))
    # float64 both sides; the feature-space sums and the Gram sums differ by rounding only
    assert linear_cka_unbiased(torch.tensor(X), torch.tensor(Y)) == pytest.approx(
        cka_u_numpy(X, Y), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("n, d1, d2", [(16, 4, 9), (100, 30, 10)])
def test_equals_ckatorch_unbiased(n, d1, d2, ckatorch_cka_base):
    rng = np.random.default_rng(d2)
    X = rng.normal(size=(n, d1))
    Y = np.tanh(X @ rng.normal(size=(d1, d2))) + 0.5 * rng.normal(size=(n, d2))
    ref = float(ckatorch_cka_base(torch.tensor(X), torch.tensor(Y), kernel="linear",
                                  unbiased=True))
    # ckatorch: Kornblith et al.'s unbiased centring of the Gram matrices (the same U-statistic)
    assert linear_cka_unbiased(torch.tensor(X), torch.tensor(Y)) == pytest.approx(ref, rel=1e-9)


def test_independent_states_at_n32_read_zero_where_the_biased_form_reads_02():
    biased, unbiased = [], []
    for seed in range(200):
        g = torch.Generator().manual_seed(seed)
        X, Y = torch.randn(32, 8, generator=g), torch.randn(32, 8, generator=g)
        biased.append(linear_cka(X, Y))
        unbiased.append(linear_cka_unbiased(X, Y))
    # measured: biased 0.199 (MONAI PR #9129 reports ~0.2), unbiased -0.003 with a per-draw std
    # of 0.045, so its mean over 200 draws has a standard error of 0.003
    assert 0.17 < np.mean(biased) < 0.23
    assert abs(np.mean(unbiased)) < 0.015


def test_equals_the_biased_form_for_many_rows():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(20000, 6, generator=g, dtype=torch.float64)
    Y = X @ torch.randn(6, 4, generator=g, dtype=torch.float64) + torch.randn(20000, 4,
                                                                            generator=g)
    # the bias of HSIC_0 is O(1/n): at n = 20000 the two differ by about 1e-4
    assert linear_cka_unbiased(X, Y) == pytest.approx(linear_cka(X, Y), abs=1e-3)
    assert linear_cka_unbiased(X, 3.0 * X + 2.0) == pytest.approx(1.0, abs=1e-12)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="at least 4"):
        linear_cka_unbiased(torch.randn(3, 2), torch.randn(3, 2))
    with pytest.raises(ValueError, match="constant"):
        linear_cka_unbiased(torch.ones(10, 3), torch.randn(10, 3))
