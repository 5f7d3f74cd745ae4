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


def scatter_eigh(X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ascending eigenvalues and the eigenvectors (columns) of ``Xc^T Xc``, `centred` ``X``."""

    def compute() -> tuple[torch.Tensor, torch.Tensor]:
        Xc = centred(X)
        return torch.linalg.eigh(Xc.T @ Xc)

    return _cached("scatter_eigh", X, compute)


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


def above_rounding_floor(lam: torch.Tensor) -> torch.Tensor:
    """Eigenvalues of a float64 Gram matrix with those below its rounding floor read as 0.

    The floor is ``k * eps * max(lam)`` for a k x k matrix (``eps`` of float64), the size of the
    symmetric eigensolvers' error bound (a modest multiple of ``eps * ||G||_2``; Golub & Van
    Loan, Matrix Computations, chapter 8): below it the eigenvalue of an exact zero direction
    and rounding noise cannot be told apart. A floor of ``n * eps * max(lam)`` with n = 8192
    states would be too high: it reads a real eigenvalue ``1e-12 * max(lam)`` (singular values
    with a condition number of 1e6) as 0 (tests/metrics/test_metrics_rank.py measures both).
    """
    floor = lam.shape[-1] * torch.finfo(lam.dtype).eps * lam.max()
    return torch.where(lam > floor, lam, torch.zeros_like(lam))
