"""TwoNN as the Shape of Learning authors compute it (their ``llm-microscope`` package).

Razzhigaev et al. 2023 ("The Shape of Learning", section 2.2) estimate the intrinsic dimension
with TwoNN (Facco et al. 2017). Their public code, ``llm_microscope.functions.intrinsic_dimension``
(PyPI ``llm-microscope`` 0.0.7), makes choices of its own that move the number by a few percent
against the Facco / DADApy / scikit-dimension convention of
`repgeom.metrics.intrinsic_dimension.twonn`:

=========================  ======================================  ================================
step                       llm-microscope (this module)             `twonn` (Facco et al., DADApy)
=========================  ======================================  ================================
precision                  float64; centred, scaled by mean norm   float32 search, float64 fit
duplicates                 ratios mu <= 1 + 1e-8 dropped (r1 <     exact duplicates removed first;
                           1e-8 after scaling, or r2 == r1)        reported as ``duplicates``
empirical CDF              counted on, from the dropped points:    i / N over the kept points
                           F_i = (i + n_dropped) / N
fitted part                the smallest fifth of the sorted        the smallest 90%
                           ratios (``reduction_factor`` = 5)
fit                        least squares through the origin        the same
=========================  ======================================  ================================

This is written from that description, on our exact FAISS neighbours (the package loops over
the points in Python, O(N^2): about 4 s for 4,096 points);
`tests/metrics/test_metrics_twonn_authors.py` checks it against the package itself to 1e-6.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .._validation import check_int, check_matrix
from ..neighbors import nearest_neighbors

__all__ = ["TwoNNAuthorsResult", "twonn_authors", "REDUCTION_FACTOR"]

REDUCTION_FACTOR = 5
"""llm-microscope's default: the fit uses the smallest 1/5 of the sorted ratios."""
_EPS = 1e-8  # llm-microscope's threshold on r1 and on mu - 1, in units of the mean norm
_CANDIDATES = 4  # neighbours searched in float32, then measured again in float64


@dataclass(frozen=True)
class TwoNNAuthorsResult:
    """dimension: the estimate; n_points: rows given; n_dropped: ratios mu <= 1 (duplicates
    and ties) left out of the fit, as llm-microscope drops them; n_fitted: ratios fitted."""

    dimension: float
    n_points: int
    n_dropped: int
    n_fitted: int


def twonn_authors(X, *, reduction_factor: int = REDUCTION_FACTOR) -> TwoNNAuthorsResult:
    r"""TwoNN intrinsic dimension in the convention of the Shape of Learning's own code.

    Razzhigaev et al. 2023, section 2.2, as implemented in ``llm-microscope`` 0.0.7
    (``functions.intrinsic_dimension``): the states are centred and divided by their mean
    norm in float64; for every point :math:`\mu = r_2 / r_1` (its two nearest other points,
    exact distances); ratios with :math:`r_1 < 10^{-8}` or :math:`\mu \le 1 + 10^{-8}` are
    dropped (``m`` of them); the remaining ``n`` sorted ratios get the empirical CDF
    :math:`F_i = (i + m) / (n + m)`, and :math:`d` is the least-squares slope through the
    origin of :math:`-\log(1 - F_i)` on :math:`\log \mu_i` over the first
    ``min(n // reduction_factor, n - 1)`` of them.

    One set, no batches: the authors apply it to the first 4,096 tokens of their sample (the
    ``llm_microscope`` protocol, ``conf/protocol/llm_microscope.yaml``). The probe applies it to
    each batch of its own protocol when ``settings.twonn_convention=llm_microscope``.

    Parameters
    ----------
    X : Tensor or ndarray, shape (n, d)
        Points; any float dtype and device (neighbours are searched in float32, then their
        distances recomputed in float64).
    reduction_factor : int >= 1, keyword-only
        The fit uses the smallest ``1 / reduction_factor`` of the sorted ratios.

    Returns
    -------
    TwoNNAuthorsResult

    Raises
    ------
    ValueError
        On NaN/Inf, fewer than 3 rows, or when fewer than 2 ratios remain to fit (all points
        duplicates, or too few points for the reduction factor).

    Examples
    --------
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(2000, 3, generator=g) @ torch.randn(3, 50, generator=g)  # 3-D plane
    >>> 2.7 < twonn_authors(X).dimension < 3.3
    True
    """
    X = check_matrix(X, "X", min_rows=3)
    reduction_factor = check_int(reduction_factor, "reduction_factor", minimum=1)
    x = X.detach().to("cpu", torch.float64)
    x = x - x.mean(dim=0, keepdim=True)
    scale = x.norm(dim=1).mean()
    if scale == 0:
        raise ValueError(f"X: all {x.shape[0]} points are one point (duplicates or ties only)")
    x = x / scale
    k = min(_CANDIDATES, x.shape[0] - 1)
    _, idx = nearest_neighbors(x.to(torch.float32), k, device="cpu")
    # Exact float64 distances to the candidates; float32 search order can swap near-ties.
    r = (x[:, None, :] - x[idx]).norm(dim=2).sort(dim=1).values.numpy()  # (n, k)
    return _fit(r[:, 0], r[:, 1], reduction_factor)


def _fit(r1: np.ndarray, r2: np.ndarray, reduction_factor: int) -> TwoNNAuthorsResult:
    n_points = r1.shape[0]
    bad = r1 < _EPS
    mu = np.where(bad, -1.0, r2 / np.where(bad, 1.0, r1))
    mu = np.sort(mu)
    n_dropped = int((mu <= 1 + _EPS).sum())
    mu = mu[n_dropped:]
    n = mu.shape[0]
    n_fit = min(n // reduction_factor, n - 1)
    if n_fit < 2:
        raise ValueError(
            f"X: {n} of {n_points} ratios r2/r1 exceed 1 ({n_dropped} duplicates or ties), "
            f"leaving {max(n_fit, 0)} to fit with reduction_factor={reduction_factor}; pass more "
            "distinct points"
        )
    f_emp = np.arange(1 + n_dropped, n + 1 + n_dropped, dtype=np.float64) / (n + n_dropped)
    x = np.log(mu[:n_fit])
    y = -np.log(1.0 - f_emp[:n_fit])
    xx = float(x @ x)
    dimension = float(x @ y) / xx if xx > 0 else math.inf
    return TwoNNAuthorsResult(dimension, n_points, n_dropped, n_fit)
