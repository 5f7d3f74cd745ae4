"""A permutation null for the pairwise similarity entries (linear CKA, its unbiased form, mutual
k-NN): how similar two state sets read when their rows are no longer paired.

Off by default: ``ProbeSettings.null_permutations`` (``settings.null_permutations=100``) turns
it on. For each pair the probe compares, the rows of the second set are shuffled within each
batch ``P`` times (the same ``P`` shuffles, from the probe's seed, for every pair); each shuffle
gives the statistic the table holds (the mean over the batches), and so a null distribution of
``P`` values. Two rows join the pair's row, on the same layers and steps:

- ``<metric>_chance``: the mean of the null distribution (its std in ``std``): the value two
  unrelated sets of this size and shape read (linear CKA's grows as the rows fall towards the
  widths; mutual k-NN's is ``k / (n - 1)``);
- ``<metric>_p``: the permutation p-value ``(1 + #{null >= observed}) / (1 + P)`` (Phipson &
  Smyth 2010), at least ``1 / (1 + P)``.

Cost, for every pair the probe compares (``L (L + 1) / 2`` layer pairs per step, and each
step against the final one where asked) and every batch: ``P`` more calls of the entry's
statistic (`pair_null`: ``P x n_batches`` calls per pair, counted by a test).

- What it saves: only the *preparation* of a set. Mutual k-NN's neighbour search (the costly
  part, ``O(n^2 d)`` per batch) runs once per layer and batch whatever ``P``; each shuffle
  relabels the second set's neighbour lists (`permute_neighbors`) and counts the overlap,
  ``O(n k log k)``: a fraction of a second per pair at ``P = 100``.
- What it does not save: linear CKA (either form) has no preparation, so each shuffle computes
  the whole statistic again, centring both sets and forming all three products ``X^T X``,
  ``Y^T Y`` and ``Y^T X`` (``O(n (d1^2 + d2^2 + d1 d2))``), although a row shuffle changes only
  the cross term ``Y^T X``. The null of a CKA pair therefore costs ``P`` times the pair itself:
  gpt_tiny's 7 layers give 28 pairs x 2 batches of 4096 x 128 x 128, which at ``P = 100`` adds
  tens of seconds per probe step on one CPU core, several times the default probe. Hence off
  by default, and meant for a final checkpoint rather than every training step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch


def permute_rows(prepared: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """States with their rows in the order `perm` (row ``i`` of the result is row ``perm[i]``)."""
    return prepared[perm.to(prepared.device)]


def permute_neighbors(neighbors: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """The (n, k) neighbour lists of ``Y[perm]`` from those of ``Y``: the same neighbour
    search, relabelled. Row ``i`` of ``Y[perm]`` is row ``perm[i]`` of ``Y``, and ``Y``'s row
    ``m`` is row ``inverse[m]`` of ``Y[perm]``."""
    perm = perm.to(neighbors.device)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(len(perm), device=perm.device)
    return inverse[neighbors[perm]]


def pair_null(entry, prepared_a: Sequence, prepared_b: Sequence, observed: float, *,
              permutations: int, seed: int) -> tuple[float, float, float]:
    """(chance level, its std, p) of a pairwise catalogue entry (one with ``permute``) on two
    prepared batch lists (`measure._PreparedBatches`), whose observed mean over batches is
    `observed`; see the module docstring."""
    generator = torch.Generator().manual_seed(int(seed))
    a_batches, b_batches = list(prepared_a), list(prepared_b)
    null = np.empty(permutations)
    for r in range(permutations):
        values = []
        for a, b in zip(a_batches, b_batches, strict=True):
            perm = torch.randperm(len(b), generator=generator)
            values.append(entry.fn(a, entry.permute(b, perm)))
        null[r] = np.mean(values)
    p = (1 + int((null >= observed).sum())) / (1 + permutations)
    return float(null.mean()), float(null.std()), p


def null_rows(entry, prepared_a: Sequence, prepared_b: Sequence, observed: float, *,
              permutations: int, seed: int) -> list[tuple[str, float, float]]:
    """The ``<metric>_chance`` and ``<metric>_p`` rows of a pair (none when `permutations` is 0
    or the entry has no ``permute``)."""
    if not permutations or entry.permute is None:
        return []
    chance, std, p = pair_null(entry, prepared_a, prepared_b, observed,
                               permutations=permutations, seed=seed)
    return [(f"{entry.name}_chance", chance, std), (f"{entry.name}_p", p, math.nan)]
