"""The centred states and the eigenvalues of their scatter matrix, shared by the metrics that
read them.

Anisotropy, IsoScore and the PCA dimension all read the eigenvalues of ``Xc^T Xc`` (``Xc`` the
states centred in float64), and the effective rank the centred states themselves. Inside
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
