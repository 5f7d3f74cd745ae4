"""How many directions the states use: effective rank, RankMe and the PCA dimension.

All three read the singular values (or the covariance eigenvalues) of one layer's states. The
effective rank and the PCA dimension centre the states first, like
:func:`repgeom.metrics.anisotropy`; RankMe follows its paper and does not. All three take the
spectrum from the float64 Gram matrix of the states centred in float64 (shared with anisotropy
and IsoScore inside a probe, see ``_spectrum``); RankMe adds the mean back through a small
(d + 1) x d SVD (see its notes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from ._spectrum import centred_eigenvalues, centred_gram_eigh
from ._validation import check_fraction, check_matrix

__all__ = ["effective_rank", "rankme", "pca_dimension"]

# Slack on the cumulative explained variance in pca_dimension: data built to reach a threshold
# exactly (10 equal directions, variance=0.9) must give the exact answer (9) despite rounding.
_PCA_SLACK = 1e-12


def effective_rank(X) -> float:
    r"""Effective rank of the centred states (Roy & Vetterli 2007).

    .. math:: \operatorname{erank}(X) = \exp\Big(-\sum_k p_k \log p_k\Big), \qquad
              p_k = \frac{\sigma_k}{\sum_j \sigma_j},

    with :math:`\sigma_k` the singular values of :math:`X - \mathbf{1}\bar{x}^\top` and
    :math:`0 \log 0 = 0` (Roy & Vetterli 2007, "The effective rank: a measure of effective
    dimensionality", EUSIPCO, definition 1). It lies in ``[1, min(n - 1, d)]``: 1 for rank-one
    data, ``k`` when the states spread equally over ``k`` orthogonal directions.

    Why centred. Roy & Vetterli define it on a matrix as it is. Hidden states of a transformer
    share a large common offset (see :func:`repgeom.metrics.drift`), which would add one huge
    singular value and pull the rank towards 1 whatever the spread around it. Centring makes
    this the rank of the spread, the quantity :func:`repgeom.metrics.anisotropy` and
    :func:`pca_dimension` describe. For the uncentred version of the RankMe paper, see
    :func:`rankme`.

    Parameters
    ----------
    X : Tensor or ndarray, shape (n, d)
        One layer's states, one row per token; any float dtype and device (computed in float64
        on ``X``'s device).

    Returns
    -------
    float

    Raises
    ------
    ValueError
        If ``X`` is not 2-D, has fewer than 2 rows, contains NaN/Inf or has zero variance.

    Notes
    -----
    The singular values are the square roots of the eigenvalues of the float64 Gram matrix of
    the centred states (``Xc^T Xc``, or ``Xc Xc^T`` when n < d; centred in float64 before the
    product, so a large common offset stays out of its rounding). Alone, those would turn
    eigenvalue rounding noise of ``1e-16`` (relative to the largest) into spurious singular
    values of ``1e-8`` and misread real ones of ``1e-7`` (float32 states' own rounding) by 1%;
    so the eigenvalues below ``1e-6`` of the largest are computed again from ``Xc`` along their
    eigenvectors, and singular values below ``max(n, d) * eps`` times the norm of the states
    (numpy's ``matrix_rank`` tolerance: the states' own float64 rounding) read as 0
    (``repgeom.metrics._spectrum.gram_eigh``). Measured against an SVD of the centred states
    (tests/metrics/test_metrics_rank.py): within ``1e-14`` relative on full-rank states,
    ill-conditioned ones (condition number ``1e6`` under a large common offset) and layer-norm
    outputs with a float32-rounding direction included; the known answer to 2 ulps on
    rank-deficient ones (the SVD: ``1e-12`` off). Its cost is one n d^2 product and a d x d
    eigendecomposition (plus an n d m product for m small eigenvalues), shared with
    :func:`rankme` inside a probe; the SVD cost O(n d min(n, d)) with a larger constant, 31 ms
    a 4,096 x 512 batch on an H200 (benchmarks/README.md).

    Examples
    --------
    >>> import torch
    >>> X = torch.cat([torch.eye(3), -torch.eye(3)])  # 3 orthogonal directions, equal spread
    >>> round(effective_rank(X), 6)
    3.0
    """
    X = check_matrix(X, "X", min_rows=2)
    return _effective_rank(X)


def _effective_rank(X: torch.Tensor) -> float:
    s = centred_gram_eigh(X)[0].flip(0).sqrt()  # singular values of Xc, descending
    total = float(s.sum())
    if total <= 0.0:
        raise ValueError("X has zero variance (all rows identical); effective rank is undefined")
    p = s / total
    p = p[p > 0]  # 0 log 0 = 0
    return float(torch.exp(-(p * torch.log(p)).sum()))


def rankme(Z, *, eps: float = 1e-7) -> float:
    r"""RankMe (Garrido, Balestriero, Najman & LeCun 2023), exactly as in its eq. (1).

    .. math:: \operatorname{RankMe}(Z) = \exp\Big(-\sum_{k=1}^{\min(n, d)} p_k \log p_k\Big),
              \qquad p_k = \frac{\sigma_k(Z)}{\lVert \sigma(Z) \rVert_1} + \varepsilon

    ("RankMe: Assessing the downstream performance of pretrained self-supervised
    representations by their rank", ICML 2023, section 3, eq. 1). Unlike
    :func:`effective_rank` the embeddings are **not** centred: a common offset counts as one
    direction. The ``eps`` keeps the logarithm finite for zero singular values; it also lifts
    the value slightly above the Roy-Vetterli effective rank of ``Z`` (each of the
    ``min(n, d)`` terms gains about ``-eps log eps``, ``1.6e-6`` at the default).

    Parameters
    ----------
    Z : Tensor or ndarray, shape (n, d)
        Embeddings, one row per input; any float dtype and device (float64 on ``Z``'s device).
    eps : float, keyword-only
        The paper's epsilon, ``1e-7`` by default (its value and that of its code); >= 0.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        If ``Z`` is not 2-D, has fewer than 1 row, contains NaN/Inf or is all zeros, or if
        ``eps`` is negative.

    Notes
    -----
    With at least as many rows as columns the singular values come without an SVD of ``Z``:
    ``Z^T Z = Zc^T Zc + n m m^T`` exactly (``Zc`` the rows centred in float64, ``m`` their
    mean), so ``Z`` has the singular values of the (d + 1) x d matrix stacking ``sqrt(n) m^T``
    on ``diag(sqrt(lam)) V^T``, with ``lam, V`` the eigenpairs of ``Zc^T Zc`` as
    :func:`effective_rank` computes them. An eigendecomposition of ``Z^T Z`` itself would not
    do: a large common offset (hidden states have one) makes its largest eigenvalue ``1e6`` or
    more times the others, whose rounding then moves RankMe by ``2e-5`` to ``2e-4`` (relative)
    on the tests' ill-conditioned states. Measured against an SVD of ``Z``
    (tests/metrics/test_metrics_rank.py): within ``1e-14`` relative, ill-conditioned and offset
    states included. With fewer rows than columns it is the SVD of ``Z`` (n x d, already small).

    Examples
    --------
    >>> import torch
    >>> round(rankme(torch.eye(4)), 4)  # four equal singular values
    4.0
    """
    Z = check_matrix(Z, "Z", min_rows=1)
    try:
        eps = float(eps)
    except (TypeError, ValueError) as err:
        raise ValueError(f"eps must be a number >= 0, got {eps!r}") from err
    if not eps >= 0.0 or eps == float("inf"):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    return _rankme(Z, eps)


def _rankme(Z: torch.Tensor, eps: float) -> float:
    n, d = Z.shape
    if n >= d:
        lam, V = centred_gram_eigh(Z)  # of the rows centred in float64: Zc^T Zc = V lam V^T
        mean = Z.to(torch.float64).mean(dim=0, keepdim=True)  # (1, d)
        root = lam.sqrt()  # singular values of the centred rows
        s = torch.linalg.svdvals(torch.cat([math.sqrt(n) * mean, root[:, None] * V.T]))  # (d,)
    else:
        s = torch.linalg.svdvals(Z.to(torch.float64))
    total = float(s.sum())
    if total <= 0.0:
        raise ValueError("Z is all zeros; RankMe is undefined")
    p = s / total + eps
    p = p[p > 0]  # only when eps == 0: 0 log 0 = 0
    return float(torch.exp(-(p * torch.log(p)).sum()))


def pca_dimension(X, *, variance: float | Sequence[float] = 0.9) -> int | tuple[int, ...]:
    r"""Number of principal components needed to explain at least ``variance`` of the variance.

    .. math:: k(v) = \min\Big\{k : \sum_{i \le k} \lambda_i \ \ge\ v \sum_i \lambda_i\Big\}

    with :math:`\lambda_1 \ge \lambda_2 \ge \dots` the eigenvalues of the covariance of the
    centred states (the PCA-based "linear" intrinsic dimension, e.g. Ansuini et al. 2019,
    "Intrinsic dimension of data representations in deep neural networks", NeurIPS, section 3,
    who use 90%). Pass several levels at once to share one eigendecomposition:
    ``pca_dimension(X, variance=(0.9, 0.99))`` returns a tuple.

    Parameters
    ----------
    X : Tensor or ndarray, shape (n, d)
        One layer's states; any float dtype and device (float64 on ``X``'s device).
    variance : float or sequence of float in (0, 1], keyword-only
        Share of the total variance to explain; 0.9 by default. ``1.0`` gives the numerical
        rank of the centred states (up to the slack below).

    Returns
    -------
    int, or tuple of int (one per level) when ``variance`` is a sequence
        In ``[1, min(n - 1, d)]``.

    Raises
    ------
    ValueError
        If ``X`` is not 2-D, has fewer than 2 rows, contains NaN/Inf or has zero variance, or
        if a ``variance`` level is not in (0, 1].

    Notes
    -----
    Eigenvalues of the d x d scatter matrix when ``n >= d``, of the n x n Gram matrix
    otherwise (same nonzero spectrum), in float64. "At least" is tested with a relative slack of
    ``1e-12`` on the cumulative share, so data built to reach a level exactly (10 equal
    directions at 90%) give the exact answer; scikit-learn's ``PCA(n_components=v)`` asks for
    strictly more than ``v`` and can differ by one at such exact ties (never otherwise).

    Examples
    --------
    >>> import torch
    >>> X = torch.randn(500, 3, generator=torch.Generator().manual_seed(0)) * torch.tensor(
    ...     [10.0, 1.0, 0.1])
    >>> pca_dimension(X), pca_dimension(X, variance=(0.9, 0.999))
    (1, (1, 2))
    """
    X = check_matrix(X, "X", min_rows=2)
    single = np.ndim(variance) == 0  # a number (or a string, refused below)
    levels = [variance] if single else list(np.ravel(np.asarray(variance, dtype=object)))
    if not levels:
        raise ValueError("variance must be a number or a non-empty sequence of numbers in (0, 1]")
    levels = [check_fraction(v, "variance", include_low=False, include_high=True) for v in levels]
    dims = _pca_dimension(X, levels)
    return dims[0] if single else tuple(dims)


def _pca_dimension(X: torch.Tensor, levels: list[float]) -> list[int]:
    lam = centred_eigenvalues(X).flip(0).clamp_min(0.0)  # descending
    total = float(lam.sum())
    if total <= 0.0:
        raise ValueError("X has zero variance (all rows are identical); PCA dimension is undefined")
    share = torch.cumsum(lam, 0) / total
    targets = torch.tensor(levels, dtype=torch.float64, device=share.device) * (1 - _PCA_SLACK)
    k = torch.searchsorted(share, targets, side="left") + 1  # first k with share >= target
    k = k.clamp_max(lam.shape[0])  # share[-1] can round below a target of 1.0
    return [int(v) for v in k.tolist()]
