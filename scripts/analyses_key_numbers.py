"""Print the key numbers of the analyses side by side for several models, as markdown tables.

The tables of docs/results_analyses.md (the analyses' sections of docs/results.md) are read off
this script's output; each model is a folder under docs/results/analyses written by
scripts/run_analyses_minilm.sh or scripts/run_analyses_checkpoints.sh:

    python scripts/analyses_key_numbers.py docs/results/analyses \\
        quickstart-causal quickstart-bidirectional minilm

Blocks are the layers named ``block_<i>``: the embedding and a final norm are not blocks.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
from analyses_readme import _groups, pct, table


def _blocks(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["layer_name"].str.startswith("block_")]


def _span(values: pd.Series) -> str:
    return f"{values.min():.2f} to {values.max():.2f}"


def distributions_row(d: Path) -> dict[str, object]:
    """Best family groups over (group, block) samples, t's d.o.f., kurtosis, secondary modes."""
    summary = _blocks(pd.read_csv(d / "summary.csv"))
    groups = summary["best_loglik"].map(_groups()).value_counts(normalize=True)
    t_rows = summary[summary["best_loglik"] == "t"]
    kurt = summary.groupby("layer")["kurtosis"].median()
    modes = pd.read_csv(d / "modes.csv")
    modes = _blocks(modes)
    every = pd.read_csv(d / "all_texts_summary.csv")
    return {
        "samples": len(summary),
        "logistic-type": pct(groups.get("logistic-type", 0.0)),
        "student-t": pct(groups.get("student-t", 0.0)),
        "gennorm/crystalball": pct(groups.get("gennorm/crystalball", 0.0)),
        "normal": pct(groups.get("normal", 0.0)),
        "t d.o.f. where t wins (median, range)": (
            f"{t_rows['t_df'].median():.2f} ({_span(t_rows['t_df'])})" if len(t_rows) else "-"
        ),
        "excess kurtosis per block (median over groups)": _span(kurt),
        "secondary modes left/right (per group)": (
            f"{(modes['side'] == 'left').sum()}/{(modes['side'] == 'right').sum()}"
        ),
        "best family, all texts, per block": ", ".join(_blocks(every)["best_loglik"]),
    }


def distinctiveness_row(d: Path) -> dict[str, object]:
    """Mean and mean |score| per block, first vs last block, and the most attracting attributes."""
    s = _blocks(pd.read_csv(d / "distinctiveness.csv"))
    row: dict[str, object] = {}
    for space in ("raw", "pca90"):
        part = s[s["space"] == space]
        mean = part.groupby("layer")["score"].mean()
        mean_abs = part.groupby("layer")["score"].apply(lambda x: x.abs().mean())
        row[f"mean abs(score) {space}, per block"] = ", ".join(f"{v:.3f}" for v in mean_abs)
        row[f"mean score {space}, first -> last block"] = (
            f"{mean.iloc[0]:.3f} -> {mean.iloc[-1]:.3f}"
        )
    raw = s[s["space"] == "raw"].groupby("attribute")["score"].mean().sort_values()
    row["most attribute-attracting (raw mean)"] = ", ".join(
        f"{k} {v:.3f}" for k, v in raw.iloc[:2].items()
    )
    return row


def similarity_row(d: Path) -> dict[str, object]:
    """Pooled cosine of the two pairs over all layers, and token self-similarity at the last."""
    pairs = pd.read_csv(d / "pair_similarity.csv")
    selfsim = pd.read_csv(d / "self_similarity.csv")
    p = pairs.pivot_table(index="layer", columns="pair", values="cosine")
    last = selfsim.iloc[-1]
    return {
        "pooled cos, pair 0 (min to max)": _span(p[0]),
        "pooled cos, pair 1 'abcdef' (min to max)": _span(p[1]),
        "layers where pair 1 > pair 0": f"{int((p[1] > p[0]).sum())} of {len(p)}",
        "last layer": last["layer_name"],
        "token cos at last layer, mean / min": (
            f"{last['mean_offdiag']:.3f} / {last['min_offdiag']:.3f}"
        ),
        "tokens": int(last["n_tokens"]),
    }


def main(root: str, models: list[str]) -> None:
    base = Path(root)
    for title, row, sub in (
        ("distributions", distributions_row, "distributions"),
        ("distinctiveness", distinctiveness_row, "distinctiveness"),
        ("similarity", similarity_row, "similarity"),
    ):
        frame = pd.DataFrame({m: row(base / m / sub) for m in models})
        print(f"### {title}\n\n{table(frame.reset_index().rename(columns={'index': ''}))}\n")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: analyses_key_numbers.py <analyses folder> <model folder> [...]")
    main(sys.argv[1], sys.argv[2:])
