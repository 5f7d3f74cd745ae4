"""Pre-softmax attention scores per layer: their distribution and the row extremes.

Godey, de la Clergerie and Sagot 2024 ("Anisotropy Is Inherent to Self-Attention in
Transformers", papers/003), section 4.3, Fig. 7, draw histograms of the pre-softmax scores
:math:`QK^T/\\sqrt{d_k}` of a block and show that they move away from zero as the inputs drift;
section 4.4, Fig. 10, compare the maximum and minimum "over the whole sequences", averaged over
the batch, as the sign that attention sharpens. Their block is untrained and fed biased random
inputs (`repgeom.experiments.common_bias` repeats that); this analysis reads the same quantities
from a trained model on real text, per block:

* ``score``: every score a query may attend to (``j <= t`` in a decoder; all pairs in an
  encoder), of every head and text (`repgeom.metrics.attention_scores`), special tokens included:
  the model's softmax attends to them, and a BOS or CLS "sink" is often where a row's maximum is;
* ``row_max``, ``row_min``: each query row's largest and smallest attendable score (rows with a
  single attendable key, a decoder's first position, are left out: there max = min);
* ``sequence_max``, ``sequence_min``: per text and head, the extreme over the whole sequence
  (Fig. 10; their ``mean`` column is Fig. 10's average over the batch).

Command line (``key=value`` or ``--key value``)::

    repgeom-scores hf=<name or folder> csv=<file with a text column> out=<dir>
    repgeom-scores ckpt=<file.ckpt> "text=some text" out=<dir>

Writes to ``out``: ``scores.csv`` (model, layer, layer_name, statistic, n, mean, std, min,
q01, q05, q25, q50, q75, q95, q99, max; q05 is the 5% quantile), ``scores.png`` (one histogram
panel per block: the scores, the row maxima and the row minima, log density as in Fig. 7) and
``extremes.png`` (per block: the mean sequence maximum and minimum, Fig. 10, beside the median
row maximum and minimum).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from matplotlib.figure import Figure

from repgeom.metrics import attention_scores
from repgeom.metrics._validation import check_int
from repgeom.probes.report.plots import DPI

from .subjects import Subject

__all__ = ["LayerScores", "text_scores", "collect", "summary_table", "plot_histograms",
           "plot_extremes", "write", "read_texts", "QUANTILES", "STATISTICS"]

QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
"""Quantiles of every statistic in ``scores.csv`` (columns q01 ... q99)."""
STATISTICS = ("score", "row_max", "row_min", "sequence_max", "sequence_min")
MAX_SCORES = 1_000_000
"""Scores kept per layer for the ``score`` quantiles and histogram (a uniform random subset
beyond that; the extremes are always exact): 12 heads x 16 texts x 512 tokens are 25M pairs."""


@dataclass(frozen=True)
class LayerScores:
    """One block's samples of each statistic of `STATISTICS`, float64 arrays.

    ``score`` holds every attendable score, or a uniform random subset of ``MAX_SCORES``
    (``n_scores`` says how many there were); the others are exact.
    """

    layer: int
    layer_name: str
    score: np.ndarray
    row_max: np.ndarray
    row_min: np.ndarray
    sequence_max: np.ndarray
    sequence_min: np.ndarray
    n_scores: int


def text_scores(subject: Subject, text: str) -> list[torch.Tensor]:
    """Per block, the (H, T, T) float64 scores ``q.k / sqrt(D)`` of `text`, ``-inf`` where a
    query may not attend (so ``softmax(-1)`` is the model's attention)."""
    inputs = subject.queries_keys(text)
    return [attention_scores(q[None], k[None], causal=inputs.causal)[0]
            for q, k in zip(inputs.queries, inputs.keys, strict=True)]


def collect(subject: Subject, texts: Iterable[str], *, max_scores: int = MAX_SCORES,
            seed: int = 0) -> list[LayerScores]:
    """The statistics of every block over `texts` (each text one sequence, as in the paper's
    batch of sequences), pooled over heads and texts.

    Raises
    ------
    ValueError
        If there is no text, or no text has a query row with two attendable keys.
    """
    max_scores = check_int(max_scores, "max_scores")
    texts = list(texts)
    if not texts:
        raise ValueError("no text given: pass text=... or csv=<file with a text column>")
    generator = torch.Generator().manual_seed(seed)
    parts: dict[str, list[list[torch.Tensor]]] = {s: [] for s in STATISTICS}
    n_scores: list[int] = []
    sample_keys: list[torch.Tensor] = []  # per layer: the random key of each kept score
    for text in texts:
        for layer, S in enumerate(text_scores(subject, text)):
            if layer == len(n_scores):
                n_scores.append(0)
                for s in STATISTICS:
                    parts[s].append([])
                parts["score"][layer].append(torch.empty(0, dtype=torch.float64))
                sample_keys.append(torch.empty(0))
            attendable = torch.isfinite(S)  # (H, T, T)
            values = S[attendable]
            n_scores[layer] += values.numel()
            # bottom-k of uniform keys: a uniform sample of max_scores over all texts so far
            keys = torch.cat([sample_keys[layer], torch.rand(values.numel(), generator=generator)])
            values = torch.cat([parts["score"][layer][0], values])
            if values.numel() > max_scores:
                keep = torch.topk(keys, max_scores, largest=False).indices
                keys, values = keys[keep], values[keep]
            sample_keys[layer], parts["score"][layer][0] = keys, values
            rows = attendable.sum(dim=-1) > 1  # (H, T)
            parts["row_max"][layer].append(S.amax(dim=-1)[rows])
            parts["row_min"][layer].append(S.masked_fill(~attendable, torch.inf).amin(-1)[rows])
            parts["sequence_max"][layer].append(S.amax(dim=(-2, -1)))
            parts["sequence_min"][layer].append(
                S.masked_fill(~attendable, torch.inf).amin(dim=(-2, -1)))
    if not parts["row_max"] or sum(x.numel() for x in parts["row_max"][0]) == 0:
        raise ValueError("no query row attends to two positions or more: give longer texts "
                         "(at least two tokens)")
    names = [n for n in subject.layer_names if n.startswith("block_")]
    return [
        LayerScores(layer + 1, names[layer] if layer < len(names) else f"block_{layer + 1}",
                    *(torch.cat(parts[s][layer]).numpy() for s in STATISTICS),
                    n_scores=n_scores[layer])
        for layer in range(len(n_scores))
    ]


def _quantile_column(q: float) -> str:
    return f"q{round(q * 100):02d}"


def summary_table(layers: Sequence[LayerScores], model: str = "") -> pd.DataFrame:
    """One row per block and statistic: n, mean, std, min, the `QUANTILES`, max."""
    rows = []
    for layer in layers:
        for statistic in STATISTICS:
            x = getattr(layer, statistic)
            quantiles = np.quantile(x, QUANTILES)
            rows.append({
                "model": model, "layer": layer.layer, "layer_name": layer.layer_name,
                "statistic": statistic,
                "n": layer.n_scores if statistic == "score" else x.size,
                "mean": x.mean(), "std": x.std(), "min": x.min(),
                **{_quantile_column(q): v for q, v in zip(QUANTILES, quantiles, strict=True)},
                "max": x.max(),
            })
    return pd.DataFrame(rows)


def _grid(n: int) -> tuple[Figure, np.ndarray]:
    ncol = min(4, n)
    nrow = -(-n // ncol)
    fig = Figure(figsize=(3.2 * ncol + 0.5, 2.6 * nrow), constrained_layout=True)
    axes = np.atleast_1d(fig.subplots(nrow, ncol, squeeze=False)).ravel()
    for ax in axes[n:]:
        ax.axis("off")
    return fig, axes


def plot_histograms(layers: Sequence[LayerScores], title: str = "") -> Figure:
    """One panel per block: density histograms (log scale) of the scores (filled) and of the
    row maxima and minima (lines), on common bins, as Godey et al. Fig. 7 per bias norm."""
    fig, axes = _grid(len(layers))
    for ax, layer in zip(axes, layers, strict=False):
        low = min(layer.score.min(), layer.row_min.min())
        high = max(layer.score.max(), layer.row_max.max())
        bins = np.linspace(low, high, 61) if high > low else 10
        ax.hist(layer.score, bins=bins, density=True, color="0.7", label="all scores")
        ax.hist(layer.row_max, bins=bins, density=True, histtype="step", color="C3",
                label="row max")
        ax.hist(layer.row_min, bins=bins, density=True, histtype="step", color="C0",
                label="row min")
        ax.set_yscale("log")
        ax.set_title(layer.layer_name, fontsize=9)
        ax.set_xlabel(r"$q \cdot k / \sqrt{d}$", fontsize=8)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{title} pre-softmax attention scores".strip(), fontsize=10)
    return fig


def plot_extremes(layers: Sequence[LayerScores], title: str = "") -> Figure:
    """Per block: the sequence maximum and minimum averaged over texts and heads, with their
    std as error bars (Godey et al. Fig. 10), and the median row maximum and minimum."""
    fig = Figure(figsize=(5.5, 3.5), constrained_layout=True)
    ax = fig.subplots()
    x = [layer.layer for layer in layers]
    for name, colour in (("max", "C3"), ("min", "C0")):
        seq = [getattr(layer, f"sequence_{name}") for layer in layers]
        ax.errorbar(x, [s.mean() for s in seq], yerr=[s.std() for s in seq], color=colour,
                    marker="o", capsize=3, label=f"sequence {name} (mean over texts, heads)")
        rows = [np.median(getattr(layer, f"row_{name}")) for layer in layers]
        ax.plot(x, rows, color=colour, ls="--", marker=".", label=f"row {name} (median)")
    ax.axhline(0.0, color="0.5", lw=0.8)
    ax.set_xticks(x, [layer.layer_name for layer in layers], rotation=45, fontsize=7)
    ax.set_ylabel(r"score $q \cdot k / \sqrt{d}$")
    ax.legend(fontsize=7)
    ax.set_title(f"{title} extreme attention scores".strip(), fontsize=10)
    return fig


def write(subject: Subject, texts: Sequence[str], out: str | Path, *,
          max_scores: int = MAX_SCORES, seed: int = 0) -> pd.DataFrame:
    """Collect the scores of `texts`, write ``scores.csv``, ``scores.png`` and ``extremes.png``
    to `out`, and return the table."""
    if not texts:
        raise ValueError("texts is empty: give text=... and/or csv=<file with a text column>")
    layers = collect(subject, texts, max_scores=max_scores, seed=seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table = summary_table(layers, subject.name)
    table.to_csv(out / "scores.csv", index=False)
    title = Path(subject.name).name
    for name, fig in (("scores", plot_histograms(layers, title)),
                      ("extremes", plot_extremes(layers, title))):
        fig.savefig(out / f"{name}.png", dpi=DPI, facecolor="white")
    return table


def read_texts(csv: str | Path) -> list[str]:
    """The ``text`` column of the CSV file `csv`."""
    data = pd.read_csv(csv)
    if "text" not in data.columns:
        raise ValueError(f"{csv} has no 'text' column (columns: {list(data.columns)}); "
                         "name the column of texts 'text'")
    return data["text"].astype(str).tolist()
