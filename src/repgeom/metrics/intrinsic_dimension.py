"""Intrinsic dimension: TwoNN, multi-scale GRIDE, the Levina-Bickel MLE and a near-duplicate flag
from one kNN search.

Pipeline shared by every function here (so their numbers agree):

1. centre ``X`` and cast to float32 -- the data FAISS searches;
2. shuffle with ``seed`` and cut into ``max(1, n // batch_size)`` batches of at least
   ``batch_size`` rows (one batch if ``n < batch_size``; `batch_indices`), as in Facco et al.
   2017 and Razzhigaev et al. 2023, section 2.2 -- the same batches the probe uses for its other
   per-layer metrics;
3. remove exact duplicate rows within each batch (``r1 = 0`` breaks the ratio estimators),
   counting them;
4. one exact kNN search per batch (:func:`repgeom.metrics.nearest_neighbors`), then each
   estimator reads the neighbour distances it needs; results are mean and (population)
   standard deviation over batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse
import scipy.sparse.csgraph
import torch

from ._validation import check_fraction, check_int, check_matrix
from .neighbors import _centre32, _nearest_neighbors

__all__ = [
    "batch_indices",
    "TwoNNResult",
    "GrideResult",
    "MLEResult",
    "IntrinsicDimensionResult",
    "twonn",
    "gride",
    "mle_dimension",
    "near_duplicate_share",
    "intrinsic_dimension",
]

# Neighbours of the Levina-Bickel MLE: scikit-dimension's default for skdim.id.MLE
# (MLE._N_NEIGHBORS = 20, v0.3); the one place this default is written.
MLE_NEIGHBORS = 20


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


@dataclass(frozen=True, eq=False)
class IntrinsicDimensionResult:
    """TwoNN, GRIDE, the MLE and the near-duplicate share from one search per batch."""

    twonn: TwoNNResult
    gride: GrideResult
    near_duplicate_share: float
    mle: MLEResult


# --------------------------------------------------------------------------------------------
# public functions


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
    mean and standard deviation over batches (see the module docstring).

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
    batches, n_dup = _batches(X, batch_size, seed, min_points=3, what="TwoNN")
    tw, _, _, _ = _estimate(batches, n_dup, k=2, discard_fraction=discard_fraction,
                            max_order=None, threshold=None)
    return tw


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
    batches, n_dup = _batches(X, batch_size, seed, min_points=max_order + 1,
                              what=f"GRIDE with max_order={max_order}")
    _, gr, _, _ = _estimate(batches, n_dup, k=max_order, discard_fraction=None,
                            max_order=max_order, threshold=None, bracket=(d_min, d_max, tol))
    return gr


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
    std over batches; see the module docstring).

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
    batches, n_dup = _batches(X, batch_size, seed, min_points=k + 1,
                              what=f"the MLE with k={k}")
    return _estimate(batches, n_dup, k=k, discard_fraction=None, max_order=None,
                     threshold=None, mle_k=k)[3]


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
    batches, n_dup = _batches(X, batch_size, seed, min_points=max(3, reference_order + 1),
                              what=f"the near-duplicate share with reference_order="
                                   f"{reference_order}")
    _, _, share, _ = _estimate(batches, n_dup, k=reference_order, discard_fraction=None,
                               max_order=None, threshold=threshold)
    return share


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
    batches, n_dup = _batches(X, batch_size, seed, min_points=k + 1, what=what)
    tw, gr, share, mle = _estimate(batches, n_dup, k=k, discard_fraction=discard_fraction,
                                   max_order=max_order, threshold=threshold,
                                   reference_order=max_order, mle_k=mle_k)
    return IntrinsicDimensionResult(twonn=tw, gride=gr, near_duplicate_share=share, mle=mle)


# --------------------------------------------------------------------------------------------
# checks


def check_max_order(max_order, name: str = "max_order") -> int:
    """GRIDE's largest order: an int >= 2 and a power of two (orders 2, 4, ..., max_order)."""
    max_order = check_int(max_order, name, minimum=2)
    if max_order & (max_order - 1):
        raise ValueError(f"{name} must be a power of two (2, 4, ..., 64), got {max_order}")
    return max_order


