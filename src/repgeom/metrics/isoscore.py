"""IsoScore: how uniformly the states use the dimensions of their space."""

from __future__ import annotations

import math

import torch

from ._spectrum import scatter_eigenvalues
from ._validation import check_matrix

__all__ = ["isoscore"]


def isoscore(X) -> float:
    r"""IsoScore of a point cloud (Rudman, Gillman, Rayne & Eickhoff 2022, Algorithm 1).

    From "IsoScore: Measuring the Uniformity of Embedding Space Utilization" (Findings of ACL
    2022, section 4). With ``D`` the number of features (the paper's ``n``):

    1. reorient the centred points along their principal components;
    2. take the variance vector :math:`\Sigma_D` of the reoriented points (the covariance
       eigenvalues);
    3. normalise it to the length of the all-ones vector:
       :math:`\hat\Sigma_D = \sqrt{D}\,\Sigma_D / \lVert\Sigma_D\rVert`;
    4. isotropy defect :math:`\delta = \lVert\hat\Sigma_D - \mathbf{1}\rVert /
       \sqrt{2(D - \sqrt{D})}`, in [0, 1];
    5. fraction of dimensions used :math:`\phi = (D - \delta^2 (D - \sqrt{D}))^2 / D^2`,
       in [1/D, 1];
    6. IsoScore :math:`\iota = (D\phi - 1)/(D - 1)`, in [0, 1].

    1 means the variance is spread equally over all D directions (isotropic), 0 that it lies
    along one direction. :math:`D\phi = 1 + (D - 1)\iota` is the number of dimensions the
    cloud "uses".

    Parameters
    ----------
    X : Tensor or ndarray, shape (n, D)
        Points, one per row, D >= 2; any float dtype and device (float64 on ``X``'s device).

    Returns
    -------
    float

    Raises
    ------
    ValueError
        If ``X`` is not 2-D, has fewer than 2 rows or 2 columns, contains NaN/Inf, or has zero
        variance.

    Notes
    -----
    Steps 1-2 are one symmetric eigendecomposition of the D x D covariance in float64 (the
    variances along the principal axes are its eigenvalues; the normalisation in step 3 makes
    the ``1/(n-1)`` of the covariance irrelevant). With ``n <= D`` at most ``n - 1`` variances
    are nonzero, so the score is at most about ``(n - 1)/D``: IsoScore needs ``n >> D`` to see
    isotropy (the authors' IsoScore* adds covariance shrinkage for that case; not done here).
    Values can leave [0, 1] by float64 rounding (~1e-15); they are not clipped.

    Examples
    --------
    >>> import torch
    >>> X = torch.cat([torch.eye(4), -torch.eye(4)])  # equal variance along 4 axes
    >>> round(isoscore(X), 6)
    1.0
    >>> round(isoscore(torch.outer(torch.arange(5.0), torch.ones(4))), 6)  # one direction
    0.0
    """
    X = check_matrix(X, "X", min_rows=2, min_cols=2)
    return _isoscore(X)


def _isoscore(X: torch.Tensor) -> float:
    D = X.shape[1]
    var = scatter_eigenvalues(X).clamp_min(0.0)  # steps 1-2, up to the factor n - 1
    norm = float(torch.linalg.vector_norm(var))
    if norm <= 0.0:
        raise ValueError("X has zero variance (all rows are identical); IsoScore is undefined")
    var_hat = var * (math.sqrt(D) / norm)  # step 3
    defect = float(torch.linalg.vector_norm(var_hat - 1.0)) / math.sqrt(2 * (D - math.sqrt(D)))
    phi = (D - defect**2 * (D - math.sqrt(D))) ** 2 / D**2  # step 5
    return (D * phi - 1) / (D - 1)  # step 6
