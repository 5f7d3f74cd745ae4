"""Share of near-duplicate states: points far closer to a neighbour than the bulk's spacing,
which make TwoNN read the jitter inside clumps. The batches and the search are
:mod:`knn_batches`.
"""

from __future__ import annotations

import numpy as np

from .._validation import check_fraction, check_int, check_matrix
from .knn_batches import Neighbours, search_batches

__all__ = ["near_duplicate_share"]


def near_duplicate_share(
    X,
    *,
    threshold: float = 0.01,
    reference_order: int = 64,
    batch_size: int = 4096,
    seed: int = 0,
) -> float:
    r"""Share of distinct points whose nearest neighbour is far closer than the bulk's spacing.

    .. math:: \text{share} = \frac{1}{N}
              \#\{i : r_1(i) < \tau \cdot \operatorname{median}_j r_K(j)\}

    with :math:`r_K` the distance to the ``K = reference_order``-th neighbour, computed per
    batch (same batches as :func:`twonn`) and pooled. Exact duplicates are removed first
    (reported as ``n_duplicates`` by the estimators) and do not count here.

    Why :math:`r_K` and not the median :math:`r_1`: when most states sit in tight clumps
    (e.g. the same character at the same position across windows, in a model at
    initialisation) the median :math:`r_1` is itself a within-clump distance and nothing looks
    far below it. The K-th neighbour reaches past clumps of fewer than K points, so the median
    :math:`r_K` measures the spacing of the bulk. Clumps of K points or more stay invisible.

    Threshold. For a smooth sample of a d-dimensional manifold,
    :math:`P(r_1 < \tau\,\text{median}\,r_K) \approx K \tau^d`: with the defaults
    (:math:`\tau = 0.01`, K = 64) about 0.6% for d = 2 and below 1e-4 for d >= 3 (it is
    meaningless for d = 1 curves, about 50%). A share well above that means near-duplicates,
    which make TwoNN read the jitter inside clumps (values near or below 1); trust the GRIDE
    orders larger than the clump size instead.

    Parameters
    ----------
    X : Tensor or ndarray, shape (n, d)
    threshold : float in (0, 1), keyword-only
    reference_order : int >= 1, keyword-only
        K; every batch needs more than K distinct points.
    batch_size : int >= 3, keyword-only
    seed : int, keyword-only

    Returns
    -------
    float in [0, 1]

    Examples
    --------
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(1000, 8, generator=g)
    >>> X[:100] = X[100:200] + 1e-4 * torch.randn(100, 8, generator=g)  # 100 near-copies
    >>> round(near_duplicate_share(X), 2)
    0.2
    """
    X = check_matrix(X, "X", min_rows=3)
    threshold = check_fraction(threshold, "threshold", include_low=False)
    reference_order = check_int(reference_order, "reference_order")
    batch_size = check_int(batch_size, "batch_size", minimum=3)
    seed = check_int(seed, "seed", minimum=None)
    found = search_batches(X, k=reference_order, batch_size=batch_size, seed=seed,
                           min_points=max(3, reference_order + 1),
                           what=f"the near-duplicate share with reference_order={reference_order}")
    return near_duplicate_share_from_neighbours(found, threshold, reference_order)


def near_duplicate_share_from_neighbours(found: Neighbours, threshold: float,
                                         reference_order: int) -> float:
    """The share from searched batches (at least ``reference_order`` neighbours each): r1
    against the bulk spacing, the median r_K of each batch, pooled over batches."""
    near = [int((r[:, 0] < threshold * np.median(r[:, reference_order - 1])).sum())
            for r in found.distances]
    return sum(near) / found.n_points