# --------------------------------------------------------------------------------------------
# computation


# Rows closer than this many float units (ulps) of the batch's RMS row norm are one state: the
# same context computed in two rows of a batch may round differently in the BLAS kernels.
DUPLICATE_ULPS = 64


def _unique_rows(X: torch.Tensor) -> torch.Tensor:
    """Indices (ascending) of the rows kept when rows equal up to rounding are merged.

    Two rows are duplicates when ``||x_i - x_j|| <= DUPLICATE_ULPS * eps * rms``, with ``eps``
    the working precision (float32, or float64 for float64 data) and ``rms`` the RMS row norm:
    a state computed twice from the same context differs by a few ulps when the two copies sit
    in different rows of a batch (BLAS kernels round rows differently, and differently on
    different CPUs), so exact equality would count it once here and twice there. Each group
    of connected duplicates keeps its first row.

    Candidates come from one projection on a random unit vector: ``|u.(x_i - x_j)| <=
    ||x_i - x_j||``, so every duplicate pair is within ``delta`` in the sorted projections and
    only such pairs are compared (no pair is missed, and no n x n comparison is made).
    """
    n = X.shape[0]
    work = X if X.dtype == torch.float64 else X.to(torch.float32)
    rms = float(torch.linalg.vector_norm(work.double()) / math.sqrt(n))
    delta = DUPLICATE_ULPS * torch.finfo(work.dtype).eps * rms
    gen = torch.Generator().manual_seed(12345)
    u = torch.randn(work.shape[1], generator=gen, dtype=torch.float64).to(X.device)
    projection = work.double() @ (u / torch.linalg.vector_norm(u))
    order = torch.argsort(projection, stable=True)
    sorted_projection = projection[order]
    first, second = [], []
    for offset in range(1, n):  # pairs `offset` apart in the sorted order, while any is close
        close = (sorted_projection[offset:] - sorted_projection[:-offset]) <= delta
        if not close.any():
            break
        a, b = order[:-offset][close], order[offset:][close]
        same = torch.linalg.vector_norm((work[a] - work[b]).double(), dim=1) <= delta
        first.append(a[same])
        second.append(b[same])
    if not first or not torch.cat(first).numel():
        return torch.arange(n, device=X.device)
    i, j = torch.cat(first).cpu().numpy(), torch.cat(second).cpu().numpy()
    graph = scipy.sparse.coo_matrix((np.ones(len(i)), (i, j)), shape=(n, n))
    _, label = scipy.sparse.csgraph.connected_components(graph, directed=False)
    _, keep = np.unique(label, return_index=True)  # the first row of each group
    return torch.from_numpy(np.sort(keep)).to(X.device)


