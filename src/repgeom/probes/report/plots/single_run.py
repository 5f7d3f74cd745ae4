"""Figures of one run's probe table: layer profiles, metric against step, heatmaps, per-layer
and per-head lines.
"""

from __future__ import annotations

import math
from typing import Literal

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from repgeom.probes.core.table import NOISE_COLUMNS
from repgeom.probes.report.aggregate import head_means, layer_means
from repgeom.probes.report.plots.phase_markers import mark_turns
from repgeom.probes.report.plots.style import (
    auto_xscale,
    group_colours,
    layer_axis,
    layer_labels,
    metric_label,
    new_figure,
    one_run,
    plot_profile,
    select_metric,
    single_axes,
    step_colorbar,
    step_colours,
    step_ticks,
)


def layer_profile(frame: pd.DataFrame, metric: str, *, by: str = "step") -> Figure:
    """Value against layer, one line per probe step (or per value of `by`).

    Parameters
    ----------
    frame : DataFrame
        Tidy probe table.
    metric : str
        The metric to draw; per-head metrics are averaged over heads.
    by : str
        ``"step"``: one line per step, coloured by probe order on viridis, with a colour bar.
        Any other column (``revision``, ``model``, ``run``): one line per value, with a legend;
        where a value has several steps, its last one is drawn.

    Returns
    -------
    Figure
        One axes (plus the colour bar's), one line per step or group, in step order.
    """
    rows = select_metric(frame, metric)
    if by != "step" and by not in rows.columns:
        raise ValueError(f"by: column {by!r} is not in the table; columns: {list(frame.columns)}")
    fig, ax, cax = single_axes(7.5, 4.5, colorbar=by == "step")
    if by == "step":
        per_layer = one_run(rows, metric)
        steps = sorted(per_layer["step"].unique())
        colours, _ = step_colours(steps)
        for colour, (step, group) in zip(colours, per_layer.groupby("step", sort=True),
                                         strict=True):
            plot_profile(ax, group, colour, f"step {step}")
        step_colorbar(fig, cax, steps)
        title = f"{metric_label(metric)} by layer, one line per probe"
    else:
        per_layer = head_means(rows)
        order = per_layer.groupby(by, sort=False)["step"].min().sort_values(kind="stable")
        colours = group_colours(len(order))
        for colour, name in zip(colours, order.index, strict=True):
            group = per_layer.loc[per_layer[by] == name]
            group = group.loc[group["step"] == group["step"].max()]
            plot_profile(ax, group, colour, str(name))
        ax.legend(title=by, fontsize="small", loc="best")
        title = f"{metric_label(metric)} by layer, one line per {by}"
    layer_axis(ax, per_layer)
    ax.set_ylabel(metric_label(metric))
    ax.set_title(title)
    return fig


