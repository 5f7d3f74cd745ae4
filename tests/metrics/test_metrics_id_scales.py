"""TwoNN by decimation against DADApy, and the plateau rule against profiles with a known answer."""

import math

import numpy as np
import pytest
import torch

from repgeom.metrics import id_plateau, twonn_decimation


def _plane_with_noise(n: int, seed: int, noise: float = 0.01) -> np.ndarray:
    """A 2-D unit square in R^12 with isotropic 10-D Gaussian noise of std `noise`."""
    rng = np.random.default_rng(seed)
    X = np.zeros((n, 12))
    X[:, :2] = rng.uniform(size=(n, 2))
    X[:, 2:] = noise * rng.normal(size=(n, 10))
    return X


@pytest.mark.parametrize("name", ["plane_noise", "gauss5", "swissroll"])
@pytest.mark.parametrize("seed", [42, 7])
def test_twonn_decimation_equals_dadapy_on_the_same_subsets(name, seed, dadapy_id_estimation):
    rng = np.random.default_rng(1)
    if name == "plane_noise":
        X = _plane_with_noise(1500, 0)
    elif name == "gauss5":
        X = rng.normal(size=(1500, 5))
    else:
        from sklearn.datasets import make_swiss_roll

        X, _ = make_swiss_roll(1500, noise=0.0, random_state=0)
    ours = twonn_decimation(torch.tensor(X), seed=seed)  # float64 data: float64 distances
    ie = dadapy_id_estimation(coordinates=X, maxk=3, verbose=False, rng_seed=seed)
    ids, errs, rs = ie.return_id_scaling_2NN(n_min=10, algorithm="base", mu_fraction=0.9)
    _, _, sizes = dadapy_id_estimation(coordinates=X, maxk=3, verbose=False, rng_seed=seed
                                       ).return_id_scaling_2NN(return_sizes=True)
    assert ours.sizes.tolist() == sizes.tolist()
    # The same subsets (the same generator, seed and draws) and float64 distances on both sides;
    # what is left is DADApy's curve_fit against our closed-form least squares and the order of
    # float64 sums (~1e-12): 1e-6 is the bound.
    np.testing.assert_allclose(ours.dimension, ids, rtol=1e-6)
    np.testing.assert_allclose(ours.dimension_err, errs, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(ours.scale, rs, rtol=1e-6)
    assert ours.n_subsets.tolist() == [int(np.rint(1500 / s)) for s in sizes]


def test_decimation_reads_the_plane_at_large_scales_and_the_noise_at_small_ones():
    r = twonn_decimation(_plane_with_noise(4000, 3, noise=0.002), n_min=40)
    # At the smallest scale (mean neighbour distance 0.013, the noise's own scale 0.002 * sqrt(20)
    # = 0.009) the 10-D noise shows: measured 4.1; subsets of 62 points have neighbours ~0.08
    # apart, ten noise widths, and read the plane (2.05 measured; TwoNN's bias on 62 points is a
    # few percent, 15% leaves room for it).
    assert r.dimension[0] > 3
    assert r.dimension[-1] == pytest.approx(2.0, rel=0.15)
    assert (np.diff(r.scale) > 0).all()


def test_decimation_merges_duplicates_and_checks_its_options():
    X = np.random.default_rng(0).normal(size=(600, 4))
    r = twonn_decimation(np.concatenate([X, X[:100]]))
    assert r.n_points == 600 and r.n_duplicates == 100 and r.sizes[0] == 600
    with pytest.raises(ValueError, match="n_min"):
        twonn_decimation(X[:20], n_min=30)
    with pytest.raises(ValueError, match="discard_fraction"):
        twonn_decimation(X, discard_fraction=0.0)


def test_plateau_is_the_widest_flat_run_of_scales():
    scale = [1, 2, 4, 8, 16, 32, 64]
    dim = [12.0, 8.0, 5.0, 5.1, 4.95, 5.05, 3.0]
    r = id_plateau(scale, dim, [0.1] * 7)
    # 5.0, 5.1, 4.95, 5.05 agree within 0.1 or 5% of their mean; 8 and 3 do not.
    assert (r.low, r.high, r.n_points) == (4.0, 32.0, 4)
    assert r.dimension == pytest.approx(np.mean(dim[2:6]))
    # Order of the input does not matter; NaN points are left out.
    shuffled = id_plateau(scale[::-1] + [128], dim[::-1] + [math.nan], [0.1] * 8)
    assert (shuffled.low, shuffled.high, shuffled.n_points) == (4.0, 32.0, 4)


def test_plateau_noise_widens_the_tolerance_and_no_plateau_has_a_reason():
    scale, dim = [1, 2, 4, 8], [10.0, 7.0, 4.0, 1.0]
    none = id_plateau(scale, dim, [0.1] * 4)
    assert math.isnan(none.dimension) and none.n_points == 0 and "no plateau" in none.reason
    noisy = id_plateau(scale, dim, [6.0] * 4)  # all within 6 of their mean 5.5
    assert noisy.n_points == 4 and noisy.dimension == pytest.approx(5.5) and noisy.reason == ""
    assert "fewer than 3" in id_plateau([1, 2], [1.0, 1.0]).reason
    with pytest.raises(ValueError, match="shapes differ"):
        id_plateau([1, 2, 3], [1.0, 2.0])
    with pytest.raises(ValueError, match="scale"):
        id_plateau([0, 1, 2], [1.0, 1.0, 1.0])