def batch_indices(n: int, batch_size: int, seed: int) -> list[torch.Tensor]:
    """Row indices of the shuffled batches: ``max(1, n // batch_size)`` batches of at least
    `batch_size` rows from one permutation drawn with `seed` (all rows, in order, when that is
    one batch).

    >>> [len(b) for b in batch_indices(10, 4, seed=0)]
    [5, 5]
    """
    n_batches = max(1, n // batch_size)
    if n_batches == 1:
        return [torch.arange(n)]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return list(torch.tensor_split(perm, n_batches))


def _batches(X: torch.Tensor, batch_size: int, seed: int, *, min_points: int, what: str):
    """Shuffle, split, deduplicate within each batch and centre; returns (list of float32
    batches, n_duplicates).

    Each batch is centred with the mean of all of ``X`` as it is gathered, which saves a pass
    over the data compared with centring first (see :func:`_centre32` for why centre at all).
    """
    X = X if X.dtype == torch.float64 else X.to(torch.float32)
    mean = X.mean(dim=0, keepdim=True)
    batches, n_dup = [], 0
    for index in batch_indices(X.shape[0], batch_size, seed):
        index = index.to(X.device)
        keep = index[_unique_rows(X[index])]
        n_dup += len(index) - len(keep)
        batches.append(_centre32(X[keep], mean))
    n = X.shape[0] - n_dup
    smallest = min(b.shape[0] for b in batches)
    if smallest < min_points:
        raise ValueError(
            f"X has {n} distinct points ({n_dup} exact duplicates removed), giving a batch of "
            f"{smallest}; {what} needs at least {min_points} distinct points per batch. "
            "Pass more points" + (" or a smaller max_order" if "max_order" in what else "")
        )
    return batches, n_dup


def _twonn_from_mus(mu: np.ndarray, discard_fraction: float) -> tuple[float, float]:
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


def _mle_from_distances(r: np.ndarray, k: int) -> float:
    """Levina-Bickel MLE with MacKay-Ghahramani averaging from sorted distances r (N, >= k).

    The mean over points of the inverse local estimate, ``sum_{j<k} log(T_k/T_j) / (k - 1)``,
    inverted (float64; ``r[:, 0] > 0`` is guaranteed by the caller).
    """
    log_r = np.log(r[:, :k])
    inv = (log_r[:, k - 1:k] - log_r[:, : k - 1]).sum(axis=1) / (k - 1)  # (N,) = 1 / m_k(x)
    mean_inv = float(inv.mean())
    return 1.0 / mean_inv if mean_inv > 0 else math.inf


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


def _estimate(batches, n_dup, *, k, discard_fraction, max_order, threshold,
              bracket=(1e-3, 1e3, 1e-7), reference_order=None, mle_k=None):
    """One search for ``k`` neighbours per batch; each estimator that is asked for (a not-None
    option) reads its columns. Returns (TwoNNResult, GrideResult, near-duplicate share,
    MLEResult), None for those not asked for. ``reference_order`` defaults to ``k``."""
    reference_order = k if reference_order is None else reference_order
    tw_dims, tw_mles, gr_dims, gr_scales, near, n_points = [], [], [], [], [], 0
    mle_dims = []
    extra_dup = 0
    for Xb in batches:
        dist, _ = _nearest_neighbors(Xb, k, centred=True)  # centred globally in _batches
        r = dist.detach().cpu().numpy().astype(np.float64)  # (nb, k)
        zero = r[:, 0] <= 0.0  # float32 coincidences that survived deduplication
        if zero.any():
            extra_dup += int(zero.sum())
            r = r[~zero]
        n_points += r.shape[0]
        if discard_fraction is not None:
            d, m = _twonn_from_mus(r[:, 1] / r[:, 0], discard_fraction)
            tw_dims.append(d)
            tw_mles.append(m)
        if max_order is not None:
            dims, scales = [], []
            n1 = 1
            while 2 * n1 <= max_order:
                dims.append(_gride_single(r[:, 2 * n1 - 1] / r[:, n1 - 1], n1, 2 * n1, *bracket))
                scales.append(float((r[:, n1 - 1].mean() + r[:, 2 * n1 - 1].mean()) / 2))
                n1 *= 2
            gr_dims.append(dims)
            gr_scales.append(scales)
        if mle_k is not None:
            mle_dims.append(_mle_from_distances(r, mle_k))
        if threshold is not None:  # r1 against the bulk spacing, median r_K
            near.append(int((r[:, 0] < threshold * np.median(r[:, reference_order - 1])).sum()))
    n_b = len(batches)
    n_dup_total = n_dup + extra_dup
    tw = gr = share = mle = None
    if tw_dims:
        tw = TwoNNResult(
            dimension=float(np.mean(tw_dims)), dimension_std=float(np.std(tw_dims)),
            mle=float(np.mean(tw_mles)), mle_std=float(np.std(tw_mles)),
            n_batches=n_b, n_points=n_points, n_duplicates=n_dup_total,
        )
    if gr_dims:
        g = np.asarray(gr_dims)
        gr = GrideResult(
            orders=tuple(2 ** (i + 1) for i in range(g.shape[1])),
            dimension=g.mean(axis=0), dimension_std=g.std(axis=0),
            scale=np.asarray(gr_scales).mean(axis=0),
            n_batches=n_b, n_points=n_points, n_duplicates=n_dup_total,
        )
    if threshold is not None:
        share = sum(near) / n_points
    if mle_dims:
        mle = MLEResult(
            dimension=float(np.mean(mle_dims)), dimension_std=float(np.std(mle_dims)), k=mle_k,
            n_batches=n_b, n_points=n_points, n_duplicates=n_dup_total,
        )
    return tw, gr, share, mle
