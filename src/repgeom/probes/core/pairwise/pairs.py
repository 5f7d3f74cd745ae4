"""Pairwise entries of the catalogue (linear CKA, mutual k-NN, linearity) on the probe's
batches: every two layers of one probe step (`measure_layer_pairs`), or two paired state sets
(`pair_value`, `pair_rows`: across steps and runs), with the permutation null where asked
(`repgeom.probes.core.pairwise.null`); and the two helpers every measurement shares."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from repgeom.probes.core import catalogue
from repgeom.probes.core.pairwise import null


@contextmanager
def _skip_on_error(out: Any, metric: str, layer: int) -> Iterator[None]:
    """On a ValueError from a metric (its inputs are unusable), record a warning and carry on."""
    try:
        yield
    except ValueError as error:
        out.warnings.append(f"probe: {metric} skipped at layer {layer}: {error}")


def _mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and population std over batches (std NaN for one batch: there is no spread)."""
    array = np.asarray(values, dtype=np.float64)
    return float(array.mean()), float(array.std()) if len(array) > 1 else math.nan



def measure_layer_pairs(
    out: Any,
    states: list[torch.Tensor],
    split: list[torch.Tensor],
    entries: list[catalogue.Metric],
    settings: Any,
) -> None:
    """Every pairwise entry between layers a <= b: mean and std over the same batches (an
    entry's ``prepare`` step, e.g. a neighbour search, runs once per layer and batch), and its
    permutation null where ``settings.null_permutations`` asks (`null.null_rows`)."""
    for entry in entries:
        prepared = [_PreparedBatches(entry, X, split) for X in states]
        for a in range(len(states)):
            for b in range(a, len(states)):
                with _skip_on_error(out, entry.name, a):
                    value, std = _mean_std(
                        [entry.fn(x, y) for x, y in zip(prepared[a], prepared[b], strict=True)]
                    )
                    out.add(a, entry.name, value, std, layer_b=b)
                    for name, extra, spread in null.null_rows(
                            entry, prepared[a], prepared[b], value,
                            permutations=settings.null_permutations, seed=settings.seed):
                        out.add(a, name, extra, spread, layer_b=b)


class _PreparedBatches:
    """The batches of one state set as a pairwise entry reads them, each prepared on first use."""

    def __init__(self, entry: catalogue.Metric, X: torch.Tensor, split: list[torch.Tensor]):
        self.entry, self.X, self.split = entry, X, split
        self.cache: list | None = None

    def __iter__(self):
        if self.cache is None:
            batches = [self.X[index.to(self.X.device)] for index in self.split]
            prepare = self.entry.prepare
            self.cache = batches if prepare is None else [prepare(b) for b in batches]
        return iter(self.cache)


def pair_value(
    entry: catalogue.Metric, X: torch.Tensor, Y: torch.Tensor, split: list[torch.Tensor]
) -> tuple[float, float]:
    """Mean and std over batches of a pairwise entry on paired rows of `X` and `Y`."""
    return pair_rows(entry, X, Y, split)[0][1:]


def pair_rows(entry: catalogue.Metric, X: torch.Tensor, Y: torch.Tensor,
              split: list[torch.Tensor], *, permutations: int = 0,
              seed: int = 0) -> list[tuple[str, float, float]]:
    """`pair_value`'s ``(metric, mean, std)`` row, then its null's (`null.null_rows`)."""
    A, B = _PreparedBatches(entry, X, split), _PreparedBatches(entry, Y, split)
    value, std = _mean_std([entry.fn(x, y) for x, y in zip(A, B, strict=True)])
    return [(entry.name, value, std),
            *null.null_rows(entry, A, B, value, permutations=permutations, seed=seed)]
