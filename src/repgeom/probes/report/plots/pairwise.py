"""Figures of pairwise metrics (linear CKA, mutual k-NN): layer x layer, and each layer
against itself at the final step.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from repgeom.probes.core.table import (
    block_name,
)
from repgeom.probes.report.plots.style import (
    fmt_step,
    metric_label,
    single_axes,
    step_ticks,
)


def layer_similarity(frame: pd.DataFrame, metric: str, *, step: int | None = None) -> Figure:
    """Layer x layer map of a pairwise metric (``layer_b`` rows) at `step` (default: the last).

    Rows hold a <= b; the map is filled symmetrically.
    """
    rows = frame.loc[(frame["metric"] == metric) & (frame["layer_b"] >= 0)]
    if "step_b" in rows.columns:
        rows = rows.loc[rows["step_b"] < 0]
    if rows.empty:
        raise ValueError(f"no layer x layer rows of {metric!r}")
    step = int(rows["step"].max()) if step is None else step
    rows = rows.loc[rows["step"] == step]
    n = int(max(rows["layer"].max(), rows["layer_b"].max())) + 1
    grid = np.full((n, n), np.nan)
    for row in rows.itertuples(index=False):
        grid[row.layer, row.layer_b] = grid[row.layer_b, row.layer] = row.value
    names = _layer_names(rows, n)
    fig, ax, cax = single_axes(0.5 * n + 3.2, 0.5 * n + 2.4, left=1.1, bottom=1.1,
                                colorbar=True)
    image = ax.imshow(grid, cmap="viridis", vmin=0.0, vmax=1.0, origin="lower")
    ax.set_xticks(range(n), names, rotation=90)
    ax.set_yticks(range(n), names)
    ax.set_title(f"{metric_label(metric)}, layer \u00d7 layer at step {fmt_step(step)}")
    fig.colorbar(image, cax=cax).set_label(metric_label(metric))
    return fig


def similarity_to_final(frame: pd.DataFrame, metric: str) -> Figure:
    """Layer x step map of each layer's similarity to itself at the final step (``step_b``)."""
    rows = frame.loc[(frame["metric"] == metric) & (frame["step_b"] >= 0)]
    if rows.empty:
        raise ValueError(f"no step-vs-final rows of {metric!r}")
    wide = rows.pivot_table(index="layer", columns="step", values="value")
    steps = list(wide.columns)
    fig, ax, cax = single_axes(max(6.0, 0.3 * len(steps) + 3), 0.4 * len(wide) + 2.5,
                                left=1.1, colorbar=True)
    image = ax.imshow(wide.to_numpy(), aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0,
                      origin="lower")
    ticks, labels = step_ticks(steps)
    ax.set_xticks(ticks, labels)
    ax.set_yticks(range(len(wide)), _layer_names(rows, int(wide.index.max()) + 1)[: len(wide)])
    ax.set_xlabel("step")
    final = int(rows["step_b"].max())
    ax.set_title(f"{metric_label(metric)} of each layer with itself at step {fmt_step(final)}")
    fig.colorbar(image, cax=cax).set_label(metric_label(metric))
    return fig


def _layer_names(rows: pd.DataFrame, n: int) -> list[str]:
    names = [block_name(i) for i in range(n)]
    for row in rows[["layer", "layer_name"]].drop_duplicates().itertuples(index=False):
        if row.layer < n:
            names[row.layer] = row.layer_name
    return names


def pair_jobs(rows: pd.DataFrame, metric: str) -> list[tuple[str, Callable[[], Figure]]]:
    jobs = []
    same_step = rows["step_b"] < 0 if "step_b" in rows.columns else rows["layer_b"] >= 0
    if "layer_b" in rows.columns and (same_step & (rows["layer_b"] >= 0)).any():
        jobs.append((f"similarity_{metric}", partial(layer_similarity, rows, metric)))
    if "step_b" in rows.columns and (rows["step_b"] >= 0).any():
        jobs.append((f"vs_final_{metric}", partial(similarity_to_final, rows, metric)))
    return jobs
