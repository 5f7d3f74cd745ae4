"""Similarity of two representations of the same inputs: linear CKA and mutual-kNN alignment.

Both take two state sets with the same rows in the same order (row ``i`` of ``X`` and of ``Y``
come from the same token or input, e.g. two layers, two checkpoints or two models); the widths
may differ.
"""

from __future__ import annotations

import torch

from ._validation import check_int, check_paired
from .neighbors import _nearest_neighbors

__all__ = ["linear_cka", "linear_cka_unbiased", "mutual_knn"]


def linear_cka(X, Y) -> float:
    r"""Linear centred kernel alignment (Kornblith, Norouzi, Lee & Hinton 2019).

    .. math:: \operatorname{CKA}(X, Y) =
              \frac{\lVert Y_c^\top X_c \rVert_F^2}
                   {\lVert X_c^\top X_c \rVert_F\, \lVert Y_c^\top Y_c \rVert_F}

    with :math:`X_c, Y_c` the column-centred states ("Similarity of Neural Network
    Representations Revisited", ICML 2019, section 4, eq. 5 with the linear kernel; equal to
    :math:`\mathrm{HSIC}(K, L)/\sqrt{\mathrm{HSIC}(K, K)\,\mathrm{HSIC}(L, L)}` for the Gram
    matrices :math:`K = XX^\top`, :math:`L = YY^\top`). In [0, 1]; 1 when the two differ by an
    orthogonal transform and an isotropic scaling (plus a translation); not invariant to general
    invertible linear maps.

    Parameters
    ----------
    X : Tensor or ndarray, shape (n, d1)
    Y : Tensor or ndarray, shape (n, d2)
        Paired states (same rows, any widths); any float dtype and device. Computed in float64
        on ``X``'s device.

    Returns
    -------
    float in [0, 1]

    Raises
    ------
    ValueError
        If either input is not 2-D, has fewer than 2 rows, contains NaN/Inf or has zero
        variance, or if the row counts differ.

    Notes
    -----
    Feature-space form (d1 x d2, d1 x d1 and d2 x d2 products, O(n d^2)) when ``n`` exceeds
    both widths; otherwise the Gram form (n x n, O(n^2 d)), same value. Float64 because the
    numerator is a sum of squares of products: in float32 the relative error of CKA reaches
    ~1e-4 for n in the tens of thousands.

    Examples
    --------
    >>> import torch
    >>> X = torch.randn(100, 5, generator=torch.Generator().manual_seed(0))
    >>> Q, _ = torch.linalg.qr(torch.randn(5, 5, generator=torch.Generator().manual_seed(1)))
    >>> round(linear_cka(X, 3.0 * X @ Q + 1.0), 6)  # rotated, scaled, shifted: same geometry
    1.0
    """
    X, Y = check_paired(X, Y)
    return _linear_cka(X, Y)


def _linear_cka(X: torch.Tensor, Y: torch.Tensor) -> float:
    Xc = X.to(torch.float64)
    Yc = Y.to(device=Xc.device, dtype=torch.float64)
    Xc = Xc - Xc.mean(dim=0, keepdim=True)
    Yc = Yc - Yc.mean(dim=0, keepdim=True)
    n, d1 = Xc.shape
    d2 = Yc.shape[1]
    if n > max(d1, d2):  # feature space: (d1, d2), (d1, d1), (d2, d2)
        xy = torch.linalg.matrix_norm(Yc.T @ Xc) ** 2
        xx = torch.linalg.matrix_norm(Xc.T @ Xc)
        yy = torch.linalg.matrix_norm(Yc.T @ Yc)
    else:  # Gram form, (n, n): <K, L>_F = ||Y^T X||_F^2, ||K||_F = ||X^T X||_F
        K = Xc @ Xc.T
        L = Yc @ Yc.T
        xy = (K * L).sum()
        xx = torch.linalg.matrix_norm(K)
        yy = torch.linalg.matrix_norm(L)
    for name, norm in (("X", xx), ("Y", yy)):
        if float(norm) <= 0.0:
            raise ValueError(f"{name} has zero variance (all rows identical); CKA is undefined")
    return float(xy / (xx * yy))


