"""The permutation null of the pairwise entries: off by default; chance levels and p-values of
CKA and mutual k-NN; the relabelled neighbour lists equal a new search of the shuffled set."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from repgeom import metrics
from repgeom.metrics import alignment
from repgeom.models.capture import Capture
from repgeom.probes.core.measure import ProbeSettings, measure
from repgeom.probes.core.pairwise.null import permute_neighbors


def _capture() -> tuple[Capture, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(400, 12, generator=g)
    related = X @ torch.randn(12, 12, generator=g) + 0.3 * torch.randn(400, 12, generator=g)
    unrelated = torch.randn(400, 12, generator=g)
    return Capture(hidden=[X[None], related[None], unrelated[None]]), X, related, unrelated


def _pairs(settings: ProbeSettings) -> pd.DataFrame:
    capture = _capture()[0]
    frame = pd.DataFrame(measure([capture], [], settings).rows)
    return frame.set_index(["metric", "layer", "layer_b"])


def test_off_by_default() -> None:
    frame = _pairs(ProbeSettings(metrics=["linear_cka", "mutual_knn"], state_batch_size=200))
    assert not any(m.endswith(("_chance", "_p")) for m in frame.index.get_level_values(0))


def test_chance_and_p_of_related_and_unrelated_layers() -> None:
    P = 60
    settings = ProbeSettings(metrics=["linear_cka", "linear_cka_unbiased", "mutual_knn"],
                             state_batch_size=200, null_permutations=P)
    frame = _pairs(settings)["value"]
    for name in ("linear_cka", "linear_cka_unbiased", "mutual_knn"):
        # related layers: every shuffle reads less than the real pairing, p is its minimum
        assert frame[(f"{name}_p", 0, 1)] == pytest.approx(1 / (1 + P))
        assert frame[(f"{name}_chance", 0, 1)] < 0.5 * frame[(name, 0, 1)]
        # unrelated layers: the observed value is one more draw of the null
        assert frame[(f"{name}_p", 0, 2)] > 0.05
    # mutual k-NN's chance level is k / (n - 1) for unrelated sets (batches of n = 200)
    assert frame[("mutual_knn_chance", 0, 1)] == pytest.approx(10 / 199, rel=0.15)
    # biased CKA's chance level at n = 200, d = 12 is far above 0; the unbiased one's is ~0
    assert frame[("linear_cka_chance", 0, 2)] > 0.03
    assert abs(frame[("linear_cka_unbiased_chance", 0, 2)]) < 0.01


def test_chance_is_the_mean_of_the_shuffled_statistic() -> None:
    P = 5
    settings = ProbeSettings(metrics=["linear_cka"], state_batch_size=200, null_permutations=P,
                             seed=3)
    frame = _pairs(settings)
    _, X, related, _ = _capture()
    split = metrics.batch_indices(400, 200, 3)
    generator = torch.Generator().manual_seed(3)
    null = []
    for _ in range(P):
        values = []
        for index in split:
            perm = torch.randperm(len(index), generator=generator)
            values.append(metrics.linear_cka(X[index], related[index][perm]))
        null.append(np.mean(values))
    row = frame.loc[("linear_cka_chance", 0, 1)]
    assert row["value"] == pytest.approx(np.mean(null), rel=1e-12)
    assert row["std"] == pytest.approx(np.std(null), rel=1e-9)


def test_relabelled_neighbours_equal_a_search_of_the_shuffled_set() -> None:
    Y = torch.randn(300, 8, generator=torch.Generator().manual_seed(1))
    perm = torch.randperm(300, generator=torch.Generator().manual_seed(2))
    relabelled = permute_neighbors(alignment._cosine_neighbors(Y, 10), perm)
    searched = alignment._cosine_neighbors(Y[perm], 10)
    assert torch.equal(relabelled.sort(dim=1).values, searched.sort(dim=1).values)


def test_negative_permutations_are_refused() -> None:
    with pytest.raises(ValueError, match="null_permutations"):
        ProbeSettings(null_permutations=-1)


def test_the_stated_cost_each_shuffle_calls_the_statistic_the_search_runs_once(monkeypatch):
    """What the module docstring says the null costs and saves: ``P x n_batches`` more calls of
    each pair's statistic (CKA in full, all three products), and mutual k-NN's neighbour search
    once per layer and batch whatever ``P``."""
    from repgeom.probes.core import catalogue
    from repgeom.probes.core.pairwise import null

    calls = {"cka": 0, "search": 0}
    cka, knn = catalogue.BUILTIN["linear_cka"], catalogue.BUILTIN["mutual_knn"]

    def counted(fn, key):
        def wrapper(*args, **kwargs):
            calls[key] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setitem(catalogue.BUILTIN, "linear_cka",
                        dataclasses.replace(cka, fn=counted(cka.fn, "cka")))
    monkeypatch.setitem(catalogue.BUILTIN, "mutual_knn",
                        dataclasses.replace(knn, prepare=counted(knn.prepare, "search")))
    P, n_layers, n_batches = 7, 3, 2
    n_pairs = n_layers * (n_layers + 1) // 2
    _pairs(ProbeSettings(metrics=["linear_cka", "mutual_knn"], state_batch_size=200,
                         null_permutations=P))
    assert calls["cka"] == n_pairs * n_batches * (1 + P)
    assert calls["search"] == n_layers * n_batches
    doc = " ".join(null.__doc__.split())
    assert "computes the whole statistic again" in doc and "runs once per layer and batch" in doc
