"""Intrinsic dimension as a function of scale: TwoNN by decimation, and the plateau of a profile.

Facco, d'Errico, Rodriguez & Laio 2017 (Sci. Rep. 7:12140, "Estimating the intrinsic dimension
of datasets by a minimal neighborhood information", section "Scale dependence" and Fig. 3) read
the intrinsic dimension as a function of the length scale: TwoNN on the whole set reads the
distance to the nearest neighbours, TwoNN on random subsets of N/2, N/4, ... points reads
larger distances, and the dimension to report is the one where this curve is flat. Denti,
Doimo, Laio & Mira 2022 (GRIDE, Sci. Rep. 12:20005, section "Scale analysis") do the same with
neighbour orders 2, 4, ..., 64 instead of subsets. DADApy implements both
(``IdEstimation.return_id_scaling_2NN`` and ``return_id_scaling_gride``).

- :func:`twonn_decimation`: DADApy's ``return_id_scaling_2NN`` (v0.3.4), subset for subset.
- :func:`id_plateau`: the widest range of scales over which a profile (decimation points and
  GRIDE orders together, on one axis of length) stays within its noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .._validation import check_fraction, check_int, check_matrix
from ..neighbors import _nearest_neighbors
from .knn_batches import unique_rows
from .twonn import twonn_from_ratios

__all__ = ["TwoNNDecimationResult", "twonn_decimation", "PlateauResult", "id_plateau",
           "PLATEAU_REL_TOL", "PLATEAU_MIN_POINTS"]

PLATEAU_REL_TOL = 0.05
"""Smallest tolerance of the plateau rule, relative to the plateau's ID (see `id_plateau`)."""
PLATEAU_MIN_POINTS = 3
"""A plateau spans at least this many scales: two points always agree with some line."""


@dataclass(frozen=True, eq=False)
class TwoNNDecimationResult:
    """TwoNN at each decimation level (Facco et al. 2017; DADApy ``return_id_scaling_2NN``).

    sizes : ndarray (n_levels,), int; points per subset, ``round(N / 2**j)``.
    n_subsets : ndarray (n_levels,), int; subsets drawn at each level, ``round(N / size)``.
    dimension : ndarray (n_levels,), float64; mean over the subsets of the linear-fit TwoNN.
    dimension_std : ndarray (n_levels,); population std over the subsets (NaN for one subset).
    dimension_err : ndarray (n_levels,); DADApy's error, ``std / sqrt(n_subsets)`` (0 for one).
    scale : ndarray (n_levels,); the mean distance to the first and second neighbours, over
        points and subsets (DADApy's ``rs``), in the units of ``X``: the length each level reads.
    n_points : distinct points decimated. n_duplicates : rows removed as duplicates.
    """

    sizes: np.ndarray
    n_subsets: np.ndarray
    dimension: np.ndarray
    dimension_std: np.ndarray
    dimension_err: np.ndarray
    scale: np.ndarray
    n_points: int
    n_duplicates: int


@dataclass(frozen=True)
class PlateauResult:
    """The plateau of an ID-against-scale profile (`id_plateau`).

    dimension : mean ID of the points on the plateau (NaN where there is none).
    low, high : its range of scales, in the units of the profile's scales (NaN where none).
    n_points : scales on the plateau (0 where none).
    reason : why there is no plateau; "" where there is one.
    """

    dimension: float
    low: float
    high: float
    n_points: int
    reason: str = ""