def linear_cka_unbiased(X, Y) -> float:
    r"""Linear CKA from the unbiased HSIC estimator (Song, Smola, Gretton, Bedo & Borgwardt
    2012; as used by Nguyen, Raghu & Kornblith 2021).

    .. math:: \operatorname{CKA}_u(X, Y) = \frac{\mathrm{HSIC}_1(K, L)}
              {\sqrt{\mathrm{HSIC}_1(K, K)\,\mathrm{HSIC}_1(L, L)}},

    .. math:: \mathrm{HSIC}_1(K, L) = \frac{1}{n(n-3)} \Big[\operatorname{tr}(\tilde K \tilde L)
              + \frac{\mathbf 1^\top \tilde K \mathbf 1\, \mathbf 1^\top \tilde L \mathbf 1}
              {(n-1)(n-2)} - \frac{2}{n-2} \mathbf 1^\top \tilde K \tilde L \mathbf 1\Big]

    with :math:`K = XX^\top`, :math:`L = YY^\top` and :math:`\tilde K, \tilde L` the same with
    their diagonals set to 0 ("Feature selection via dependence maximization", JMLR 13, 2012,
    theorem 2; "Do wide and deep networks learn the same things?", ICLR 2021, section 3).
    `linear_cka` (Kornblith et al. eq. 5) uses the biased HSIC, whose bias grows as the number
    of rows falls towards the widths: on independent Gaussian states of n = 32 rows it reads
    about 0.2 (MONAI PR #9129) where this reads about 0; for large n the two agree. Values can
    fall slightly below 0 (an unbiased estimate of 0).

    Parameters
    ----------
    X : Tensor or ndarray, shape (n, d1)
    Y : Tensor or ndarray, shape (n, d2)
        Paired states, n >= 4; computed in float64 on ``X``'s device.

    Returns
    -------
    float, at most 1

    Raises
    ------
    ValueError
        As `linear_cka`; also if n < 4 or an unbiased self-HSIC is not positive (constant
        states, or too few rows to estimate it).

    Notes
    -----
    Computed in feature space, O(n d1 d2), without the n x n Gram matrices:
    :math:`\operatorname{tr}(\tilde K \tilde L) = \lVert Y^\top X \rVert_F^2 - \sum_i
    \lVert x_i \rVert^2 \lVert y_i \rVert^2`, and :math:`\tilde K \mathbf 1` is
    :math:`X (X^\top \mathbf 1) - (\lVert x_i \rVert^2)_i`. The states are centred first
    (in float64): the estimator does not change (it is invariant to a translation of either
    side), but its sums lose less to rounding.

    Examples
    --------
    >>> import torch
    >>> X = torch.randn(500, 5, generator=torch.Generator().manual_seed(0))
    >>> round(linear_cka_unbiased(X, 2.0 * X + 1.0), 6)
    1.0
    """
    X, Y = check_paired(X, Y, min_rows=4)
    return _linear_cka_unbiased(X, Y)


