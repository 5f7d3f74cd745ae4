import numpy as np
import pytest
import torch

from repgeom.metrics import near_duplicate_share


def test_near_duplicate_share_example():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(1000, 8, generator=g)
    X[:100] = X[100:200] + 1e-4 * torch.randn(100, 8, generator=g)
    # 100 jittered copies and their 100 originals; for 8-D Gaussian points r1 < 0.01 x median
    # r_64 has probability ~ 64 * 1e-16
    assert near_duplicate_share(X) == pytest.approx(0.2)


def _manifold(kind: str, d: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """n points of a clean d-dimensional manifold, embedded in 64 dimensions."""
    if kind == "gaussian":
        Z = rng.normal(size=(n, d))
    elif kind == "cube":
        Z = rng.uniform(size=(n, d))
    else:  # "sphere": the unit d-sphere in d + 1 dimensions, a curved manifold
        Z = rng.normal(size=(n, d + 1))
        Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    Q, _ = np.linalg.qr(rng.normal(size=(64, 64)))
    return Z @ Q[: Z.shape[1]]


@pytest.mark.parametrize("kind", ["gaussian", "cube", "sphere"])
@pytest.mark.parametrize("d", [2, 3, 4, 6, 10])
def test_probe_threshold_reads_clean_manifolds_as_free_of_near_duplicates(kind, d):
    # The probe's default threshold (ProbeSettings) with its reference order 64 on 4096 points,
    # one batch: a clean manifold of dimension 2-10 must read under 1%. The bound
    # P(r1 < tau * median r64) ~ 64 tau^d gives 0.16% at d = 2 for tau = 0.005.
    from repgeom.probes.core.measure import ProbeSettings

    threshold = ProbeSettings().near_duplicate_threshold
    X = _manifold(kind, d, 4096, np.random.default_rng(d))
    assert near_duplicate_share(X, threshold=threshold, reference_order=64) < 0.01


def test_old_threshold_flagged_clean_low_dimensional_data():
    # Why the threshold changed (issue: 0.1 flagged 43% of a clean 2-D manifold).
    X = _manifold("gaussian", 2, 4096, np.random.default_rng(2))
    assert near_duplicate_share(X, threshold=0.1, reference_order=64) > 0.2


@pytest.mark.parametrize("d", [2, 6, 10])
def test_probe_threshold_still_catches_planted_near_duplicates(d):
    # 5% of the points get a near-copy at 1e-4 of the bulk's scale: both members of each pair
    # have r1 far below the bulk spacing, so the share reads about 10%.
    from repgeom.probes.core.measure import ProbeSettings

    rng = np.random.default_rng(100 + d)
    X = _manifold("gaussian", d, 3900, rng)
    copies = X[:196] + 1e-4 * rng.normal(size=(196, X.shape[1]))
    share = near_duplicate_share(
        np.concatenate([X, copies]), threshold=ProbeSettings().near_duplicate_threshold,
        reference_order=64,
    )
    assert share == pytest.approx(2 * 196 / 4096, abs=0.01)