def twonn_decimation(
    X,
    *,
    n_min: int = 10,
    discard_fraction: float = 0.1,
    seed: int = 42,
) -> TwoNNDecimationResult:
    r"""TwoNN intrinsic dimension on random subsets of N, N/2, N/4, ... points (Facco et al. 2017).

    Decimation lengthens the neighbour distances that TwoNN reads: a subset of ``N / 2**j``
    points has its nearest neighbours about ``2**(j/d)`` times farther away, so the curve of
    the estimate against the mean neighbour distance is the intrinsic dimension as a function of
    scale. This is DADApy's ``IdEstimation.return_id_scaling_2NN`` (v0.3.4) exactly, draw for
    draw: with ``max_ndec = int(log2 N) - 1`` the subset sizes are ``round(N / 2**j)`` for
    ``j < max_ndec`` that are larger than ``n_min``; level 0 is the whole set; level j draws
    ``round(N / size)`` subsets, each ``rng.choice(N, size, replace=False)`` from one
    ``numpy.random.default_rng(seed)`` (independent draws: subsets of one level may overlap),
    fits TwoNN's line through the origin on each (the largest ``discard_fraction`` of the
    ratios left out) and averages. The scale of a level is the mean of the first and second
    neighbour distances over its points and subsets (DADApy's ``rs``).

    Unlike DADApy, rows equal up to rounding are merged first (as every estimator of
    `repgeom.metrics.intrinsic_dimension` does; a zero distance breaks the ratio), and the
    draws are over the distinct rows. The search is FAISS's exact one in float32; the two
    distances are then recomputed in the precision of ``X`` (float64 data: float64 distances,
    so a float64 input gives DADApy's numbers to rounding).

    Parameters
    ----------
    X : Tensor or ndarray, shape (n, d)
        Points; any float dtype and device.
    n_min : int >= 3, keyword-only
        Levels keep subsets of more than ``n_min`` points (DADApy's default, 10).
    discard_fraction : float in (0, 1), keyword-only
        As in `repgeom.metrics.intrinsic_dimension.twonn` (DADApy's ``mu_fraction = 1 -
        discard_fraction``).
    seed : int, keyword-only
        Seed of the subset draws (DADApy's ``rng_seed``, 42 by default there and here).

    Returns
    -------
    TwoNNDecimationResult

    Raises
    ------
    ValueError
        On NaN/Inf, a bad option, or too few distinct points for one level (``n_min + 1``).

    Examples
    --------
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(2000, 3, generator=g) @ torch.randn(3, 40, generator=g)  # a 3-D plane
    >>> r = twonn_decimation(X, n_min=100)
    >>> r.sizes.tolist()
    [2000, 1000, 500, 250, 125]
    >>> bool(((r.dimension > 2.5) & (r.dimension < 3.5)).all())
    True
    >>> bool((r.scale[1:] > r.scale[:-1]).all())  # fewer points, farther neighbours
    True
    """
    X = check_matrix(X, "X", min_rows=3)
    n_min = check_int(n_min, "n_min", minimum=3)
    discard_fraction = check_fraction(discard_fraction, "discard_fraction", include_low=False)
    seed = check_int(seed, "seed", minimum=None)
    X = X if X.dtype == torch.float64 else X.to(torch.float32)
    keep = unique_rows(X)
    n_duplicates = X.shape[0] - len(keep)
    X = X[keep]
    N = X.shape[0]
    max_ndec = int(math.log(N, 2)) - 1
    sizes = np.round(N / np.array([2**i for i in range(max(max_ndec, 1))])).astype(int)
    sizes = sizes[sizes > n_min]
    if not len(sizes):
        raise ValueError(f"X has {N} distinct points; decimation needs more than n_min + 1 = "
                         f"{n_min + 1} (and at least 4). Pass more points or a smaller n_min")
    rng = np.random.default_rng(seed)
    mean = X.mean(dim=0, keepdim=True)
    Xc = X - mean  # centred once: distances do not change, FAISS's float32 search gains
    levels = []
    for size in sizes:
        if size == N:  # level 0: the whole set, no draw (DADApy's data_fraction == 1)
            draws = [None]
        else:
            fraction = size / N  # DADApy's data_fraction, and its n_subset and n_iter from it
            n_subset, n_iter = int(np.rint(N * fraction)), int(np.rint(1.0 / fraction))
            draws = [rng.choice(N, size=n_subset, replace=False) for _ in range(n_iter)]
        dims, rs = [], []
        for idx in draws:
            sub = Xc if idx is None else Xc[torch.from_numpy(idx).to(Xc.device)]
            r = _two_distances(sub)
            dims.append(twonn_from_ratios(r[:, 1] / r[:, 0], discard_fraction)[0])
            rs.append(float(r.mean()))
        dims = np.asarray(dims)
        levels.append((len(draws), dims.mean(), dims.std() if len(dims) > 1 else math.nan,
                       dims.std() / math.sqrt(len(dims)), float(np.mean(rs))))
    n_subsets, dim, std, err, scale = (np.asarray(v) for v in zip(*levels, strict=True))
    return TwoNNDecimationResult(
        sizes=sizes, n_subsets=n_subsets.astype(int), dimension=dim.astype(float),
        dimension_std=std.astype(float), dimension_err=err.astype(float),
        scale=scale.astype(float), n_points=N, n_duplicates=n_duplicates,
    )


SMALL_SUBSET = 2048
"""Subsets up to this size are searched with one dense distance matrix in torch: FAISS's exact
search has a fixed cost per call, and a decimation of 8,192 states makes ~1,000 calls, most of
them on subsets of 16 to 512 points (measured on 8192 x 128 states, the same process, a shared
2-core CPU: 11-13 s with this, 17-23 s with FAISS for every subset)."""


def _two_distances(Xc: torch.Tensor) -> np.ndarray:
    """(n, 2) float64 distances to the first and second other points, ascending.

    The neighbours come from an exact search (FAISS in float32, or a dense torch distance
    matrix for subsets of at most `SMALL_SUBSET` points); their distances are recomputed in
    ``Xc``'s own precision (float64 for float64 data) and re-sorted.
    """
    if Xc.shape[0] <= SMALL_SUBSET:
        d2 = torch.cdist(Xc, Xc)  # (n, n)
        d2.fill_diagonal_(math.inf)
        idx = torch.topk(d2, 2, dim=1, largest=False).indices
    else:
        _, idx = _nearest_neighbors(Xc.to(torch.float32).contiguous(), 2, centred=True)
        idx = idx.to(Xc.device)
    r = torch.stack([torch.linalg.vector_norm(Xc[idx[:, j]] - Xc, dim=1) for j in range(2)], 1)
    r = np.sort(r.detach().cpu().numpy().astype(np.float64), axis=1)
    if (r[:, 0] <= 0).any():
        raise ValueError("X has points at distance 0 after deduplication (float32 "
                         "coincidences); TwoNN's ratio r2/r1 is undefined there")
    return r


