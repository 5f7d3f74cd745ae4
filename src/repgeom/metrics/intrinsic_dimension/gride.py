"""Multi-scale GRIDE intrinsic dimension (Denti et al. 2022), as DADApy computes it, at
neighbour orders 2, 4, ..., ``max_order``. The batches and the search are :mod:`knn_batches`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._validation import check_int, check_matrix
from .knn_batches import Neighbours, search_batches

__all__ = ["GrideResult", "gride", "check_max_order"]


@dataclass(frozen=True, eq=False)
class GrideResult:
    """GRIDE estimate (Denti et al. 2022) at neighbour orders ``n2 = 2, 4, ..., max_order``.

    orders : tuple of int, the ``n2`` of each scale (``n1 = n2 / 2``).
    dimension, dimension_std : ndarray (n_orders,), float64; mean and std over batches.
    scale : ndarray (n_orders,), mean distance of the ``n1``-th and ``n2``-th neighbours
        (DADApy's ``rs_scaling``), in the units of ``X``; the length scale each estimate reads.
    n_batches, n_points, n_duplicates : as in :class:`TwoNNResult`.
    """

    orders: tuple
    dimension: np.ndarray
    dimension_std: np.ndarray
    scale: np.ndarray
    n_batches: int
    n_points: int
    n_duplicates: int


def gride(
    X,
    *,
    max_order: int = 64,
    batch_size: int | None = None,
    seed: int = 0,
    d_min: float = 1e-3,
    d_max: float = 1e3,
    tol: float = 1e-7,
) -> GrideResult:
    r"""Multi-scale GRIDE intrinsic dimension (Denti, Doimo, Laio & Mira 2022, Sci. Rep. 12:20005,
    "The generalized ratios intrinsic dimension estimator").

    For neighbour orders :math:`n_1 < n_2` the ratio :math:`\mu = r_{n_2}/r_{n_1}` has density

    .. math:: f(\mu) = \frac{d\,(\mu^d - 1)^{n_2 - n_1 - 1}}{B(n_2 - n_1, n_1)\,
              \mu^{(n_2 - 1)d + 1}}, \quad \mu > 1,

    and d is its maximum-likelihood value, found by bisection of the score on
    ``[d_min, d_max]`` to ``tol``. With ``n2 = 2 n1 = 2, 4, ..., max_order`` the estimate reads
    the data at growing length scales (``n2 = 2`` is TwoNN's MLE). Follows DADApy's
    ``IdEstimation.return_id_scaling_gride`` (v0.3.4) exactly: ratios equal to 1 are nudged by
    ``10 * eps``, ratios above ``q50 + 20 (q95 - q50)`` are dropped as overlap artefacts, and
    the score uses ``(N - 1)/d``.

    Parameters
    ----------
    X : Tensor or ndarray, shape (n, d)
    max_order : int, keyword-only
        Largest ``n2``, a power of two >= 2; every batch needs more than ``max_order``
        distinct points.
    batch_size : int, optional, keyword-only
        ``None`` (default): all points in one batch, as DADApy does. An int: the TwoNN batching
        protocol (mean and std over batches).
    seed : int, keyword-only
    d_min, d_max, tol : float, keyword-only
        Bisection bracket and tolerance (DADApy's ``d0``, ``d1``, ``eps``).

    Returns
    -------
    GrideResult

    Examples
    --------
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> r = gride(torch.randn(2000, 4, generator=g), max_order=8)
    >>> r.orders
    (2, 4, 8)
    >>> bool(((r.dimension > 3.5) & (r.dimension < 4.5)).all())
    True
    """
    X = check_matrix(X, "X", min_rows=3)
    max_order = check_max_order(max_order)
    batch_size = X.shape[0] if batch_size is None else check_int(
        batch_size, "batch_size", minimum=3)
    seed = check_int(seed, "seed", minimum=None)
    if not (0 < d_min < d_max) or not tol > 0:
        raise ValueError(f"need 0 < d_min < d_max and tol > 0, got {d_min}, {d_max}, {tol}")
    found = search_batches(X, k=max_order, batch_size=batch_size, seed=seed,
                           min_points=max_order + 1, what=f"GRIDE with max_order={max_order}")
    return gride_from_neighbours(found, max_order, bracket=(d_min, d_max, tol))


def check_max_order(max_order, name: str = "max_order") -> int:
    """GRIDE's largest order: an int >= 2 and a power of two (orders 2, 4, ..., max_order)."""
    max_order = check_int(max_order, name, minimum=2)
    if max_order & (max_order - 1):
        raise ValueError(f"{name} must be a power of two (2, 4, ..., 64), got {max_order}")
    return max_order


def gride_from_neighbours(found: Neighbours, max_order: int, *,
                          bracket=(1e-3, 1e3, 1e-7)) -> GrideResult:
    """GRIDE at orders 2, 4, ..., ``max_order`` from searched batches (at least ``max_order``
    neighbours each); ``bracket`` is ``(d_min, d_max, tol)``. Mean and std over batches."""
    dims, scales = [], []
    for r in found.distances:
        batch_dims, batch_scales = [], []
        n1 = 1
        while 2 * n1 <= max_order:
            batch_dims.append(_gride_single(r[:, 2 * n1 - 1] / r[:, n1 - 1], n1, 2 * n1, *bracket))
            batch_scales.append(float((r[:, n1 - 1].mean() + r[:, 2 * n1 - 1].mean()) / 2))
            n1 *= 2
        dims.append(batch_dims)
        scales.append(batch_scales)
    g = np.asarray(dims)
    return GrideResult(
        orders=tuple(2 ** (i + 1) for i in range(g.shape[1])),
        dimension=g.mean(axis=0), dimension_std=g.std(axis=0),
        scale=np.asarray(scales).mean(axis=0),
        n_batches=found.n_batches, n_points=found.n_points, n_duplicates=found.n_duplicates,
    )


def _gride_score(d: float, log_mus, n1: int, n2: int, eps: float) -> float:
    # negative derivative of the GRIDE log-likelihood in d (DADApy _neg_dloglik_did), from the
    # logarithms of the ratios: mu^-d = exp(-d log mu), one transcendental per ratio and step
    one_m = 1.0 - np.exp(-d * log_mus)
    one_m = np.maximum(one_m, 2 * eps)
    return float(np.sum(((1 - n2 + n1) / one_m + n2 - 1.0) * log_mus)) - (len(log_mus) - 1) / d


def _gride_single(mus: np.ndarray, n1: int, n2: int, d0: float, d1: float, eps: float) -> float:
    mus = mus.copy()
    mus[mus == 1] += 10 * np.finfo(np.float64).eps
    q95, q50 = np.percentile(mus, [95, 50])
    # drop overlap artefacts (DADApy _filter_mus)
    log_mus = np.log(mus[mus < 20 * (q95 - q50) + q50])
    l1 = _gride_score(d1, log_mus, n1, n2, eps)
    while abs(d0 - d1) > eps:  # bisection on the sign of the score, as DADApy
        d2 = (d0 + d1) / 2.0
        if _gride_score(d2, log_mus, n1, n2, eps) * l1 > 0:
            d1 = d2
        else:
            d0 = d2
    return (d0 + d1) / 2.0