def metric_vs_step(
    frame: pd.DataFrame,
    metric: str,
    *,
    by: str | None = None,
    include_embedding: bool = False,
    xscale: Literal["auto", "linear", "symlog"] = "auto",
) -> Figure:
    """The mean over layers against step, with the step of its maximum marked.

    Parameters
    ----------
    by : str, optional
        A column (``run``, ``masking``, ``model``): one line per value, each with its maximum
        marked.
    include_embedding : bool
        Average over layer 0 as well (off: blocks 1..L, as in `aggregate.summary`).
    xscale : {"auto", "linear", "symlog"}
        ``"auto"`` takes symlog when the steps span more than two decades.

    Returns
    -------
    Figure
        One axes; per group one data line and one marker line with ``gid == "max"`` at
        (step of the maximum, maximum).
    """
    rows = select_metric(frame, metric)
    if by is not None and by not in rows.columns:
        raise ValueError(f"by: column {by!r} is not in the table; columns: {list(frame.columns)}")
    means = layer_means(rows, include_embedding=include_embedding).dropna(subset=["value"])
    if means.empty:
        raise ValueError(f"metric {metric!r}: no values in layers 1..L (include_embedding=True?)")
    if by is None:
        groups = [(None, means)]
    else:  # in the order the groups first appear in the table
        groups = [(name, means.loc[means[by] == name]) for name in pd.unique(rows[by].dropna())]
    if by is None and means.duplicated("step").any():
        extra = [c for c in means.columns
                 if c not in ("step", "metric", "value", "std", *NOISE_COLUMNS)][1:]
        raise ValueError(f"metric {metric!r}: several runs share a step; pass by= one of {extra}")
    fig, ax, _ = single_axes(7.5, 4.5)
    colours = mpl.colormaps["tab10"](np.arange(len(groups)) % 10)
    for colour, (name, group) in zip(colours, groups, strict=True):
        group = group.sort_values("step")
        label = metric_label(metric) if name is None else str(name)
        ax.plot(group["step"], group["value"], "-o", color=colour, ms=3, lw=1.8, label=label)
        if group["std"].notna().any() and len(groups) == 1:
            ax.fill_between(group["step"], group["value"] - group["std"],
                            group["value"] + group["std"], color=colour, alpha=0.15, lw=0,
                            label="spread across layers (±1 std)")
        if not include_embedding:  # the turns of the expansion and compression (`phases`)
            mark_turns(ax, rows if name is None else rows.loc[rows[by] == name], metric, colour)
        top = group.loc[group["value"].idxmax()]
        ax.plot([top["step"]], [top["value"]], marker="*", ms=14, color=colour, mec="black",
                mew=0.8, ls="none", gid="max", zorder=5)
        # Text below-left of a peak in the right half or near the top, so it stays inside.
        steps_all = means["step"].to_numpy(dtype=float)
        right = top["step"] > (steps_all.min() + steps_all.max()) / 2
        ax.annotate(
            f"max {top['value']:.3g}\nat step {int(top['step'])}",
            xy=(top["step"], top["value"]), xytext=(-8 if right else 8, -10),
            textcoords="offset points", ha="right" if right else "left", va="top",
            fontsize="small", color="black", annotation_clip=True,
            bbox=dict(boxstyle="round,pad=0.2", fc="white", ec=colour, alpha=0.85),
        )
    auto_xscale(ax, means["step"].to_numpy(dtype=float), xscale)
    ax.set_xlabel("training step")
    ax.set_ylabel(f"{metric_label(metric)}, mean over layers")
    layers = "layers 0..L" if include_embedding else "blocks 1..L"
    ax.set_title(f"{metric_label(metric)} during training (mean over {layers})")
    ax.grid(alpha=0.3)
    if by is not None or ax.get_legend_handles_labels()[0][1:]:
        ax.legend(title=by, fontsize="small", loc="best")
    return fig


def _diverging(values: np.ndarray) -> tuple[str, Normalize | None]:
    """A diverging map symmetric about 0 when values change sign (white = 0), else viridis."""
    finite = values[np.isfinite(values)]
    if finite.size and finite.min() < 0 < finite.max():
        bound = float(np.abs(finite).max())
        return "RdBu_r", Normalize(vmin=-bound, vmax=bound)
    return "viridis", None


def heatmap(frame: pd.DataFrame, metric: str) -> Figure:
    """A layer x step heatmap of `metric` (head-averaged), with a colour bar.

    Steps are columns in probe order (one column per probe, labelled by step), layers are rows
    from the bottom. A diverging map symmetric about 0 is used when the values change sign. The
    image array has shape ``(n_layers, n_steps)``; missing cells are blank.
    """
    rows = one_run(select_metric(frame, metric), metric)
    grid = rows.pivot(index="layer", columns="step", values="value").sort_index().sort_index(axis=1)
    values = grid.to_numpy(dtype=float)
    steps, layers = list(grid.columns), list(grid.index)
    fig, ax, cax = single_axes(
        min(max(3.5 + 0.3 * len(steps), 6.0), 12.0), min(max(1.6 + 0.25 * len(layers), 3.5), 8.0),
        bottom=0.85, left=1.35, colorbar=True,  # room for the "final norm" tick
    )
    cmap, norm = _diverging(values)
    image = ax.imshow(np.ma.masked_invalid(values), origin="lower", aspect="auto",
                      cmap=cmap, norm=norm, interpolation="nearest")
    idx, labels = step_ticks(steps, max_ticks=24)
    ax.set_xticks(idx, labels=labels, rotation=45 if len(idx) > 6 else 0,
                  ha="right" if len(idx) > 6 else "center", rotation_mode="anchor")
    names = layer_labels(rows)
    every = max(1, math.ceil(len(layers) / 16))
    ax.set_yticks(range(0, len(layers), every), labels=[names[v] for v in layers[::every]])
    ax.set_xlabel("training step (one column per probe)")
    ax.set_ylabel("layer (0 = embedding)" if 0 in layers else "layer")
    ax.set_title(f"{metric_label(metric)}, layer \u00d7 step")
    fig.colorbar(image, cax=cax).set_label(metric_label(metric))
    return fig


