import numpy as np
import pytest
import torch

from repgeom.metrics import (
    GrideResult,
    IntrinsicDimensionResult,
    gride,
    intrinsic_dimension,
    mle_dimension,
    near_duplicate_share,
    twonn,
)


def test_one_search_gives_the_same_as_separate_calls():
    X = torch.randn(9000, 12, generator=torch.Generator().manual_seed(3))
    r = intrinsic_dimension(X, batch_size=4096, max_order=32)
    assert isinstance(r, IntrinsicDimensionResult) and isinstance(r.gride, GrideResult)
    tw = twonn(X, batch_size=4096)
    gr = gride(X, batch_size=4096, max_order=32)
    # identical batches and neighbours; k=2 vs k=32 FAISS searches return the same first two
    # neighbours, so equality is exact up to float32 distance rounding
    assert r.twonn.dimension == pytest.approx(tw.dimension, rel=1e-9)
    assert r.twonn.mle == pytest.approx(tw.mle, rel=1e-9)
    np.testing.assert_allclose(r.gride.dimension, gr.dimension, rtol=1e-9)
    assert r.gride.n_batches == r.twonn.n_batches == 2
    assert r.near_duplicate_share == near_duplicate_share(X, batch_size=4096, reference_order=32)


def test_near_duplicates_flagged_and_gride_sees_through_them():
    rng = np.random.default_rng(4)
    centres = rng.normal(size=(500, 10))
    # every state repeated 4 times with a tiny jitter: the character-at-position clumps
    X = np.repeat(centres, 4, axis=0) + 1e-4 * rng.normal(size=(2000, 10))
    r = intrinsic_dimension(X, batch_size=2000, max_order=64)
    assert r.near_duplicate_share > 0.9  # nearly every point has a near-copy
    # TwoNN reads the jitter inside a clump of 4 (ratios r2/r1 ~ 1) -> far below 10; at
    # order 64 the neighbours span ~16 clumps and GRIDE reads the 10-D bulk again
    assert r.twonn.dimension < 10 * 0.7
    assert r.gride.dimension[-1] > 5.0
    clean = near_duplicate_share(rng.normal(size=(2000, 10)))
    assert clean < 0.01  # ~ 64 * 0.01^10 expected for a 10-D sample, i.e. 0


@pytest.mark.parametrize("max_order", [32, 8])
def test_intrinsic_dimension_mle_is_mle_dimension(max_order):
    X = torch.randn(9000, 12, generator=torch.Generator().manual_seed(3))
    r = intrinsic_dimension(X, batch_size=4096, max_order=max_order)
    sep = mle_dimension(X, batch_size=4096)
    # one search for max(max_order, 20) neighbours; the exact search returns the same first
    # 20 neighbours whatever k it is asked for, so the MLE is identical
    assert r.mle.k == 20 and r.mle.n_batches == r.twonn.n_batches == 2
    assert r.mle.dimension == pytest.approx(sep.dimension, rel=1e-9)
    assert r.mle.dimension_std == pytest.approx(sep.dimension_std, rel=1e-6)
    # searching 20 > max_order neighbours leaves TwoNN, GRIDE and the share unchanged
    assert r.twonn.dimension == pytest.approx(twonn(X, batch_size=4096).dimension, rel=1e-9)
    gr = gride(X, batch_size=4096, max_order=max_order)
    np.testing.assert_allclose(r.gride.dimension, gr.dimension, rtol=1e-9)
    assert r.near_duplicate_share == near_duplicate_share(X, batch_size=4096,
                                                          reference_order=max_order)
    r40 = intrinsic_dimension(X, batch_size=4096, max_order=max_order, mle_k=40)
    assert r40.mle.k == 40
    assert r40.mle.dimension == pytest.approx(mle_dimension(X, k=40).dimension, rel=1e-9)
