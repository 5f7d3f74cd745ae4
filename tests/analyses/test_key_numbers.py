"""scripts/analyses_key_numbers.py on planted analysis outputs: the numbers it prints for the
analyses' sections of docs/results.md are counted over blocks only, as planted."""

from __future__ import annotations

import importlib
from pathlib import Path

import pandas as pd
import pytest
from hydra_configs import ROOT


@pytest.fixture
def key_numbers(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    return importlib.import_module("analyses_key_numbers")


def _layers() -> list[tuple[int, str]]:
    return [(0, "embedding"), (1, "block_1"), (2, "block_2"), (3, "final_norm")]


def test_distributions_count_blocks_only(tmp_path: Path, key_numbers) -> None:
    # embedding and final_norm are won by the normal law; the 4 (group, block) samples: t, t,
    # t, logistic. Shares over blocks: student-t 3/4, logistic-type 1/4, normal 0.
    best = {("a", 1): "t", ("b", 1): "t", ("a", 2): "t", ("b", 2): "logistic"}
    rows = [
        {"group": g, "layer": i, "layer_name": n, "kurtosis": float(i), "t_df": 2.0 + i,
         "best_loglik": best.get((g, i), "normal")}
        for g in "ab" for i, n in _layers()
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "summary.csv", index=False)
    pd.DataFrame([
        {"layer_name": "block_1", "side": "left"}, {"layer_name": "block_2", "side": "main"},
        {"layer_name": "embedding", "side": "right"}, {"layer_name": "block_2", "side": "right"},
        {"layer_name": "block_2", "side": "left"},
    ]).to_csv(tmp_path / "modes.csv", index=False)
    pd.DataFrame([{"layer_name": n, "best_loglik": f"fam{i}"} for i, n in _layers()]).to_csv(
        tmp_path / "all_texts_summary.csv", index=False
    )
    row = key_numbers.distributions_row(tmp_path)
    assert row["samples"] == 4
    assert (row["student-t"], row["logistic-type"], row["normal"]) == ("75%", "25%", "0%")
    assert row["t d.o.f. where t wins (median, range)"] == "3.00 (3.00 to 4.00)"
    assert row["excess kurtosis per block (median over groups)"] == "1.00 to 2.00"
    assert row["secondary modes left/right (per group)"] == "2/1"
    assert row["best family, all texts, per block"] == "fam1, fam2"


def test_distinctiveness_and_similarity_read_the_planted_values(
    tmp_path: Path, key_numbers
) -> None:
    rows = [
        {"layer": i, "layer_name": n, "space": space, "subject": s, "attribute": a,
         "score": (1 if a == "angry" else -1) * 0.1 * i * (2 if space == "pca90" else 1)}
        for i, n in _layers() for space in ("raw", "pca90") for s in ("x", "y")
        for a in ("angry", "calm")
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "distinctiveness.csv", index=False)
    row = key_numbers.distinctiveness_row(tmp_path)
    assert row["mean abs(score) raw, per block"] == "0.100, 0.200"
    assert row["mean abs(score) pca90, per block"] == "0.200, 0.400"
    assert row["mean score raw, first -> last block"] == "0.000 -> 0.000"
    assert row["most attribute-attracting (raw mean)"] == "calm -0.150, angry 0.150"

    pairs = [
        {"pair": p, "layer": i, "layer_name": n, "cosine": c}
        for i, n in _layers()
        for p, c in ((0, 0.5 + 0.1 * i), (1, 0.9 if i == 3 else 0.1))
    ]
    pd.DataFrame(pairs).to_csv(tmp_path / "pair_similarity.csv", index=False)
    pd.DataFrame([
        {"layer": i, "layer_name": n, "n_tokens": 5, "mean_offdiag": 0.1 * i,
         "min_offdiag": -0.1 * i} for i, n in _layers()
    ]).to_csv(tmp_path / "self_similarity.csv", index=False)
    row = key_numbers.similarity_row(tmp_path)
    assert row["pooled cos, pair 0 (min to max)"] == "0.50 to 0.80"
    assert row["layers where pair 1 > pair 0"] == "1 of 4"
    assert row["last layer"] == "final_norm"
    assert row["token cos at last layer, mean / min"] == "0.300 / -0.300"
