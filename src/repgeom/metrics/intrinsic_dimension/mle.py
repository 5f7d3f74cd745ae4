"""Levina-Bickel maximum-likelihood intrinsic dimension with MacKay-Ghahramani averaging
(scikit-dimension's ``skdim.id.MLE``). The batches and the search are :mod:`knn_batches`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._validation import check_int, check_matrix
from .knn_batches import Neighbours, search_batches

__all__ = ["MLEResult", "mle_dimension", "MLE_NEIGHBORS", "local_mle"]

# Neighbours of the Levina-Bickel MLE: scikit-dimension's default for skdim.id.MLE
# (MLE._N_NEIGHBORS = 20, v0.3); the one place this default is written.
MLE_NEIGHBORS = 20


@dataclass(frozen=True)
class MLEResult:
    """Levina-Bickel MLE with MacKay-Ghahramani averaging, mean and std over batches.

    dimension, dimension_std : the estimate, mean and (population) std over batches.
    k : neighbours per point.
    n_batches, n_points, n_duplicates : as in :class:`TwoNNResult`.
    """

    dimension: float
    dimension_std: float
    k: int
    n_batches: int
    n_points: int
    n_duplicates: int


def mle_dimension(
    X, *, k: int = MLE_NEIGHBORS, batch_size: int = 4096, seed: int = 0
) -> MLEResult:
    r"""Levina-Bickel maximum-likelihood intrinsic dimension, MacKay-Ghahramani averaging.

    Levina & Bickel 2005 ("Maximum Likelihood Estimation of Intrinsic Dimension", NIPS 17,
    section 2) model the neighbours of a point as a Poisson process of rate ``~ r^(m-1)``; the
    MLE of the dimension from its ``k`` nearest distances :math:`T_1 \le \dots \le T_k` is

    .. math:: \hat m_k(x) = \Big[\frac{1}{k-1}\sum_{j=1}^{k-1}
              \log\frac{T_k(x)}{T_j(x)}\Big]^{-1}.

    Levina & Bickel average :math:`\hat m_k(x)` over the points; MacKay & Ghahramani (2005,
    "Comments on 'Maximum Likelihood Estimation of Intrinsic Dimension'") showed that averaging
    the *inverses* is the maximum-likelihood combination of the points (each inverse is a mean
    of log-ratios) and less biased; that is what is returned:

    .. math:: \hat m_k = \Big[\frac{1}{N}\sum_x \hat m_k(x)^{-1}\Big]^{-1}.

    This is scikit-dimension's ``skdim.id.MLE()`` with its defaults (``unbiased=False``, i.e.
    ``k - 1`` in the numerator; ``comb="mle"``; no noise model; ``n_neighbors=20``). The
    neighbour distances come from the same exact search as :func:`twonn` and :func:`gride`,
    with the same batches (shuffle with ``seed``, batches of at least ``batch_size``, mean and
    std over batches; see :mod:`repgeom.metrics.intrinsic_dimension.knn_batches`).

    Parameters
    ----------
    X : Tensor or ndarray, shape (n, d)
        Points; any float dtype and device (searched in float32 on ``X``'s device).
    k : int >= 2, keyword-only
        Neighbours per point (20, scikit-dimension's default); each batch needs more than ``k``
        distinct points. Small ``k`` is noisy, large ``k`` reads larger scales (curvature
        biases the estimate down).
    batch_size : int >= 3, keyword-only
    seed : int, keyword-only

    Returns
    -------
    MLEResult

    Raises
    ------
    ValueError
        On NaN/Inf, wrong shape, bad options, or a batch with ``k`` or fewer distinct points.

    Notes
    -----
    Averaging inverses also keeps ties harmless: a point whose ``k`` distances are all equal
    has an infinite :math:`\hat m_k(x)` but a zero inverse. Exact duplicates are removed first,
    as for TwoNN (a zero distance would make a logarithm infinite).

    Examples
    --------
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(2000, 4, generator=g) @ torch.randn(4, 30, generator=g)  # 4-D plane
    >>> r = mle_dimension(X)
    >>> 3.5 < r.dimension < 4.5, r.k
    (True, 20)
    """
    X = check_matrix(X, "X", min_rows=3)
    k = check_int(k, "k", minimum=2)
    batch_size = check_int(batch_size, "batch_size", minimum=3)
    seed = check_int(seed, "seed", minimum=None)
    found = search_batches(X, k=k, batch_size=batch_size, seed=seed, min_points=k + 1,
                           what=f"the MLE with k={k}")
    return mle_from_neighbours(found, k)


def mle_from_neighbours(found: Neighbours, k: int) -> MLEResult:
    """The MLE from searched batches (at least ``k`` neighbours each), mean and std over
    batches."""
    dims = [_mle_from_distances(r, k) for r in found.distances]
    return MLEResult(
        dimension=float(np.mean(dims)), dimension_std=float(np.std(dims)), k=k,
        n_batches=found.n_batches, n_points=found.n_points, n_duplicates=found.n_duplicates,
    )


def local_mle(found: Neighbours, k: int, n: int) -> np.ndarray:
    r"""Each point's own Levina-Bickel estimate from its ``k`` nearest distances (the local
    intrinsic dimension of Viswanathan et al. 2025, "The geometry of tokens in internal
    representations of large language models"):

    .. math:: \hat m_k(x) = \Big[\frac{1}{k-1}\sum_{j=1}^{k-1}
              \log\frac{T_k(x)}{T_j(x)}\Big]^{-1},

    scikit-dimension's ``MLE().fit(...).dimension_pw_`` on the same distances (its defaults:
    no noise model, ``k - 1``), read from the searched batches of `mle_from_neighbours`.

    Returns
    -------
    (n,) float64 ndarray
        Indexed by row of the searched ``X`` (`Neighbours.rows`); NaN for rows that were
        merged as duplicates; ``inf`` where all ``k`` distances are equal.
    """
    out = np.full(n, np.nan)
    for r, rows in zip(found.distances, found.rows, strict=True):
        log_r = np.log(r[:, :k])
        inv = (log_r[:, k - 1:k] - log_r[:, : k - 1]).sum(axis=1) / (k - 1)
        with np.errstate(divide="ignore"):
            out[rows] = 1.0 / inv
    return out


def _mle_from_distances(r: np.ndarray, k: int) -> float:
    """Levina-Bickel MLE with MacKay-Ghahramani averaging from sorted distances r (N, >= k).

    The mean over points of the inverse local estimate, ``sum_{j<k} log(T_k/T_j) / (k - 1)``,
    inverted (float64; ``r[:, 0] > 0`` is guaranteed by the caller).
    """
    log_r = np.log(r[:, :k])
    inv = (log_r[:, k - 1:k] - log_r[:, : k - 1]).sum(axis=1) / (k - 1)  # (N,) = 1 / m_k(x)
    mean_inv = float(inv.mean())
    return 1.0 / mean_inv if mean_inv > 0 else math.inf
