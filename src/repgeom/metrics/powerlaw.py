"""alpha-ReQ: how fast the covariance eigenspectrum of the states decays (a power law)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ._spectrum import centred_gram_eigh
from ._validation import check_int, check_matrix

__all__ = ["alpha_req", "AlphaReQResult", "FIT_RANKS"]

FIT_RANKS = (11, 100)
"""Ranks (1-based, both ends included) the power law is fitted over by default: those of
reptrix's ``get_alpha`` (``fit_range=np.arange(10, 100)``, shifted by one): the first ten
eigenvalues, which carry the few outlier directions, are left out."""


@dataclass(frozen=True)
class AlphaReQResult:
    """alpha : the decay exponent; r2 : the fit's R^2 in log-log space; first, last : the ranks
    fitted (fewer than asked where the spectrum has fewer positive eigenvalues)."""

    alpha: float
    r2: float
    first: int
    last: int


def alpha_req(X, *, ranks: tuple[int, int] = FIT_RANKS) -> AlphaReQResult:
    r"""alpha-ReQ (Agrawal, Mondal, Ghosh & Richards 2022): the power-law exponent of the
    eigenspectrum of the states' covariance, with the fit's R^2.

    .. math:: \lambda_i \approx c\, i^{-\alpha}, \qquad
              \log \lambda_i = \log c - \alpha \log i, \quad i \in [i_0, i_1]

    ("alpha-ReQ: Assessing representation quality in self-supervised learning by measuring
    eigenspectrum decay", NeurIPS 2022, section 3). The line is fitted by weighted least squares
    with weights ``1 / i``, as in the code the paper builds on (Stringer, Pachitariu et al. 2019,
    "High-dimensional geometry of population responses in visual cortex", whose ``get_powerlaw``
    reptrix's ``get_alpha`` copies), so every decade of ranks weighs about the same. ``r2`` is
    the coefficient of determination of that line on the fitted ``log lambda_i`` (unweighted);
    1 for an exact power law. Li et al. (NeurIPS 2025, "Tracing the representation geometry of
    language models") read phases of pretraining from it beside RankMe.

    Parameters
    ----------
    X : Tensor or ndarray, shape (n, d)
        One layer's states; any float dtype and device. Centred in float64; the eigenvalues are
        those `repgeom.metrics.effective_rank` reads (``_spectrum.centred_gram_eigh``: each
        accurate relative to itself, shared inside a probe), so a scale of ``X`` changes only
        ``c``.
    ranks : (int, int), keyword-only
        First and last rank fitted, 1-based, inclusive; ``(11, 100)`` by default (reptrix's).
        The last is cut to the number of positive eigenvalues (those above ``100 eps^2`` of the
        largest, ``eps`` that of ``X``'s dtype: below it lies the rounding of the states in a
        direction they do not use).

    Returns
    -------
    AlphaReQResult

    Raises
    ------
    ValueError
        If ``X`` is not 2-D, has NaN/Inf, or fewer than 3 positive eigenvalues fall in
        ``ranks``; or if ``ranks`` is not ``1 <= first < last``.

    Examples
    --------
    >>> import torch
    >>> lam = torch.arange(1, 65, dtype=torch.float64) ** -1.5  # an exact power law
    >>> X = torch.cat([torch.diag(lam.sqrt()), -torch.diag(lam.sqrt())]) * 2 ** -0.5
    >>> result = alpha_req(X, ranks=(1, 64))
    >>> round(result.alpha, 6), round(result.r2, 6)
    (1.5, 1.0)
    """
    X = check_matrix(X, "X")
    try:
        first, last = (check_int(r, "ranks") for r in ranks)
    except TypeError:
        raise ValueError(f"ranks must be two integers (first, last), got {ranks!r}") from None
    if not first < last:
        raise ValueError(f"ranks must satisfy 1 <= first < last, got {ranks!r}")
    return _alpha_req(X, first, last)


def _alpha_req(X: torch.Tensor, first: int, last: int) -> AlphaReQResult:
    lam = centred_gram_eigh(X)[0].flip(0).cpu().numpy()  # descending
    # Directions the states do not use read the rounding of the states, not 0 (a LayerNorm
    # output lies in a hyperplane: 2e-15 of the largest eigenvalue in float32); their logarithm
    # is noise, so eigenvalues below 100 eps^2 of the largest are not fitted.
    floor = 100 * torch.finfo(X.dtype if X.is_floating_point() else torch.float32).eps ** 2
    positive = int((lam > floor * lam[0]).sum())
    last = min(last, positive)
    if last - first + 1 < 3:
        raise ValueError(
            f"alpha-ReQ fits ranks {first}..{last} but the states have {positive} positive "
            f"covariance eigenvalues (n = {X.shape[0]}, d = {X.shape[1]}); at least 3 are needed "
            "in the range: use more states or a lower first rank"
        )
    i = np.arange(first, last + 1, dtype=np.float64)
    y = np.log(lam[first - 1 : last])
    design = np.stack([-np.log(i), np.ones_like(i)], axis=1)
    weighted = design / i[:, None]  # weights 1 / i
    slope, intercept = np.linalg.solve(design.T @ weighted, weighted.T @ y)
    residual = y - design @ np.array([slope, intercept])
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((residual**2).sum()) / total if total > 0 else math.nan
    return AlphaReQResult(float(slope), r2, first, last)
