import numpy as np
import pytest
import torch
from id_datasets import DATASETS, N, _data, embed

from repgeom.metrics import TwoNNResult, twonn


@pytest.mark.parametrize("name", DATASETS)
def test_twonn_matches_scikit_dimension(name):
    import skdim

    X = _data(name)
    ours = twonn(torch.tensor(X), batch_size=N)  # one batch: the estimator the references use
    ref_lin = skdim.id.TwoNN(discard_fraction=0.1).fit(X).dimension_
    # same neighbours and the same least-squares fit; the only difference is float32 vs float64
    # distances (~1e-7 relative), far inside the 1%
    assert ours.dimension == pytest.approx(ref_lin, rel=1e-3)
    assert ours.n_batches == 1 and ours.n_points == N and ours.n_duplicates == 0


@pytest.mark.parametrize("name", DATASETS)
def test_twonn_matches_dadapy(name, dadapy_id_estimation):
    X = _data(name)
    ours = twonn(torch.tensor(X), batch_size=N)
    ie = dadapy_id_estimation(coordinates=X, maxk=3, verbose=False)
    lin, _, _ = ie.compute_id_2NN(algorithm="base", mu_fraction=0.9)
    mle, _, _ = ie.compute_id_2NN(algorithm="ml", mu_fraction=0.9)
    # float32 vs float64 distances only (see above); the issue asks for 1%
    assert ours.dimension == pytest.approx(lin, rel=1e-3)
    assert ours.mle == pytest.approx(mle, rel=1e-3)


def test_twonn_known_dimension():
    rng = np.random.default_rng(0)
    X = embed(rng.normal(size=(4000, 6)), 50, rng)
    r = twonn(X, batch_size=4000)
    # TwoNN on 4000 Gaussian points in 6-D: statistical error ~ d / sqrt(N) ~ 0.1, plus a
    # small downward bias from the curvature of the density; 10% is generous
    assert r.dimension == pytest.approx(6.0, rel=0.1)
    assert r.mle == pytest.approx(6.0, rel=0.1)


def test_duplicates_do_not_corrupt_twonn():
    X = _data("gauss5")
    X_dup = np.concatenate([X, X[:300], X[:50]])  # 350 exact copies
    clean = twonn(X, batch_size=10**6)
    dup = twonn(X_dup, batch_size=10**6)
    assert dup.n_duplicates == 350 and dup.n_points == N
    # duplicates removed first, leaving the same distinct points in one batch; only the
    # centring mean (taken before deduplication) differs, which moves the float32 data by
    # ~1e-7 relative
    assert dup.dimension == pytest.approx(clean.dimension, rel=1e-6)
    assert dup.mle == pytest.approx(clean.mle, rel=1e-6)


def test_batch_protocol():
    X = torch.randn(10000, 5, generator=torch.Generator().manual_seed(0))
    r = twonn(X)  # batch_size 4096 -> 2 batches of 5000
    assert isinstance(r, TwoNNResult)
    assert r.n_batches == 2 and r.n_points == 10000
    assert r.dimension_std > 0 and isinstance(r.dimension, float) and isinstance(r.n_batches, int)
    # each batch estimate has error ~ 5/sqrt(5000) ~ 0.07 plus a small bias
    assert r.dimension == pytest.approx(5.0, rel=0.1)
    # a different shuffle gives different batches, hence (slightly) different numbers
    assert twonn(X, seed=1).dimension != r.dimension
    assert twonn(X, seed=0) == r  # same seed, same result


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(discard_fraction=1.0), "discard_fraction"),
        (dict(batch_size=2), "batch_size"),
        (dict(seed=1.5), "seed"),
    ],
)
def test_twonn_option_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        twonn(torch.randn(50, 3), **kwargs)
