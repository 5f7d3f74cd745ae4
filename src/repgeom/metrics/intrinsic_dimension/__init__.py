"""TwoNN, GRIDE, the MLE and the near-duplicate share from one kNN search per batch: the probe's
entry point. Each estimator is its own module (:mod:`twonn`, :mod:`gride`, :mod:`mle`,
:mod:`near_duplicates`); the batches and the search they share are :mod:`knn_batches`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._validation import check_fraction, check_int, check_matrix
from .gride import GrideResult, check_max_order, gride_from_neighbours
from .knn_batches import Neighbours, search_batches
from .mle import MLE_NEIGHBORS, MLEResult, mle_from_neighbours
from .near_duplicates import near_duplicate_share_from_neighbours
from .twonn import TwoNNResult, twonn_from_neighbours

__all__ = ["IntrinsicDimensionResult", "intrinsic_dimension"]


@dataclass(frozen=True, eq=False)
class IntrinsicDimensionResult:
    """TwoNN, GRIDE, the MLE and the near-duplicate share from one search per batch."""

    twonn: TwoNNResult
    gride: GrideResult
    near_duplicate_share: float
    mle: MLEResult
    neighbours: Neighbours | None = None
    """The searched batches all four read (each point's distances: `mle.local_mle`)."""


def intrinsic_dimension(
    X,
    *,
    discard_fraction: float = 0.1,
    batch_size: int = 4096,
    max_order: int = 64,
    near_duplicate_threshold: float = 0.01,
    mle_k: int = MLE_NEIGHBORS,
    seed: int = 0,
) -> IntrinsicDimensionResult:
    """TwoNN, GRIDE, the MLE and the near-duplicate share from a single kNN search per batch.

    The probe's entry point: one exact search for ``max(max_order, mle_k)`` neighbours per
    batch feeds :func:`twonn` (orders 1, 2), :func:`gride` (orders up to ``max_order``, on the
    same batches, so ``gride.n_batches == twonn.n_batches``), :func:`mle_dimension` (orders 1
    to ``mle_k``) and :func:`near_duplicate_share` (orders 1 and
    ``reference_order = max_order``). Each part equals what the separate function returns with
    the same ``batch_size``, ``seed`` (and ``reference_order=max_order``, ``k=mle_k``).

    The search covers ``mle_k`` even when ``max_order`` is smaller (rather than cutting the MLE
    to ``max_order`` neighbours), so the MLE means the same thing whatever ``max_order`` is; at
    the defaults (64 and 20) the search is the one GRIDE needs anyway. The FAISS search is
    exact, so searching more neighbours leaves the first ``max_order`` unchanged.

    Parameters
    ----------
    X : Tensor or ndarray, shape (n, d)
    discard_fraction, batch_size, seed : as in :func:`twonn`
    max_order : as in :func:`gride`; each batch needs more than ``max_order`` distinct points.
    near_duplicate_threshold : the ``threshold`` of :func:`near_duplicate_share`, whose
        ``reference_order`` is ``max_order`` here
    mle_k : the ``k`` of :func:`mle_dimension` (20); each batch needs more than
        ``max(max_order, mle_k)`` distinct points.

    Returns
    -------
    IntrinsicDimensionResult
        Fields ``twonn`` (TwoNNResult), ``gride`` (GrideResult), ``near_duplicate_share``
        (float), ``mle`` (MLEResult).

    Examples
    --------
    >>> import torch
    >>> r = intrinsic_dimension(torch.randn(1000, 5, generator=torch.Generator().manual_seed(0)),
    ...                         max_order=16)
    >>> r.gride.orders, r.twonn.n_points, r.mle.k
    ((2, 4, 8, 16), 1000, 20)
    """
    X = check_matrix(X, "X", min_rows=3)
    discard_fraction = check_fraction(discard_fraction, "discard_fraction", include_low=False)
    batch_size = check_int(batch_size, "batch_size", minimum=3)
    max_order = check_max_order(max_order)
    threshold = check_fraction(near_duplicate_threshold, "near_duplicate_threshold",
                               include_low=False)
    mle_k = check_int(mle_k, "mle_k", minimum=2)
    seed = check_int(seed, "seed", minimum=None)
    k = max(max_order, mle_k)
    what = (f"GRIDE with max_order={max_order}" if max_order >= mle_k
            else f"the MLE with mle_k={mle_k}")
    found = search_batches(X, k=k, batch_size=batch_size, seed=seed, min_points=k + 1,
                           what=what)
    return IntrinsicDimensionResult(
        twonn=twonn_from_neighbours(found, discard_fraction),
        gride=gride_from_neighbours(found, max_order),
        near_duplicate_share=near_duplicate_share_from_neighbours(found, threshold, max_order),
        mle=mle_from_neighbours(found, mle_k),
        neighbours=found,
    )
