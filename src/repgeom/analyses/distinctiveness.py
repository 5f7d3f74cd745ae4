"""Subject/attribute distinctiveness across layers ("Beyond Gaussian", papers/004).

Each sentence of a labelled CSV is represented at each layer by its mean-pooled state (or its
last token's), and `repgeom.metrics.distinctiveness.distinctiveness` scores every
(subject, attribute) cell: positive when sentences sharing the subject are closer than
sentences sharing the attribute. As in the post, the score is computed on the raw states and
after PCA to 90% of the variance (per layer, over all sentences).

Command line (``key=value`` or ``--key value``)::

    repgeom-distinctiveness hf=<name or folder> csv=<file> out=<dir> \\
        [subject=subject] [attribute=attribute] [pooling=mean|last] [pca=0.9] [tokenizer=...]
    repgeom-distinctiveness ckpt=<run>/checkpoints/last.ckpt csv=... out=...

Writes to ``out``: ``distinctiveness.csv`` (layer, layer_name, space, subject, attribute,
score, n_components), ``by_subject.csv`` and ``by_attribute.csv`` (means per layer),
``heatmaps_<space>.png`` (one panel per layer) and ``means.png``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from repgeom.metrics.distinctiveness import distinctiveness, pca_project

from .subjects import Subject, pool

__all__ = ["pooled_states", "distinctiveness_by_layer", "layer_means", "plot_heatmaps",
           "plot_means", "run"]


def pooled_states(subject: Subject, texts: Sequence[str], pooling: str = "mean") -> np.ndarray:
    """(L, N, C) float32: per layer, one pooled vector per text."""
    per_text = [[pool(h, pooling) for h in subject.states(t)] for t in texts]
    return torch.stack([torch.stack(layer) for layer in zip(*per_text, strict=True)]).numpy()


def distinctiveness_by_layer(pooled: np.ndarray, subjects: Sequence, attributes: Sequence,
                             layer_names: Sequence[str], *, pca_variance: float | None = 0.9
                             ) -> pd.DataFrame:
    """Tidy scores: one row per (layer, space, subject, attribute).

    ``space`` is ``raw`` or ``pca<percent>`` (states centred and projected on the fewest
    principal components holding ``pca_variance`` of the variance of that layer's sentences).
    """
    rows = []
    for i, (name, X) in enumerate(zip(layer_names, pooled, strict=True)):
        spaces = [("raw", torch.as_tensor(X), X.shape[1])]
        if pca_variance is not None:
            Z = pca_project(X, variance=pca_variance)
            spaces.append((f"pca{round(100 * pca_variance)}", Z, Z.shape[1]))
        for space, Y, k in spaces:
            score = distinctiveness(Y, subjects, attributes)
            long = score.stack().rename("score").reset_index()
            long.insert(0, "layer", i)
            long.insert(1, "layer_name", name)
            long.insert(2, "space", space)
            long["n_components"] = k
            rows.append(long)
    return pd.concat(rows, ignore_index=True)


def layer_means(scores: pd.DataFrame, by: str) -> pd.DataFrame:
    """Mean score per (space, layer) and ``by`` (``subject`` or ``attribute``), wide by layer."""
    return (scores.groupby(["space", by, "layer"], sort=False)["score"].mean()
            .unstack("layer"))


def plot_heatmaps(scores: pd.DataFrame, space: str = "raw", title: str = ""):
    """One subjects x attributes heatmap per layer, a common symmetric colour scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = scores[scores["space"] == space]
    layers = list(dict.fromkeys(zip(s["layer"], s["layer_name"], strict=True)))
    ncol = min(4, len(layers))
    nrow = -(-len(layers) // ncol)
    vmax = float(np.abs(s["score"]).max()) or 1.0
    subj = list(dict.fromkeys(s["subject"]))
    attr = list(dict.fromkeys(s["attribute"]))
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.2 * ncol + 1, 2.8 * nrow + 0.6),
                             squeeze=False, constrained_layout=True)
    for ax, (layer, name) in zip(axes.flat, layers, strict=False):
        m = (s[s["layer"] == layer].pivot(index="subject", columns="attribute", values="score")
             .loc[subj, attr])
        im = ax.imshow(m.to_numpy(), cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="auto")
        ax.set_title(name, fontsize=9)
        ax.set_yticks(range(len(subj)), subj, fontsize=7)
        ax.set_xticks(range(len(attr)), attr, fontsize=7, rotation=45, ha="right")
    for ax in list(axes.flat)[len(layers):]:
        ax.axis("off")
    fig.colorbar(im, ax=axes, shrink=0.8, label="score (> 0: subject attracts)")
    fig.suptitle(f"{title} subject/attribute distinctiveness ({space})".strip(), fontsize=10)
    return fig


def plot_means(scores: pd.DataFrame, title: str = ""):
    """Per-subject and per-attribute mean score across layers, one row per space."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spaces = list(dict.fromkeys(scores["space"]))
    fig, axes = plt.subplots(len(spaces), 2, figsize=(10, 3.2 * len(spaces)), squeeze=False,
                             constrained_layout=True)
    names = list(dict.fromkeys(zip(scores["layer"], scores["layer_name"], strict=True)))
    for row, space in zip(axes, spaces, strict=True):
        for ax, by in zip(row, ("subject", "attribute"), strict=True):
            m = layer_means(scores, by).loc[space]
            for label, values in m.iterrows():
                ax.plot(values.index, values.to_numpy(), marker="o", ms=3, label=str(label))
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_xticks([n[0] for n in names], [n[1] for n in names], rotation=45,
                          fontsize=7, ha="right")
            ax.set_title(f"mean per {by} ({space})", fontsize=9)
            ax.legend(fontsize=6)
    fig.suptitle(f"{title} distinctiveness across layers".strip(), fontsize=10)
    return fig


def run(subject: Subject, data: pd.DataFrame, out: str | Path | None = None, *,
        subject_col: str = "subject", attribute_col: str = "attribute", text_col: str = "text",
        pooling: str = "mean", pca_variance: float | None = 0.9) -> pd.DataFrame:
    """Scores of every layer for a labelled data frame; with ``out``, the files listed above."""
    for col in (text_col, subject_col, attribute_col):
        if col not in data.columns:
            raise ValueError(f"the data has no column {col!r} (columns: {list(data.columns)})")
    pooled = pooled_states(subject, data[text_col].astype(str).tolist(), pooling)
    scores = distinctiveness_by_layer(pooled, data[subject_col].tolist(),
                                      data[attribute_col].tolist(), subject.layer_names,
                                      pca_variance=pca_variance)
    scores.insert(0, "model", subject.name)
    scores["pooling"] = pooling
    if out is not None:
        import matplotlib.pyplot as plt

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        scores.to_csv(out / "distinctiveness.csv", index=False)
        for by in ("subject", "attribute"):
            layer_means(scores, by).to_csv(out / f"by_{by}.csv")
        title = Path(subject.name).name
        for space in dict.fromkeys(scores["space"]):
            fig = plot_heatmaps(scores, space, title)
            fig.savefig(out / f"heatmaps_{space}.png", dpi=80)
            plt.close(fig)
        fig = plot_means(scores, title)
        fig.savefig(out / "means.png", dpi=80)
        plt.close(fig)
    return scores
