"""The centred states and the eigenvalues of their scatter matrix, shared by the metrics that
read them.

Anisotropy, IsoScore, the PCA dimension and the effective rank all read the eigenvalues of
``Xc^T Xc`` (``Xc`` the states centred in float64; the PCA dimension and the effective rank read
``Xc Xc^T`` when there are fewer states than dimensions), RankMe its eigenvectors as well. Inside
`shared_spectrum()` each tensor is centred and decomposed once, whichever metric asks first;
outside it nothing is kept. The values are those each metric computes on its own (the same
operations on the same tensor), so sharing changes no number.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_STATE = threading.local()


@contextmanager
def shared_spectrum() -> Iterator[None]:
    """Within this block, `centred` and `scatter_eigenvalues` compute once per tensor (kept
    until the block ends; an in-place change of the tensor is noticed and recomputed)."""
    outer = getattr(_STATE, "cache", None)
    _STATE.cache = {} if outer is None else outer
    try:
        yield
    finally:
        _STATE.cache = outer


def _cached(kind: str, X: torch.Tensor, compute) -> torch.Tensor:
    cache = getattr(_STATE, "cache", None)
    if cache is None:
        return compute()
    key = (kind, id(X))
    hit = cache.get(key)
    if hit is not None and hit[0] is X and hit[1] == X._version:
        return hit[2]
    value = compute()
    cache[key] = (X, X._version, value)  # X kept alive: its id stays its own
    return value


def centred(X: torch.Tensor) -> torch.Tensor:
    """``X`` in float64 minus its column mean (do not modify the result in place)."""

    def compute() -> torch.Tensor:
        Xc = X.to(torch.float64)
        return Xc - Xc.mean(dim=0, keepdim=True)

    return _cached("centred", X, compute)


def scatter_eigenvalues(X: torch.Tensor) -> torch.Tensor:
    """Ascending eigenvalues of the d x d scatter matrix ``Xc^T Xc`` of `centred` ``X``."""

    def compute() -> torch.Tensor:
        Xc = centred(X)
        return torch.linalg.eigvalsh(Xc.T @ Xc)

    return _cached("scatter_eigenvalues", X, compute)


def centred_eigenvalues(X: torch.Tensor) -> torch.Tensor:
    """Ascending eigenvalues of the smaller of ``Xc^T Xc`` (d x d, `scatter_eigenvalues`) and
    ``Xc Xc^T`` (n x n): the same nonzero spectrum, the squared singular values of ``Xc``."""
    n, d = X.shape
    if n >= d:
        return scatter_eigenvalues(X)

    def compute() -> torch.Tensor:
        Xc = centred(X)
        return torch.linalg.eigvalsh(Xc @ Xc.T)

    return _cached("gram_eigenvalues", X, compute)


# Eigenvalues below this share of the largest are recomputed from the states (`gram_eigh`): there
# the Gram matrix's rounding, about k * eps * max for k x k, exceeds 1e-10 of the value itself.
_REFINE_BELOW = 1e-6


def gram_eigh(A: torch.Tensor, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues (ascending) and eigenvectors (columns) of ``A^T A``, each eigenvalue accurate
    relative to itself, not only to the largest, and those of ``A``'s rank-deficient directions 0.

    ``A`` is float64, (m, k) with m >= k. ``eigh(A^T A)`` gives every eigenvalue to within about
    ``k * eps * max`` (Golub & Van Loan, Matrix Computations, chapter 8); read as singular
    values (their square roots), a zero direction would come out near ``sqrt(eps) = 1.5e-8`` of
    the largest, and a real one of ``1e-7`` (float32 states' own rounding) 1% off. So the
    eigenpairs below `_REFINE_BELOW` of the largest are computed again from ``A`` itself (a
    Rayleigh-Ritz step: ``Y = A V_small``, ``eigh(Y^T Y)``), where their rounding is relative to
    their own size, and again within them until none is left. Eigenvalues whose square roots
    are below ``max(m, k) * eps * scale`` are then 0: numpy's ``matrix_rank`` tolerance, with
    ``scale`` the size of the numbers ``A`` was made from (the Frobenius norm of the states
    before centring: below it lie the directions of their own float64 rounding, which an SVD
    reads as singular values of ``1e-15`` and up); ``A``'s largest singular value by default.
    """
    lam, V = torch.linalg.eigh(A.T @ A)
    top = lam[-1].clamp_min(0.0)
    if scale is None:
        scale = float(top.sqrt())
    floor = torch.tensor((max(A.shape) * torch.finfo(A.dtype).eps * scale) ** 2,
                         dtype=lam.dtype, device=lam.device)
    lam, V = _refined(A, lam, V, floor)
    return torch.where(lam > floor, lam, torch.zeros_like(lam)), V


def _refined(A: torch.Tensor, lam: torch.Tensor, V: torch.Tensor,
             floor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    top = lam[-1]
    m = int((lam < _REFINE_BELOW * top).sum())  # ascending: the first m are small
    if m == 0 or top <= floor:  # nothing small, or all of it below the rank floor
        return lam, V
    Vs = V[:, :m]
    Y = A @ Vs  # (rows, m): the states along the small directions, rounded at their own scale
    small, W = torch.linalg.eigh(Y.T @ Y)
    small, Vs = _refined(A, small, Vs @ W, floor)
    return torch.cat([small, lam[m:]]), torch.cat([Vs, V[:, m:]], dim=1)


def centred_gram_eigh(X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`gram_eigh` of the `centred` states: of ``Xc`` (eigenvectors d x d) when n >= d, of
    ``Xc^T`` (eigenvectors n x n) otherwise; the eigenvalues are the squared singular values of
    ``Xc`` either way."""
    n, d = X.shape

    def compute() -> tuple[torch.Tensor, torch.Tensor]:
        Xc = centred(X)
        scale = float(torch.linalg.vector_norm(X.to(torch.float64)))  # before centring
        return gram_eigh(Xc if n >= d else Xc.T, scale)

    return _cached("centred_gram_eigh", X, compute)
