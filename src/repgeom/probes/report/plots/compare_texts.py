"""`compare_texts`: the per-layer pooled cosine of two texts and their token x token cosines.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from repgeom.probes.core.table import (
    block_name,
)
from repgeom.probes.report.plots.style import (
    layer_axis,
    new_figure,
)


def compare_texts(
    pooled: Sequence[float],
    token_matrix: np.ndarray,
    tokens: Sequence[str] | None = None,
    *,
    labels: tuple[str, str] = ("text A", "text B"),
) -> Figure:
    """Per-layer pooled cosine of two texts (left) and their token x token cosines (right).

    Parameters
    ----------
    pooled : sequence of float, length L+1
        Cosine of the two texts' mean-pooled states at each layer, from layer 0.
    token_matrix : ndarray, shape (n, m)
        Cosine between token i of text A and token j of text B at the last layer.
    tokens : sequence of str, optional
        Tick labels: ``n + m`` strings (text A's then text B's), or ``n`` when ``n == m`` for
        both axes. Drawn when there are at most 48 per axis.
    labels : (str, str)
        Names of the two texts for the axes.
    """
    pooled = np.asarray(pooled, dtype=float)
    matrix = np.asarray(token_matrix, dtype=float)
    if pooled.ndim != 1 or pooled.size == 0:
        raise ValueError(f"pooled: expected a non-empty 1-D sequence, got shape {pooled.shape}")
    if matrix.ndim != 2:
        raise ValueError(f"token_matrix: expected a 2-D array, got shape {matrix.shape}")
    n, m = matrix.shape
    rows_tok = cols_tok = None
    if tokens is not None:
        tokens = [str(t) for t in tokens]
        if len(tokens) == n + m:
            rows_tok, cols_tok = tokens[:n], tokens[n:]
        elif n == m and len(tokens) == n:
            rows_tok = cols_tok = tokens
        else:
            raise ValueError(
                f"tokens: expected {n + m} (text A's then text B's)"
                f"{f' or {n}' if n == m else ''} strings for a {n}x{m} matrix, got {len(tokens)}"
            )
    fig = new_figure(12.0, 5.0)
    left, right = fig.subplots(1, 2, width_ratios=[1, 1.25])
    left.plot(np.arange(pooled.size), pooled, "-o", color="tab:blue", ms=4, lw=2)
    left.axhline(0.0, color="grey", lw=0.8)
    layer_axis(left, pd.DataFrame({"layer": range(pooled.size),
                                    "layer_name": [block_name(i) for i in range(pooled.size)]}))
    left.set_ylabel("cosine of mean-pooled states")
    left.set_title(f"{labels[0]} vs {labels[1]}, per layer")
    image = right.imshow(matrix, cmap="RdBu_r", vmin=-1.0, vmax=1.0, aspect="auto",
                         interpolation="nearest")
    for ax_set, names, count in ((right.set_yticks, rows_tok, n), (right.set_xticks, cols_tok, m)):
        if names is not None and count <= 48:
            # Whitespace stays visible: a space as "␣", a newline as "\\n".
            shown = [repr(t)[1:-1].replace(" ", "␣") for t in names]
            size = "medium" if count <= 24 else "x-small"
            if ax_set == right.set_xticks:
                ax_set(range(count), labels=shown, rotation=90 if count > 24 else 0, fontsize=size)
            else:
                ax_set(range(count), labels=shown, fontsize=size)
    right.set_ylabel(f"{labels[0]} token")
    right.set_xlabel(f"{labels[1]} token")
    right.set_title("token \u00d7 token cosine, last layer")
    fig.colorbar(image, ax=right, pad=0.02).set_label("cosine")
    return fig
