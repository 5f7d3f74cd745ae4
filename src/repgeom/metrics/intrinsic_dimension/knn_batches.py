"""The batches every intrinsic-dimension estimator reads, and their one exact kNN search.

Pipeline shared by :mod:`twonn`, :mod:`gride`, :mod:`mle`, :mod:`near_duplicates` and their
one-search combination :mod:`intrinsic_dimension` (so their numbers agree):

1. centre ``X`` and cast to float32 -- the data FAISS searches;
2. shuffle with ``seed`` and cut into ``max(1, n // batch_size)`` batches of at least
   ``batch_size`` rows (one batch if ``n < batch_size``; `batch_indices`), as in Facco et al.
   2017 and Razzhigaev et al. 2023, section 2.2 -- the same batches the probe uses for its other
   per-layer metrics;
3. remove exact duplicate rows within each batch (``r1 = 0`` breaks the ratio estimators),
   counting them;
4. one exact kNN search per batch (:func:`repgeom.metrics.nearest_neighbors`), then each
   estimator reads the neighbour distances it needs (:class:`Neighbours`); results are mean and
   (population) standard deviation over batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse
import scipy.sparse.csgraph
import torch

from ..neighbors import _centre32, _nearest_neighbors

__all__ = ["batch_indices", "Neighbours", "search_batches", "DUPLICATE_ULPS"]


# Rows closer than this many float units (ulps) of the batch's RMS row norm are one state: the
# same context computed in two rows of a batch may round differently in the BLAS kernels.
DUPLICATE_ULPS = 64


def unique_rows(X: torch.Tensor) -> torch.Tensor:
    """Indices (ascending) of the rows kept when rows equal up to rounding are merged.

    Two rows are duplicates when ``||x_i - x_j|| <= DUPLICATE_ULPS * eps * rms``, with ``eps``
    the working precision (float32, or float64 for float64 data) and ``rms`` the RMS row norm:
    a state computed twice from the same context differs by a few ulps when the two copies sit
    in different rows of a batch (BLAS kernels round rows differently, and differently on
    different CPUs), so exact equality would count it once here and twice there. Each group
    of connected duplicates keeps its first row.

    Candidates come from one projection on a random unit vector: ``|u.(x_i - x_j)| <=
    ||x_i - x_j||``, so every duplicate pair is within ``delta`` in the sorted projections and
    only such pairs are compared (no pair is missed, and no n x n comparison is made).
    """
    n = X.shape[0]
    work = X if X.dtype == torch.float64 else X.to(torch.float32)
    rms = float(torch.linalg.vector_norm(work.double()) / math.sqrt(n))
    delta = DUPLICATE_ULPS * torch.finfo(work.dtype).eps * rms
    gen = torch.Generator().manual_seed(12345)
    u = torch.randn(work.shape[1], generator=gen, dtype=torch.float64).to(X.device)
    projection = work.double() @ (u / torch.linalg.vector_norm(u))
    order = torch.argsort(projection, stable=True)
    sorted_projection = projection[order]
    first, second = [], []
    for offset in range(1, n):  # pairs `offset` apart in the sorted order, while any is close
        close = (sorted_projection[offset:] - sorted_projection[:-offset]) <= delta
        if not close.any():
            break
        a, b = order[:-offset][close], order[offset:][close]
        same = torch.linalg.vector_norm((work[a] - work[b]).double(), dim=1) <= delta
        first.append(a[same])
        second.append(b[same])
    if not first or not torch.cat(first).numel():
        return torch.arange(n, device=X.device)
    i, j = torch.cat(first).cpu().numpy(), torch.cat(second).cpu().numpy()
    graph = scipy.sparse.coo_matrix((np.ones(len(i)), (i, j)), shape=(n, n))
    _, label = scipy.sparse.csgraph.connected_components(graph, directed=False)
    _, keep = np.unique(label, return_index=True)  # the first row of each group
    return torch.from_numpy(np.sort(keep)).to(X.device)


def batch_indices(n: int, batch_size: int, seed: int) -> list[torch.Tensor]:
    """Row indices of the shuffled batches: ``max(1, n // batch_size)`` batches of at least
    `batch_size` rows from one permutation drawn with `seed` (all rows, in order, when that is
    one batch).

    >>> [len(b) for b in batch_indices(10, 4, seed=0)]
    [5, 5]
    """
    n_batches = max(1, n // batch_size)
    if n_batches == 1:
        return [torch.arange(n)]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return list(torch.tensor_split(perm, n_batches))


def distinct_batches(X: torch.Tensor, batch_size: int, seed: int, *, min_points: int, what: str,
                     rows: list | None = None):
    """Shuffle, split, deduplicate within each batch and centre; returns (list of float32
    batches, n_duplicates).

    Each batch is centred with the mean of all of ``X`` as it is gathered, which saves a pass
    over the data compared with centring first (see :func:`_centre32` for why centre at all).
    """
    X = X if X.dtype == torch.float64 else X.to(torch.float32)
    mean = X.mean(dim=0, keepdim=True)
    batches, n_dup = [], 0
    for index in batch_indices(X.shape[0], batch_size, seed):
        index = index.to(X.device)
        keep = index[unique_rows(X[index])]
        n_dup += len(index) - len(keep)
        if rows is not None:  # which rows of X each batch holds
            rows.append(keep.cpu().numpy())
        batches.append(_centre32(X[keep], mean))
    n = X.shape[0] - n_dup
    smallest = min(b.shape[0] for b in batches)
    if smallest < min_points:
        raise ValueError(
            f"X has {n} distinct points ({n_dup} exact duplicates removed), giving a batch of "
            f"{smallest}; {what} needs at least {min_points} distinct points per batch. "
            "Pass more points" + (" or a smaller max_order" if "max_order" in what else "")
        )
    return batches, n_dup


@dataclass(frozen=True)
class Neighbours:
    """The sorted distances to the ``k`` nearest other points, per batch.

    distances : list of ndarray (n_b, k), float64, one per batch; every ``distances[b][:, 0]``
        is > 0 (points whose nearest distance was still 0 in float32 are dropped and counted).
    n_duplicates : rows removed as duplicates (see ``DUPLICATE_ULPS``) plus those dropped points.
    """

    distances: list
    n_duplicates: int
    rows: list = field(default_factory=list)
    """Per batch, (n_b,) int64: the row of ``X`` each row of ``distances`` belongs to."""

    @property
    def n_batches(self) -> int:
        return len(self.distances)

    @property
    def n_points(self) -> int:
        """Distinct points used, over all batches."""
        return sum(r.shape[0] for r in self.distances)


def search_batches(X: torch.Tensor, *, k: int, batch_size: int, seed: int, min_points: int,
                   what: str) -> Neighbours:
    """Batches of ``X`` (:func:`distinct_batches`) and one exact search for ``k`` neighbours in
    each; ``min_points`` and ``what`` word the error on a batch too small for the caller."""
    kept: list = []
    batches, n_dup = distinct_batches(X, batch_size, seed, min_points=min_points, what=what,
                                      rows=kept)
    distances = []
    for b, Xb in enumerate(batches):
        dist, _ = _nearest_neighbors(Xb, k, centred=True)  # centred globally in distinct_batches
        r = dist.detach().cpu().numpy().astype(np.float64)  # (nb, k)
        zero = r[:, 0] <= 0.0  # float32 coincidences that survived deduplication
        if zero.any():
            n_dup += int(zero.sum())
            r = r[~zero]
            kept[b] = kept[b][~zero]
        distances.append(r)
    return Neighbours(distances=distances, n_duplicates=n_dup, rows=kept)
