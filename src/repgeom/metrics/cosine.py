"""Mean cosine similarity between states, and what isotropic random vectors would give."""

from __future__ import annotations

import functools

import numpy as np
import scipy.stats
import torch

from ._validation import check_fraction, check_int, check_matrix

__all__ = [
    "mean_cosine_similarity",
    "isotropic_cosine_baseline",
    "isotropic_mean_cosine_chance",
]


def mean_cosine_similarity(X) -> float:
    r"""Mean cosine similarity over all pairs of distinct rows, exactly, in O(n d).

    With unit rows :math:`u_i = x_i / \lVert x_i \rVert` and :math:`S = \sum_i u_i`,

    .. math:: \frac{1}{n(n-1)} \sum_{i \ne j} u_i^\top u_j = \frac{\lVert S \rVert^2 - n}{n(n-1)}

    (the measure of Ethayarajh 2019, "How Contextual are Contextualized Word Representations?",
    used by Godey et al. 2024 "Anisotropy Is Inherent to Self-Attention in Transformers").
    No sampling: every pair counts.

    Parameters
    ----------
    X : Tensor or ndarray, shape (n, d)
        Hidden states, one row per token; any float dtype and device. Rows are not centred
        (the common offset is what this measure picks up).

    Returns
    -------
    float
        In ``[-1/(n-1), 1]``; about 0 for centred isotropic data, 1 if all rows point the same way.

    Raises
    ------
    ValueError
        If ``X`` is not 2-D, has fewer than 2 rows, contains NaN/Inf, or has an all-zero row
        (its direction is undefined).

    Notes
    -----
    Computed in float64; the subtraction ``||S||^2 - n`` loses about ``n * 1e-16`` absolute,
    negligible for any realistic n.

    Examples
    --------
    >>> import torch
    >>> round(mean_cosine_similarity(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])), 4)
    0.4714
    """
    X = check_matrix(X, "X", min_rows=2)
    return _mean_cosine_similarity(X)


def _mean_cosine_similarity(X: torch.Tensor) -> float:
    X = X.to(torch.float64)
    norms = torch.linalg.vector_norm(X, dim=1)
    if bool((norms == 0).any()):
        raise ValueError(
            f"X has {int((norms == 0).sum())} all-zero row(s); their cosine is undefined, "
            "drop them first"
        )
    n = X.shape[0]
    s = (X / norms[:, None]).sum(dim=0)
    return float((s @ s - n) / (n * (n - 1)))


def isotropic_cosine_baseline(d: int, *, quantile: float = 0.95) -> float:
    r"""Quantile of the cosine of *one pair* of isotropic Gaussian vectors in ``R^d``.

    The cosine baseline of Godey et al. 2024 (appendix B, Fig. 18: "95th quartile of the
    cosine-similarity distribution on a normal distribution"): for two independent draws of
    :math:`N(0, I_d)`, the cosine :math:`c` satisfies
    :math:`(c + 1)/2 \sim \mathrm{Beta}((d-1)/2, (d-1)/2)`, so the quantile is exact:
    ``2 * beta.ppf(quantile, (d-1)/2, (d-1)/2) - 1`` (about ``1.645 / sqrt(d)`` for large d;
    0.145 at d = 128). A layer whose *mean* cosine exceeds it holds pairs more aligned on
    average than 95% of isotropic pairs: Godey et al.'s reading of "anisotropic". It depends on
    ``d`` only. For the chance level of the mean over many pairs, a much smaller number, see
    :func:`isotropic_mean_cosine_chance`.

    Parameters
    ----------
    d : int
        Dimension (>= 2).
    quantile : float in (0, 1), keyword-only

    Returns
    -------
    float

    Examples
    --------
    >>> round(isotropic_cosine_baseline(128), 3)
    0.145
    """
    d = check_int(d, "d", minimum=2)
    quantile = check_fraction(quantile, "quantile", include_low=False)
    a = (d - 1) / 2.0
    return float(2.0 * scipy.stats.beta.ppf(quantile, a, a) - 1.0)


def isotropic_mean_cosine_chance(
    n: int, d: int, *, quantile: float = 0.95, n_draws: int = 2000, seed: int = 0
) -> float:
    r"""Quantile of the mean pairwise cosine of ``n`` isotropic random vectors in ``R^d``.

    The chance level of :func:`mean_cosine_similarity` at the same ``n`` and ``d``: draw ``n``
    directions uniformly on the sphere (equivalently, normalised standard Gaussian vectors),
    take their mean pairwise cosine, repeat ``n_draws`` times and return the ``quantile`` of
    those means. A layer whose mean cosine exceeds it is more aligned than chance. This is
    *not* Godey et al.'s baseline (that is the quantile of one pair's cosine,
    :func:`isotropic_cosine_baseline`): averaging over n(n-1)/2 pairs shrinks the spread, so
    this level is far lower (5e-5 for 4096 states at d = 128) and nearly any layer exceeds it.

    Sampled exactly in O(n) per draw, not O(n d): the mean cosine is
    ``(||S_n||^2 - n) / (n (n-1))`` with ``S_n`` the sum of the unit vectors, and
    ``||S_{k+1}||^2 = ||S_k||^2 + 1 + 2 ||S_k|| c_k`` where ``c_k``, the cosine between a
    uniform direction and a fixed one, satisfies ``(c_k + 1)/2 ~ Beta((d-1)/2, (d-1)/2)``.
    The mean is 0 and the variance ``2 / (d n (n-1))`` exactly; for large ``n`` the value
    approaches ``(chi2_d.ppf(quantile)/d - 1) / (n - 1)``.

    Parameters
    ----------
    n : int
        Number of vectors (>= 2), the number of rows the layer's mean cosine was taken over.
    d : int
        Dimension (>= 2).
    quantile : float, keyword-only
        In (0, 1); 0.95 by default, 0.5 gives the median.
    n_draws : int, keyword-only
        Monte-Carlo draws (>= 10); the 95th-percentile estimate has relative standard error of
        roughly 5% at 2000 draws.
    seed : int, keyword-only
        Seed of the numpy generator; same arguments give the same value (results are cached).

    Returns
    -------
    float

    Examples
    --------
    >>> b = isotropic_mean_cosine_chance(1000, 64)
    >>> 0.0 < b < 0.01
    True
    """
    n = check_int(n, "n", minimum=2)
    d = check_int(d, "d", minimum=2)
    quantile = check_fraction(quantile, "quantile", include_low=False)
    n_draws = check_int(n_draws, "n_draws", minimum=10)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    return _isotropic_mean_cosine_chance(n, d, quantile, n_draws, int(seed))


@functools.lru_cache(maxsize=256)
def _isotropic_mean_cosine_chance(
    n: int, d: int, quantile: float, n_draws: int, seed: int
) -> float:
    rng = np.random.default_rng(seed)
    a = (d - 1) / 2.0
    s2 = np.ones(n_draws)  # ||S_1||^2 = 1
    for _ in range(n - 1):
        c = 2.0 * rng.beta(a, a, size=n_draws) - 1.0
        s2 = np.maximum(s2 + 1.0 + 2.0 * np.sqrt(s2) * c, 0.0)
    means = (s2 - n) / (n * (n - 1))
    return float(np.quantile(means, quantile))
