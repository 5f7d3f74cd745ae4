"""Layer linearity against known answers and an independent (numpy normal-equations) fit."""

import numpy as np
import pytest
import torch

from repgeom.metrics.linearity import linearity


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_a_linear_image_scores_one_whatever_the_map_scale_and_offset():
    X = torch.randn(400, 16, generator=_gen(0))
    A = torch.randn(16, 24, generator=_gen(1))
    # 1e-9: float64 least squares on a well-conditioned 400 x 16 design.
    assert linearity(X, 5.0 * X @ A - 2.0) == pytest.approx(1.0, abs=1e-9)
    assert linearity(X.float(), (X @ A).float()) == pytest.approx(1.0, abs=1e-6)  # float32 in


def test_an_independent_target_scores_d_over_n():
    # E[explained share of a random target] = d / n for an (n, d) Gaussian design (the hat
    # matrix has trace d, minus one for the centring: (d) / (n - 1)); 2000 x 20: 0.01.
    X = torch.randn(2000, 20, generator=_gen(2))
    Y = torch.randn(2000, 30, generator=_gen(3))
    assert linearity(X, Y) == pytest.approx(20 / 1999, abs=0.004)  # ~4 std over 30 targets


def test_equals_normal_equations_in_numpy():
    X = torch.randn(300, 6, generator=_gen(4))
    Y = torch.tanh(X @ torch.randn(6, 5, generator=_gen(5))) + 0.3 * torch.randn(300, 5,
                                                                                  generator=_gen(6))
    x = X.double().numpy()
    y = Y.double().numpy()
    x = x - x.mean(0)
    y = y - y.mean(0)
    x, y = x / np.linalg.norm(x), y / np.linalg.norm(y)
    A = np.linalg.solve(x.T @ x, x.T @ y)  # independent: the normal equations
    expected = 1.0 - np.linalg.norm(x @ A - y) ** 2
    assert 0.3 < expected < 0.99  # a partly linear map, not a degenerate case
    assert linearity(X, Y) == pytest.approx(expected, rel=1e-9)


def test_bad_inputs_name_the_argument():
    X = torch.randn(10, 3)
    with pytest.raises(ValueError, match="same number of rows"):
        linearity(X, torch.randn(9, 3))
    with pytest.raises(ValueError, match="Y is constant"):
        linearity(X, torch.ones(10, 2))
    with pytest.raises(ValueError, match="X"):
        linearity(torch.full((10, 3), float("nan")), X)