def id_plateau(
    scale,
    dimension,
    noise=None,
    *,
    rel_tol: float = PLATEAU_REL_TOL,
    min_points: int = PLATEAU_MIN_POINTS,
) -> PlateauResult:
    r"""The widest range of scales over which an intrinsic-dimension profile stays flat.

    Facco et al. 2017 (Fig. 3) and Denti et al. 2022 (section "Scale analysis") report the
    dimension where the ID-against-scale curve has a plateau; this makes that reading a rule.
    The points (from any estimators: TwoNN decimation levels and GRIDE orders together) are
    sorted by scale. A run of consecutive points ``a..b`` is flat when every point's ID lies
    within its tolerance of the run's mean ID :math:`\bar d`:

    .. math:: |d_i - \bar d| \le \max(\sigma_i,\ \text{rel\_tol} \cdot \bar d),

    with :math:`\sigma_i` the point's noise (the probe's batch std: its ``std`` column). The
    floor ``rel_tol`` (5%) is there because a std from two batches is itself uncertain by
    about 70%, and because TwoNN and GRIDE carry finite-sample biases of a few percent that
    differ between estimators and scales even on a flat manifold (the benchmark,
    ``benchmarks/bench_id_scales.py``): without it a plane would show no plateau. The plateau is
    the flat run of at least ``min_points`` points with the largest ratio ``high / low`` of its
    end scales (ties: more points, then the smaller scales); its ID is :math:`\bar d`.

    Parameters
    ----------
    scale : array-like, shape (n,)
        Length scale of each point (mean neighbour distance), > 0.
    dimension : array-like, shape (n,)
        The ID at each scale. Points with a NaN scale or ID are left out.
    noise : array-like, shape (n,), optional
        The noise of each ID (NaN or None: unknown, the floor alone).
    rel_tol : float in [0, 1), keyword-only
    min_points : int >= 2, keyword-only

    Returns
    -------
    PlateauResult
        NaNs and a reason where no run of ``min_points`` points is flat.

    Examples
    --------
    >>> r = id_plateau([1, 2, 4, 8, 16], [9.0, 6.0, 3.0, 3.05, 2.95], [0.05] * 5)
    >>> round(r.dimension, 2), r.low, r.high, r.n_points
    (3.0, 4.0, 16.0, 3)
    >>> id_plateau([1, 2, 4], [1.0, 2.0, 4.0]).reason
    'no plateau: the ID changes by more than its noise over every 3 consecutive scales'
    """
    s = np.asarray(scale, dtype=float).ravel()
    d = np.asarray(dimension, dtype=float).ravel()
    sig = (np.full_like(d, np.nan) if noise is None
           else np.asarray(noise, dtype=float).ravel())
    if not (s.shape == d.shape == sig.shape):
        raise ValueError(f"scale, dimension, noise: shapes differ, {s.shape}, {d.shape}, "
                         f"{sig.shape}")
    rel_tol = check_fraction(rel_tol, "rel_tol", include_high=False)
    min_points = check_int(min_points, "min_points", minimum=2)
    ok = np.isfinite(s) & np.isfinite(d)
    if (s[ok] <= 0).any():
        raise ValueError("scale: every scale must be > 0")
    order = np.argsort(s[ok], kind="stable")
    s, d, sig = s[ok][order], d[ok][order], np.nan_to_num(sig[ok][order], nan=0.0)
    if len(s) < min_points:
        return PlateauResult(math.nan, math.nan, math.nan, 0,
                             f"no plateau: {len(s)} finite scales, fewer than {min_points}")
    best = None
    for a in range(len(s)):
        for b in range(a + min_points - 1, len(s)):
            mean = float(d[a:b + 1].mean())
            tol = np.maximum(sig[a:b + 1], rel_tol * abs(mean))
            if not (np.abs(d[a:b + 1] - mean) <= tol).all():
                continue
            key = (math.log(s[b] / s[a]), b - a + 1, -a)
            if best is None or key > best[0]:
                best = (key, mean, a, b)
    if best is None:
        return PlateauResult(math.nan, math.nan, math.nan, 0,
                             "no plateau: the ID changes by more than its noise over every "
                             f"{min_points} consecutive scales")
    _, mean, a, b = best
    return PlateauResult(mean, float(s[a]), float(s[b]), b - a + 1)
