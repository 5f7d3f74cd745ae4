"""Drift: the common offset of a layer's states."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._validation import check_matrix

__all__ = ["DriftResult", "drift"]


@dataclass(frozen=True)
class DriftResult:
    """``norm``: ||x_bar||_2 of the mean state; ``ratio``: norm / mean row norm, in [0, 1]."""

    norm: float
    ratio: float


def drift(X) -> DriftResult:
    r"""Norm of the mean hidden state and its ratio to the mean row norm.

    .. math:: \text{norm} = \lVert \bar{x} \rVert_2, \quad
              \text{ratio} = \frac{\lVert \bar{x} \rVert_2}{\frac1n \sum_i \lVert x_i \rVert_2}

    The common offset ("drift") that makes states look alike under cosine similarity
    (Godey et al. 2024; Razzhigaev et al. 2023). By the triangle inequality ``ratio <= 1``,
    with 1 when all rows are equal and about ``1/sqrt(n)`` for centred isotropic rows.

    Parameters
    ----------
    X : Tensor or ndarray, shape (n, d)
        Hidden states; any float dtype and device (reduced in float64).

    Returns
    -------
    DriftResult
        ``norm`` and ``ratio`` as Python floats (``ratio`` is 0.0 when every row is zero).

    Examples
    --------
    >>> import torch
    >>> r = drift(torch.tensor([[3.0, 4.0], [3.0, 4.0]]))
    >>> r.norm, r.ratio
    (5.0, 1.0)
    """
    X = check_matrix(X, "X", min_rows=1)
    return _drift(X)


def _drift(X: torch.Tensor) -> DriftResult:
    X = X.to(torch.float64)
    norm = float(torch.linalg.vector_norm(X.mean(dim=0)))
    mean_row = float(torch.linalg.vector_norm(X, dim=1).mean())
    return DriftResult(norm=norm, ratio=norm / mean_row if mean_row > 0 else 0.0)
