"""Self-similarity of a text's tokens and pooled similarity of text pairs, per layer.

"GPT-2's Anisotropic Antics" (papers/000, after Ethayarajh 2019) shows two things: the
mean-pooled states of two unrelated texts have a cosine above 0.96 at every GPT-2 layer
("Compare the cosine similarity of the pooled tensors per layer"), and at the final layer the
tokens of one sentence all point the same way ("smallest similarity is 0.92"). Both per layer:

* `token_self_similarity`: the (T, T) cosine matrix of a text's token states and its mean
  off-diagonal entry (`repgeom.metrics.similarity.token_cosine_matrix`);
* `pair_similarity`: the cosine of the two texts' mean-pooled states
  (`repgeom.metrics.similarity.layer_pooled_similarity`), each text passed through the model alone.

Command line (``key=value`` or ``--key value``)::

    repgeom-similarity hf=<name or folder> text="Cooking mushrooms..." \\
        [pairs=<csv with text_a,text_b>] out=<dir>
    repgeom-similarity ckpt=<file.ckpt> text=... out=<dir>

Writes ``self_similarity.csv`` (layer, layer_name, n_tokens, mean_offdiag, min_offdiag),
``self_similarity.png`` (the matrices), and with ``pairs=``, ``pair_similarity.csv``
(pair, text_a, text_b, layer, layer_name, cosine).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from repgeom.metrics.similarity import layer_pooled_similarity, token_cosine_matrix

from .subjects import Subject

__all__ = ["LayerSelfSimilarity", "token_self_similarity", "pair_similarity", "write"]


@dataclass(frozen=True)
class LayerSelfSimilarity:
    """layer, layer_name; matrix: (T, T) float64 cosines; mean_offdiag and min_offdiag: over
    the T (T - 1) entries off the diagonal (NaN for a one-token text)."""

    layer: int
    layer_name: str
    matrix: np.ndarray
    mean_offdiag: float
    min_offdiag: float


def offdiag_stats(M: np.ndarray) -> tuple[float, float]:
    """Mean and minimum of the off-diagonal entries of a square matrix (NaN when 1 x 1)."""
    T = M.shape[0]
    if T < 2:
        return float("nan"), float("nan")
    off = M[~np.eye(T, dtype=bool)]
    return float(off.mean()), float(off.min())


def token_self_similarity(subject: Subject, text: str) -> list[LayerSelfSimilarity]:
    """Per layer, the token x token cosine matrix of ``text`` (special tokens excluded)."""
    out = []
    for i, (name, h) in enumerate(zip(subject.layer_names, subject.states(text), strict=True)):
        if h.shape[0] < 2:
            M = np.ones((h.shape[0], h.shape[0]))
        else:
            M = token_cosine_matrix(h).double().numpy()
        mean, low = offdiag_stats(M)
        out.append(LayerSelfSimilarity(i, name, M, mean, low))
    return out


def pair_similarity(subject: Subject, pairs: Iterable[tuple[str, str]]) -> pd.DataFrame:
    """Cosine of the mean-pooled states of each pair of texts, per layer (tidy)."""
    rows = []
    for k, (a, b) in enumerate(pairs):
        cosines = layer_pooled_similarity(subject.states(a), subject.states(b))
        for i, (name, cosine) in enumerate(zip(subject.layer_names, cosines, strict=True)):
            rows.append({"pair": k, "text_a": a, "text_b": b, "layer": i, "layer_name": name,
                         "cosine": cosine})
    return pd.DataFrame(rows)


def plot_self_similarity(layers: Sequence[LayerSelfSimilarity], tokens: Sequence[str],
                         title: str = ""):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncol = min(4, len(layers))
    nrow = -(-len(layers) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3 * ncol + 1, 3 * nrow), squeeze=False,
                             constrained_layout=True)
    for ax, layer in zip(axes.flat, layers, strict=False):
        im = ax.imshow(layer.matrix, vmin=-1, vmax=1, cmap="RdBu_r")
        ax.set_title(f"{layer.layer_name}: mean {layer.mean_offdiag:.2f}", fontsize=8)
        if len(tokens) <= 24:
            ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=6)
            ax.set_yticks(range(len(tokens)), tokens, fontsize=6)
    for ax in list(axes.flat)[len(layers):]:
        ax.axis("off")
    fig.colorbar(im, ax=axes, shrink=0.8, label="cosine")
    fig.suptitle(f"{title} token x token cosine".strip(), fontsize=10)
    return fig


def write(subject: Subject, out: str | Path, *, text: str | None = None,
          pairs: str | Path | None = None) -> dict[str, pd.DataFrame]:
    """The token x token cosine of `text` and/or the pooled similarity of the pairs in the CSV
    `pairs` (columns ``text_a``, ``text_b``), written to `out`; returns the tables by name."""
    if text is None and pairs is None:
        raise ValueError("give text=... and/or pairs=<csv>")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tables = {}
    if text is not None:
        layers = token_self_similarity(subject, text)
        t = pd.DataFrame([{"layer": x.layer, "layer_name": x.layer_name,
                           "n_tokens": x.matrix.shape[0], "mean_offdiag": x.mean_offdiag,
                           "min_offdiag": x.min_offdiag} for x in layers])
        t.insert(0, "model", subject.name)
        t.to_csv(out / "self_similarity.csv", index=False)
        import matplotlib.pyplot as plt

        fig = plot_self_similarity(layers, subject.tokens(text), Path(subject.name).name)
        fig.savefig(out / "self_similarity.png", dpi=80)
        plt.close(fig)
        tables["self_similarity"] = t
    if pairs is not None:
        df = pd.read_csv(pairs)
        missing = {"text_a", "text_b"} - set(df.columns)
        if missing:
            raise ValueError(f"{pairs} lacks column(s) {sorted(missing)}")
        t = pair_similarity(subject, zip(df["text_a"].astype(str), df["text_b"].astype(str),
                                         strict=True))
        t.insert(0, "model", subject.name)
        t.to_csv(out / "pair_similarity.csv", index=False)
        tables["pair_similarity"] = t
    return tables