def _hsic_unbiased_parts(X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row norms (diag K), K~ 1 and 1^T K~ 1 of the linear kernel of `X` (float64)."""
    norms = (X * X).sum(dim=1)
    column = X.sum(dim=0)
    row_sums = X @ column - norms
    return norms, row_sums, row_sums.sum()


def _hsic_unbiased(X, Y, parts_x, parts_y, cross: torch.Tensor) -> torch.Tensor:
    """HSIC_1 of the linear kernels of X and Y, given ``cross = ||Y^T X||_F^2``."""
    n = X.shape[0]
    (kx, rx, sx), (ky, ry, sy) = parts_x, parts_y
    trace = cross - (kx * ky).sum()
    return (trace + sx * sy / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * (rx * ry).sum()) / (
        n * (n - 3))


def _centred64(X: torch.Tensor, device=None) -> torch.Tensor:
    X = X.to(device=device or X.device, dtype=torch.float64)
    return X - X.mean(dim=0, keepdim=True)


def _linear_cka_unbiased(X: torch.Tensor, Y: torch.Tensor) -> float:
    Xc = _centred64(X)
    Yc = _centred64(Y, Xc.device)
    px, py = _hsic_unbiased_parts(Xc), _hsic_unbiased_parts(Yc)
    xy = _hsic_unbiased(Xc, Yc, px, py, torch.linalg.matrix_norm(Yc.T @ Xc) ** 2)
    xx = _hsic_unbiased(Xc, Xc, px, px, torch.linalg.matrix_norm(Xc.T @ Xc) ** 2)
    yy = _hsic_unbiased(Yc, Yc, py, py, torch.linalg.matrix_norm(Yc.T @ Yc) ** 2)
    for name, value in (("X", xx), ("Y", yy)):
        if not float(value) > 0.0:
            raise ValueError(
                f"the unbiased HSIC of {name} with itself is {float(value):.3g}, not positive: "
                f"{name} is constant or has too few rows ({X.shape[0]}); use linear_cka"
            )
    return float(xy / torch.sqrt(xx * yy))


def mutual_knn(X, Y, *, k: int = 10) -> float:
    r"""Mutual k-nearest-neighbour alignment (Huh, Cheung, Wang & Isola 2024).

    .. math:: m_k(X, Y) = \frac{1}{n} \sum_{i=1}^{n} \frac{|N^X_k(i) \cap N^Y_k(i)|}{k}

    where :math:`N^X_k(i)` are the ``k`` rows of ``X`` (other than ``i``) most cosine-similar
    to row ``i`` ("The Platonic Representation Hypothesis", ICML 2024, section 2 and appendix
    A). As in the authors' code (``compute_score`` normalises the features, then
    ``mutual_knn`` ranks by inner product), the neighbours are those of the L2-normalised rows:
    cosine similarity, equivalently Euclidean distance between unit vectors. The rows are not
    centred. The paper uses ``k = 10``; its code also clips outlier feature values (the 95th
    percentile of absolute values) before this, a preprocessing step not done here.

    1 when both sides have the same neighbourhoods (e.g. ``Y`` a rotated, rescaled ``X``); for
    independent ``X`` and ``Y`` the expected value is ``k / (n - 1)``.

    Parameters
    ----------
    X : Tensor or ndarray, shape (n, d1)
    Y : Tensor or ndarray, shape (n, d2)
        Paired states (same rows, any widths); any float dtype and device. Each side is searched
        on its own device.
    k : int, keyword-only
        Neighbours per row, ``1 <= k <= n - 1``; 10 by default (the paper's).

    Returns
    -------
    float in [0, 1]

    Raises
    ------
    ValueError
        If either input is not 2-D, has fewer than 2 rows, contains NaN/Inf or an all-zero row
        (no direction), if the row counts differ, or if ``k`` is out of range.

    Notes
    -----
    The exact FAISS search of :func:`repgeom.metrics.nearest_neighbors` (self excluded),
    O(n^2 d) per side, on the unit rows normalised in float64. Ties in similarity (exact
    duplicate rows) are broken by the search order, so with duplicates the value can differ
    from another implementation's.

    Examples
    --------
    >>> import torch
    >>> X = torch.randn(200, 8, generator=torch.Generator().manual_seed(0))
    >>> mutual_knn(X, 2.0 * X)
    1.0
    """
    X, Y = check_paired(X, Y)
    k = check_int(k, "k")
    if k > X.shape[0] - 1:
        raise ValueError(f"k must be at most n - 1 = {X.shape[0] - 1} (X has {X.shape[0]} rows)")
    return _mutual_knn(X, Y, k)


def _unit_rows(X: torch.Tensor, name: str) -> torch.Tensor:
    X = X.to(torch.float64)
    norms = torch.linalg.vector_norm(X, dim=1, keepdim=True)
    if bool((norms == 0).any()):
        raise ValueError(
            f"{name} has {int((norms == 0).sum())} all-zero row(s); their cosine neighbours are "
            "undefined, drop them (from both inputs) first"
        )
    # float64 unit rows: _nearest_neighbors centres float64 input in float64 before the float32
    # search, so rows that share a large offset keep their small angular differences
    return X / norms


def _mutual_knn(X: torch.Tensor, Y: torch.Tensor, k: int) -> float:
    return _knn_overlap(_cosine_neighbors(X, k, "X"), _cosine_neighbors(Y, k, "Y"))


def _cosine_neighbors(X: torch.Tensor, k: int, name: str = "X") -> torch.Tensor:
    """(n, k) indices of each row's k nearest rows by cosine, self excluded: the half of
    `mutual_knn` that reads one set, so a probe comparing many pairs searches each set once."""
    return _nearest_neighbors(_unit_rows(X, name), k)[1]


def _knn_overlap(nx: torch.Tensor, ny: torch.Tensor) -> float:
    """Mean share of common members of two (n, k) neighbour-index sets, row by row."""
    k = nx.shape[1]
    nx = nx.cpu().contiguous()
    ny = torch.sort(ny.cpu(), dim=1).values.contiguous()
    # |N_X(i) & N_Y(i)|: a row's k indices are distinct, so count the members of N_X(i) found in
    # sorted N_Y(i) by binary search (O(n k) memory, where an (n, k, k) comparison is O(n k^2))
    pos = torch.searchsorted(ny, nx).clamp_max(k - 1)  # (n, k)
    overlap = (torch.gather(ny, 1, pos) == nx).sum(dim=1)  # (n,)
    return float(overlap.to(torch.float64).mean() / k)