def per_layer_vs_step(
    frame: pd.DataFrame,
    metric: str,
    *,
    xscale: Literal["auto", "linear", "symlog"] = "auto",
) -> Figure:
    """One line per layer against step (head-averaged when per head); a legend names the layers.

    Lines are coloured from dark (first layer) to bright (last) on plasma.
    """
    rows = one_run(select_metric(frame, metric), metric)
    layers = sorted(rows["layer"].unique())
    fig, ax, _ = single_axes(8.5, 4.5, right=1.45 if len(layers) <= 16 else 2.6)
    colours = mpl.colormaps["plasma"](np.linspace(0.0, 0.9, max(len(layers), 2)))
    for colour, layer in zip(colours, layers, strict=False):
        group = rows.loc[rows["layer"] == layer].sort_values("step")
        ax.plot(group["step"], group["value"], "-o", ms=2.5, lw=1.5, color=colour,
                label={0: "embedding"}.get(layer, f"layer {layer_labels(rows)[layer]}"))
    auto_xscale(ax, rows["step"].to_numpy(dtype=float), xscale)
    ax.set_xlabel("training step")
    ax.set_ylabel(metric_label(metric))
    heads = " (mean over heads)" if (select_metric(frame, metric)["head"] >= 0).any() else ""
    ax.set_title(f"{metric_label(metric)} per layer during training{heads}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5),
              ncols=1 if len(layers) <= 16 else 2)
    return fig


def per_head_vs_step(
    frame: pd.DataFrame,
    metric: str,
    *,
    ncols: int = 4,
    xscale: Literal["auto", "linear", "symlog"] = "auto",
) -> Figure:
    """A grid of panels, one per layer, each with one line per head against step.

    Panels share both axes; one legend for the heads. Rows with ``head == -1`` draw as a black
    line "all heads". ``fig.axes`` holds the layer panels first (unused grid cells are removed).
    """
    rows = select_metric(frame, metric)
    dup = rows.duplicated(["step", "layer", "head"], keep=False)
    if dup.any():
        raise ValueError(f"metric {metric!r}: the table holds several runs; filter it to one run")
    layers = sorted(rows["layer"].unique())
    heads = sorted(rows["head"].unique())
    ncols = max(1, min(ncols, len(layers)))
    nrows = math.ceil(len(layers) / ncols)
    fig = new_figure(2.9 * ncols + 1.2, 2.3 * nrows + 0.8)
    axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False).ravel()
    palette = mpl.colormaps["tab10" if len(heads) <= 10 else "tab20"]
    for ax, layer in zip(axes, layers, strict=False):
        in_layer = rows.loc[rows["layer"] == layer]
        for head in heads:
            group = in_layer.loc[in_layer["head"] == head].sort_values("step")
            if group.empty:
                continue
            colour = "black" if head < 0 else palette(int(head) % palette.N)
            ax.plot(group["step"], group["value"], "-", lw=1.3, color=colour,
                    label="all heads" if head < 0 else f"head {head}")
        ax.set_title("embedding" if layer == 0 else f"layer {layer}", fontsize="medium")
        ax.grid(alpha=0.3)
        auto_xscale(ax, rows["step"].to_numpy(dtype=float), xscale)
    for ax in axes[len(layers):]:
        ax.remove()
    fig.supxlabel("training step")
    fig.supylabel(metric_label(metric))
    fig.suptitle(f"{metric_label(metric)} per head during training")
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize="small", title="head")
    return fig
