import numpy as np
import pytest
import torch
from id_datasets import N, _data

from repgeom.metrics import batch_indices, gride, intrinsic_dimension, near_duplicate_share, twonn


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_copies_that_differ_only_by_the_sign_of_zero_are_duplicates(dtype) -> None:
    X = _data("gauss5").astype(dtype)
    X[:, 0] = 0.0
    copies = X[:40].copy()
    copies[:, 0] = -0.0
    r = twonn(np.concatenate([X, copies]), batch_size=10**6)
    assert r.n_duplicates == 40 and r.n_points == N and r.n_batches == 1
    assert r.dimension == pytest.approx(twonn(X, batch_size=10**6).dimension, rel=1e-6)


def test_copies_that_differ_by_rounding_are_duplicates_and_larger_jitter_is_not() -> None:
    """The same state computed in two batch rows may differ in its last bits (BLAS kernels
    round rows differently): such copies are one state; copies 1e-4 apart are not."""
    X = torch.from_numpy(_data("gauss5")).to(torch.float32)
    ulp_noise = X[:40] * (1 + 2 * torch.finfo(torch.float32).eps * torch.randn(40, X.shape[1]))
    assert (ulp_noise != X[:40]).any()
    rounded = twonn(torch.cat([X, ulp_noise]), batch_size=10**6)
    assert rounded.n_duplicates == 40 and rounded.n_points == N
    jittered = twonn(torch.cat([X, X[:40] + 1e-4]), batch_size=10**6)
    assert jittered.n_duplicates == 0 and jittered.n_points == N + 40


def test_batches_hold_at_least_batch_size_rows_and_duplicates_go_within_each():
    # 2 x 500 rows with 40 copies: still two batches (the rule counts rows, as for every
    # other per-layer metric), each deduplicated on its own.
    X = _data("gauss5")[:960]
    r = twonn(np.concatenate([X, X[:40]]), batch_size=500, seed=3)
    assert r.n_batches == 2
    halves = batch_indices(1000, 500, seed=3)
    same_batch = sum(  # copies (rows 960..999) whose original (row - 960) shares their batch
        len({i for i in h.tolist() if i < 40} & {i - 960 for i in h.tolist() if i >= 960})
        for h in halves
    )
    assert 0 < same_batch < 40  # this draw splits some pairs and keeps others together
    assert r.n_duplicates == same_batch and r.n_points == 1000 - same_batch


def test_too_few_distinct_points():
    X = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    with pytest.raises(ValueError, match="2 distinct points .* at least 3 distinct"):
        twonn(X)


@pytest.mark.parametrize(
    "X, match",
    [
        (torch.tensor([[float("nan"), 0.0]] * 5), "NaN or Inf"),
        (torch.randn(2, 3), "at least 3 rows"),
        (torch.randn(5), "2-D"),
    ],
)
@pytest.mark.parametrize("fn", [twonn, gride, near_duplicate_share, intrinsic_dimension])
def test_input_errors(fn, X, match):
    with pytest.raises(ValueError, match=f"X .*{match}|X.*{match}"):
        fn(X)
