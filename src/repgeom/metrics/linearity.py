"""Layer linearity (Razzhigaev et al. 2024): how well one state set is a linear map of another."""

from __future__ import annotations

import torch

from ._validation import check_paired

__all__ = ["linearity"]


def linearity(X, Y) -> float:
    r"""Linearity score of the map from `X` to `Y` (Razzhigaev, Mikhalchuk, Goncharova, Gerasimenko,
    Oseledets, Dimitrov & Kuznetsov 2024, "Your Transformer is Secretly Linear", ACL, eq. 1).

    .. math:: \operatorname{linearity}(X, Y) = 1 - \min_A \lVert \tilde X A - \tilde Y \rVert_F^2

    with :math:`\tilde X, \tilde Y` the column-centred states scaled to unit Frobenius norm. The
    least-squares fit is exact (``torch.linalg.lstsq`` in float64). 1 when `Y` is a linear
    image of `X` (plus a translation); about ``d_X / n`` for `Y` independent of `X` (an
    (n, d_X) design fits that share of any target's variance by chance), so compare layers on
    the same number of states. Not symmetric: it asks how linear the step from `X` to `Y` is.

    Parameters
    ----------
    X : (n, d_X) tensor
    Y : (n, d_Y) tensor
        Paired states (row ``i`` of both from the same token), e.g. two consecutive layers; any
        float dtype and device.

    Returns
    -------
    float in [0, 1]

    Raises
    ------
    ValueError
        Unpaired rows, fewer than 2 rows, non-finite values, or a constant `Y` (no variance to
        explain).

    Examples
    --------
    >>> import torch
    >>> X = torch.randn(500, 8, generator=torch.Generator().manual_seed(0))
    >>> A = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    >>> round(linearity(X, X @ A + 3.0), 6)
    1.0
    """
    X, Y = check_paired(X, Y)
    return _linearity(X, Y)


def _linearity(X: torch.Tensor, Y: torch.Tensor) -> float:
    Xc = X.to(torch.float64) - X.to(torch.float64).mean(0, keepdim=True)
    Yc = Y.to(torch.float64) - Y.to(torch.float64).mean(0, keepdim=True)
    ny = torch.linalg.matrix_norm(Yc)
    if float(ny) == 0.0:
        raise ValueError("Y is constant (no variance to explain); linearity is undefined")
    nx = torch.linalg.matrix_norm(Xc)
    if float(nx) == 0.0:
        return 0.0  # a constant X explains nothing
    Xn, Yn = Xc / nx, Yc / ny
    A = torch.linalg.lstsq(Xn.cpu(), Yn.cpu(), driver="gelsd").solution  # (d_X, d_Y)
    residual = float(torch.linalg.matrix_norm(Xn.cpu() @ A - Yn.cpu()) ** 2)
    return min(1.0, max(0.0, 1.0 - residual))
