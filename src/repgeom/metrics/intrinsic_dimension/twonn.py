"""TwoNN intrinsic dimension (Facco et al. 2017) in the reference convention of DADApy and
scikit-dimension: float32 search, exact duplicates removed, the smallest 90% of the ratios fitted.

The Shape of Learning authors' own variant (llm-microscope) is :mod:`twonn_authors`; both are
probed. The batches and the search are :mod:`knn_batches`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._validation import check_fraction, check_int, check_matrix
from .knn_batches import Neighbours, search_batches

__all__ = ["TwoNNResult", "twonn"]


@dataclass(frozen=True)
class TwoNNResult:
    """TwoNN estimate (Facco et al. 2017), mean and std over batches.

    dimension, dimension_std : linear fit through the origin (the paper's estimator).
    mle, mle_std : maximum likelihood ``(N - 1) / sum(log mu)``.
    n_batches : number of batches. n_points : distinct points used.
    n_duplicates : rows removed as duplicates, equal up to rounding (see ``DUPLICATE_ULPS``),
        plus any point whose nearest distance was still 0, which is dropped from the ratios.
    """

    dimension: float
    dimension_std: float
    mle: float
    mle_std: float
    n_batches: int
    n_points: int
    n_duplicates: int


def twonn(
    X, *, discard_fraction: float = 0.1, batch_size: int = 4096, seed: int = 0
) -> TwoNNResult:
    r"""TwoNN intrinsic dimension (Facco, d'Errico, Rodriguez & Laio 2017, Sci. Rep. 7:12140).

    For each point, :math:`\mu = r_2 / r_1` (distances to its two nearest other points)
    follows a Pareto law :math:`F(\mu) = 1 - \mu^{-d}`. Sorting the N ratios and setting
    :math:`F_\text{emp}(\mu_{(i)}) = i/N`, the paper fits :math:`y = d\,x` through the origin
    by least squares with :math:`x = \log\mu`, :math:`y = -\log(1 - F_\text{emp})`, after
    discarding the largest ``discard_fraction`` of the ratios (the first
    ``int(N * (1 - discard_fraction))`` sorted ratios are kept, as in scikit-dimension and
    DADApy). The maximum-likelihood form :math:`(N-1)/\sum_i \log\mu_i` (all ratios) is
    returned too. Protocol of the paper: shuffle, batches of at least ``batch_size`` points,
    mean and standard deviation over batches (see
    :mod:`repgeom.metrics.intrinsic_dimension.knn_batches`).

    Parameters
    ----------
    X : Tensor or ndarray, shape (n, d)
        Points; any float dtype and device (the search runs in float32 on ``X``'s device).
    discard_fraction : float in (0, 1), keyword-only
        0 would keep the largest ratio, whose empirical CDF is 1: ``-log(1 - F)`` is infinite.
    batch_size : int >= 3, keyword-only
    seed : int, keyword-only
        Seed of the shuffle.

    Returns
    -------
    TwoNNResult

    Raises
    ------
    ValueError
        On NaN/Inf, wrong shape, bad options, or a batch with fewer than 3 distinct points.

    Notes
    -----
    TwoNN reads the smallest scale of the data: near-duplicates (points far closer to each
    other than to anything else) pull it towards 0. Check :func:`near_duplicate_share` and the
    multi-scale :func:`gride`, or call :func:`intrinsic_dimension` for all three at once.

    Examples
    --------
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(2000, 3, generator=g) @ torch.randn(3, 50, generator=g)  # 3-D plane
    >>> r = twonn(X)
    >>> 2.7 < r.dimension < 3.3
    True
    """
    X = check_matrix(X, "X", min_rows=3)
    discard_fraction = check_fraction(discard_fraction, "discard_fraction", include_low=False)
    batch_size = check_int(batch_size, "batch_size", minimum=3)
    seed = check_int(seed, "seed", minimum=None)
    found = search_batches(X, k=2, batch_size=batch_size, seed=seed, min_points=3, what="TwoNN")
    return twonn_from_neighbours(found, discard_fraction)


def twonn_from_neighbours(found: Neighbours, discard_fraction: float) -> TwoNNResult:
    """TwoNN from searched batches (at least 2 neighbours each), mean and std over batches."""
    dims, mles = [], []
    for r in found.distances:
        d, m = twonn_from_ratios(r[:, 1] / r[:, 0], discard_fraction)
        dims.append(d)
        mles.append(m)
    return TwoNNResult(
        dimension=float(np.mean(dims)), dimension_std=float(np.std(dims)),
        mle=float(np.mean(mles)), mle_std=float(np.std(mles)),
        n_batches=found.n_batches, n_points=found.n_points, n_duplicates=found.n_duplicates,
    )


def twonn_from_ratios(mu: np.ndarray, discard_fraction: float) -> tuple[float, float]:
    """(linear-fit dimension, MLE) from the ratios mu = r2/r1 of one batch (float64)."""
    N = mu.shape[0]
    log_mu = np.log(mu)
    mle = (N - 1) / log_mu.sum()
    n_keep = int(N * (1 - discard_fraction))
    if n_keep < 1:
        raise ValueError(f"discard_fraction={discard_fraction} leaves no ratio of {N} to fit")
    x = np.sort(log_mu)[:n_keep]
    y = -np.log(1.0 - np.arange(1, n_keep + 1) / N)
    xx = float(x @ x)
    dim = float(x @ y) / xx if xx > 0 else math.inf
    return dim, float(mle)

