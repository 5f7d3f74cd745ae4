"""Figures of the probe table, for W&B and for the run folder.

Every function takes the tidy table of `repgeom.probes.table` and returns a
`matplotlib.figure.Figure`; the caller logs it (``wandb.log({key: wandb.Image(fig)})``) or saves
it. Figures are built with ``Figure()``, not ``pyplot``: no GUI backend is touched, no
global registry keeps them alive, and they render with Agg when saved.

=========================  =================================================================
function                   what it shows
=========================  =================================================================
`layer_profile`            value against layer, one line per probe step (colour bar) or per
                           ``revision``/``model`` (legend): the bell shape of anisotropy
`metric_vs_step`           layer mean against step, its maximum marked: the expansion then
                           compression of intrinsic dimension, its turns as triangles
`heatmap`                  layer x step
`per_layer_vs_step`        one line per layer against step (attention entropy)
`per_head_vs_step`         one panel per layer, one line per head (Q/K cosine)
`survey_profile`           one line per model against relative depth (0 = embedding, 1 = last
                           block), decoders solid, encoders dashed: a survey across models
`profiles_side_by_side`    one panel per run, its final layer profile (causal vs bidirectional)
`profile_bands`            one panel per group of seeds: mean profile, shaded 95% interval
`metric_vs_step_bands`     layer mean against step per group of seeds, shaded 95% interval
`per_layer_vs_step_bands`  one line per layer against step, mean over seeds, shaded interval
`compare_texts`            per-layer pooled cosine of two texts, and the token x token cosines
`save_figures`             the standard set of PNGs for every metric in a table
=========================  =================================================================

Per-head metrics are averaged over heads wherever a figure has no head axis. Layer means leave
out layer 0, the embedding (see `repgeom.probes.table`).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Literal

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.colors import BoundaryNorm, ListedColormap, Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from repgeom.probes import catalogue, phase_markers, seeds
from repgeom.probes.table import (
    FINAL_NORM,
    block_name,
    head_means,
    is_pairwise,
    layer_means,
)

DPI = 120
FINAL_NORM_GAP = 0.08
"""`survey_profile` draws the final norm this far right of relative depth 1 (the last block)."""
KIND_STYLE = {"decoder": "-", "encoder": "--"}
"""`survey_profile`'s line style of each kind of model; a model of unknown kind is dotted."""


def metric_label(metric: str) -> str:
    """The pretty name of `metric`, from its catalogue entry (the name de-underscored else)."""
    return catalogue.label(metric)


def is_id_metric(metric: str) -> bool:
    """Whether `metric` is an intrinsic-dimension estimate (TwoNN, GRIDE, MLE)."""
    return catalogue.is_intrinsic_dimension(metric)


# ---------------------------------------------------------------------------------------------
# Selection helpers


def _select(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The rows of `metric`, or a ValueError that names it and lists the metrics present."""
    if "metric" not in frame.columns:
        raise ValueError("frame: not a probe table (no 'metric' column)")
    rows = frame.loc[frame["metric"] == metric]
    if rows.empty:
        available = ", ".join(sorted(frame["metric"].unique())) or "none"
        raise ValueError(f"metric {metric!r} is not in the table; available: {available}")
    return rows


def _one_run(rows: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Head-averaged rows of one run: raises when several runs share a (step, layer)."""
    per_layer = head_means(rows)
    dup = per_layer.duplicated(["step", "layer"], keep=False)
    if dup.any():
        extra = [c for c in per_layer.columns if c not in ("step", "layer", "layer_name", "head",
                                                             "metric", "value", "std")]
        varying = [c for c in extra if per_layer.loc[dup, c].nunique(dropna=False) > 1]
        hint = ", ".join(f"{c!r}" for c in varying) or "no column tells them apart"
        raise ValueError(
            f"metric {metric!r}: the table holds several runs at the same step ({hint}); "
            "filter it to one run, or use layer_profile(..., by=...)"
        )
    return per_layer


def _step_ticks(steps: Sequence[int], max_ticks: int = 10) -> tuple[list[int], list[str]]:
    """Positions (indices into `steps`) and labels of at most `max_ticks` evenly chosen steps."""
    n = len(steps)
    idx = sorted(set(np.linspace(0, n - 1, min(n, max_ticks)).round().astype(int).tolist()))
    return idx, [_fmt_step(steps[i]) for i in idx]


def _fmt_step(step: int) -> str:
    step = int(step)
    if abs(step) >= 10_000 and step % 1000 == 0:
        return f"{step // 1000}k"
    return str(step)


def _auto_xscale(ax: Axes, steps: np.ndarray, xscale: str) -> None:
    """Symlog when the steps span more than two decades (log-spaced early probes), else linear."""
    if xscale == "auto":
        positive = steps[steps > 0]
        xscale = (
            "symlog" if positive.size and steps.max() / positive.min() >= 100 else "linear"
        )
    if xscale == "symlog":
        ax.set_xscale("symlog", linthresh=max(1.0, float(steps[steps > 0].min(initial=1))))
        # Plain step numbers ("100", "1k") read better than "10^2" on a training-step axis.
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _fmt_step(int(round(x)))))
    else:
        ax.set_xscale(xscale)


def _step_colours(steps: Sequence[int]) -> tuple[list, mpl.cm.ScalarMappable]:
    """One viridis colour per probe, by probe order (log-spaced early probes stay distinct)."""
    n = len(steps)
    cmap = ListedColormap(mpl.colormaps["viridis"](np.linspace(0, 1, max(n, 2)))[:n] if n > 1
                          else mpl.colormaps["viridis"]([0.0]))
    norm = BoundaryNorm(np.arange(n + 1) - 0.5, cmap.N)
    mappable = mpl.cm.ScalarMappable(norm=norm, cmap=cmap)
    return [cmap(i) for i in range(n)], mappable


def group_colours(n: int) -> np.ndarray:
    """One colour per line of a legend: tab10 up to 10 lines, else evenly spaced on viridis."""
    return mpl.colormaps["tab10" if n <= 10 else "viridis"](
        np.arange(n) if n <= 10 else np.linspace(0, 1, n)
    )


def _step_colorbar(fig: Figure, cax: Axes, steps: Sequence[int]) -> None:
    _, mappable = _step_colours(steps)
    bar = fig.colorbar(mappable, cax=cax)
    idx, labels = _step_ticks(steps, max_ticks=12)
    bar.set_ticks(idx, labels=labels)
    bar.set_label("training step")


def _new_figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _single_axes(
    width: float,
    height: float,
    *,
    left: float = 0.85,
    right: float = 0.25,
    bottom: float = 0.6,
    top: float = 0.45,
    colorbar: bool = False,
) -> tuple[Figure, Axes, Axes | None]:
    """A figure with one axes placed by fixed margins in inches, and a colour-bar axes if asked.

    Fixed margins instead of constrained layout: the standard set is dozens of these figures, and
    constrained layout doubles the time each takes to save (measured: 0.3 s against 0.15 s).
    """
    fig = Figure(figsize=(width, height), dpi=DPI)
    bar_room = 1.15 if colorbar else 0.0  # 0.12 pad + 0.18 bar + ticks and label
    ax = fig.add_axes((
        left / width,
        bottom / height,
        (width - left - right - bar_room) / width,
        (height - bottom - top) / height,
    ))
    cax = None
    if colorbar:
        cax = fig.add_axes((
            (width - right - bar_room + 0.12) / width,
            bottom / height,
            0.18 / width,
            (height - bottom - top) / height,
        ))
    return fig, ax, cax


def _layer_labels(rows: pd.DataFrame) -> dict[int, str]:
    """Tick label of each layer index: its number, or ``final norm`` for the final norm."""
    names = rows.drop_duplicates("layer").set_index("layer")["layer_name"]
    return {int(k): "final norm" if v == FINAL_NORM else str(int(k)) for k, v in names.items()}


def _layer_axis(ax: Axes, per_layer: pd.DataFrame) -> None:
    """Layer ticks; the final norm's layer, where there is one, is labelled ``final norm``."""
    names = _layer_labels(per_layer)
    layers = sorted(names)
    ax.set_xlabel("layer (0 = embedding)" if 0 in layers else "layer")
    step = max(1, math.ceil(len(layers) / 16))
    final = [layer for layer in layers if names[layer] == "final norm"]
    ticks = sorted(set(layers[::step]) | set(final))
    ax.set_xticks(ticks, [names[t] for t in ticks])
    ax.grid(alpha=0.3)


def _plot_profile(ax: Axes, group: pd.DataFrame, colour, label: str, *, x: str = "layer",
                  **style) -> None:
    """One layer profile: the blocks joined by a line, the final norm's output (if any) as an
    open marker on a dotted segment, so it never reads as one more block.

    `x` is the column of the horizontal position (``layer``, or a survey's relative depth);
    `style` goes to the blocks' line (e.g. ``ls="--"``)."""
    group = group.sort_values("layer")
    final = group["layer_name"] == FINAL_NORM
    ax.plot(group.loc[~final, x], group.loc[~final, "value"], color=colour, label=label,
            **{"marker": "o", "ls": "-", "ms": 3, "lw": 1.5, **style})
    if final.any():
        last_block = group.loc[~final].tail(1)
        joined = pd.concat([last_block, group.loc[final]])
        ax.plot(joined[x], joined["value"], ":", color=colour, lw=1)
        ax.plot(group.loc[final, x], group.loc[final, "value"], "o", mfc="white",
                color=colour, ms=5)


# ---------------------------------------------------------------------------------------------
# Figures


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
    rows = _select(frame, metric)
    if by != "step" and by not in rows.columns:
        raise ValueError(f"by: column {by!r} is not in the table; columns: {list(frame.columns)}")
    fig, ax, cax = _single_axes(7.5, 4.5, colorbar=by == "step")
    if by == "step":
        per_layer = _one_run(rows, metric)
        steps = sorted(per_layer["step"].unique())
        colours, _ = _step_colours(steps)
        for colour, (step, group) in zip(colours, per_layer.groupby("step", sort=True),
                                         strict=True):
            _plot_profile(ax, group, colour, f"step {step}")
        _step_colorbar(fig, cax, steps)
        title = f"{metric_label(metric)} by layer, one line per probe"
    else:
        per_layer = head_means(rows)
        order = per_layer.groupby(by, sort=False)["step"].min().sort_values(kind="stable")
        colours = group_colours(len(order))
        for colour, name in zip(colours, order.index, strict=True):
            group = per_layer.loc[per_layer[by] == name]
            group = group.loc[group["step"] == group["step"].max()]
            _plot_profile(ax, group, colour, str(name))
        ax.legend(title=by, fontsize="small", loc="best")
        title = f"{metric_label(metric)} by layer, one line per {by}"
    _layer_axis(ax, per_layer)
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
        Average over layer 0 as well (off: blocks 1..L, as in `table.summary`).
    xscale : {"auto", "linear", "symlog"}
        ``"auto"`` takes symlog when the steps span more than two decades.

    Returns
    -------
    Figure
        One axes; per group one data line and one marker line with ``gid == "max"`` at
        (step of the maximum, maximum).
    """
    rows = _select(frame, metric)
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
        extra = [c for c in means.columns if c not in ("step", "metric", "value", "std")][1:]
        raise ValueError(f"metric {metric!r}: several runs share a step; pass by= one of {extra}")
    fig, ax, _ = _single_axes(7.5, 4.5)
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
            phase_markers.mark_turns(ax, rows if name is None else rows.loc[rows[by] == name],
                                     metric, colour)
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
    _auto_xscale(ax, means["step"].to_numpy(dtype=float), xscale)
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
    rows = _one_run(_select(frame, metric), metric)
    grid = rows.pivot(index="layer", columns="step", values="value").sort_index().sort_index(axis=1)
    values = grid.to_numpy(dtype=float)
    steps, layers = list(grid.columns), list(grid.index)
    fig, ax, cax = _single_axes(
        min(max(3.5 + 0.3 * len(steps), 6.0), 12.0), min(max(1.6 + 0.25 * len(layers), 3.5), 8.0),
        bottom=0.85, left=1.35, colorbar=True,  # room for the "final norm" tick
    )
    cmap, norm = _diverging(values)
    image = ax.imshow(np.ma.masked_invalid(values), origin="lower", aspect="auto",
                      cmap=cmap, norm=norm, interpolation="nearest")
    idx, labels = _step_ticks(steps, max_ticks=24)
    ax.set_xticks(idx, labels=labels, rotation=45 if len(idx) > 6 else 0,
                  ha="right" if len(idx) > 6 else "center", rotation_mode="anchor")
    names = _layer_labels(rows)
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
    rows = _one_run(_select(frame, metric), metric)
    layers = sorted(rows["layer"].unique())
    fig, ax, _ = _single_axes(8.5, 4.5, right=1.45 if len(layers) <= 16 else 2.6)
    colours = mpl.colormaps["plasma"](np.linspace(0.0, 0.9, max(len(layers), 2)))
    for colour, layer in zip(colours, layers, strict=False):
        group = rows.loc[rows["layer"] == layer].sort_values("step")
        ax.plot(group["step"], group["value"], "-o", ms=2.5, lw=1.5, color=colour,
                label={0: "embedding"}.get(layer, f"layer {_layer_labels(rows)[layer]}"))
    _auto_xscale(ax, rows["step"].to_numpy(dtype=float), xscale)
    ax.set_xlabel("training step")
    ax.set_ylabel(metric_label(metric))
    heads = " (mean over heads)" if (_select(frame, metric)["head"] >= 0).any() else ""
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
    rows = _select(frame, metric)
    dup = rows.duplicated(["step", "layer", "head"], keep=False)
    if dup.any():
        raise ValueError(f"metric {metric!r}: the table holds several runs; filter it to one run")
    layers = sorted(rows["layer"].unique())
    heads = sorted(rows["head"].unique())
    ncols = max(1, min(ncols, len(layers)))
    nrows = math.ceil(len(layers) / ncols)
    fig = _new_figure(2.9 * ncols + 1.2, 2.3 * nrows + 0.8)
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
        _auto_xscale(ax, rows["step"].to_numpy(dtype=float), xscale)
    for ax in axes[len(layers):]:
        ax.remove()
    fig.supxlabel("training step")
    fig.supylabel(metric_label(metric))
    fig.suptitle(f"{metric_label(metric)} per head during training")
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize="small", title="head")
    return fig


def _short_name(model: str) -> str:
    """A legend's name of a model: a hub name as it is, a local folder by its last two parts."""
    path = Path(model)
    return "/".join(path.parts[-2:]) if path.is_absolute() else model


def survey_profile(frame: pd.DataFrame, metric: str) -> Figure:
    """One line per model: `metric` against relative depth (0 = embedding, 1 = last block).

    Decoders are solid, encoders dashed (`KIND_STYLE`); the final norm's output is an open marker
    at ``1 + FINAL_NORM_GAP``. The legend names each model (a local folder by its last two path
parts) and its kind, in table order.

    Parameters
    ----------
    frame : DataFrame
        `repgeom.probes.survey.survey_table`'s rows (columns ``model``, ``kind``, ``depth``,
        ``layer_name``, ``metric``, ``value``).
    """
    missing = {"model", "kind", "depth"} - set(frame.columns)
    if missing:
        raise ValueError(f"frame lacks column(s) {sorted(missing)}: build it with "
                         "repgeom.probes.survey.survey_table(folders)")
    rows = _select(frame, metric).copy()
    rows["x"] = rows["depth"].fillna(1 + FINAL_NORM_GAP)
    models = list(pd.unique(rows["model"]))
    fig, ax, _ = _single_axes(8.5, 4.8, right=3.0)
    for colour, model in zip(group_colours(len(models)), models, strict=True):
        group = rows.loc[rows["model"] == model]
        kind = str(group["kind"].iloc[0])
        _plot_profile(ax, group, colour, f"{_short_name(model)} ({kind})", x="x",
                      ls=KIND_STYLE.get(kind, ":"))
    ticks = [0.0, 0.25, 0.5, 0.75, 1.0]
    labels = ["0", "0.25", "0.5", "0.75", "1"]
    if (rows["layer_name"] == FINAL_NORM).any():
        ticks.append(1 + FINAL_NORM_GAP)
        labels.append("final\nnorm")
    ax.set_xticks(ticks, labels)
    ax.set_xlabel("relative depth (0 = embedding, 1 = last block)")
    ax.set_ylabel(metric_label(metric))
    ax.set_title(f"{metric_label(metric)} across models (solid: decoder, dashed: encoder)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


def profiles_side_by_side(
    frames: Mapping[str, pd.DataFrame],
    metric: str,
    *,
    step: int | Literal["last"] = "last",
) -> Figure:
    """One panel per labelled run, each with its layer profile at `step`, on a shared y axis.

    Parameters
    ----------
    frames : dict of label -> DataFrame
        E.g. ``{"causal": read_table(a), "bidirectional": read_table(b)}``.
    step : int or "last"
        The probe step drawn in every panel; ``"last"`` takes each run's own last step.

    Returns
    -------
    Figure
        ``len(frames)`` panels with one profile line each (±1 std shaded where known).
    """
    if not frames:
        raise ValueError("frames: need at least one labelled table")
    profiles = {}
    for label, frame in frames.items():
        try:
            rows = _one_run(_select(frame, metric), metric)
        except ValueError as err:
            raise ValueError(f"run {label!r}: {err}") from None
        available = sorted(int(s) for s in rows["step"].unique())
        at = available[-1] if step == "last" else step
        if at not in available:
            raise ValueError(f"run {label!r}: no step {step} for {metric!r}; steps: {available}")
        profiles[label] = (int(at), rows.loc[rows["step"] == at].sort_values("layer"))
    n = len(profiles)
    fig = _new_figure(3.6 * n + 0.6, 4.2)
    axes = fig.subplots(1, n, sharey=True, squeeze=False).ravel()
    colours = mpl.colormaps["tab10"](np.arange(n) % 10)
    for ax, colour, (label, (at, profile)) in zip(axes, colours, profiles.items(), strict=True):
        _plot_profile(ax, profile, colour, label, ms=4, lw=2)
        if profile["std"].notna().any():
            ax.fill_between(profile["layer"], profile["value"] - profile["std"],
                            profile["value"] + profile["std"], color=colour, alpha=0.2, lw=0)
        _layer_axis(ax, profile)
        ax.set_title(f"{label} (step {at})")
    axes[0].set_ylabel(metric_label(metric))
    fig.suptitle(f"{metric_label(metric)} by layer")
    return fig


def _band(ax: Axes, x, low, high, colour, **kw) -> None:
    """Shade the interval [low, high] where it is known (one seed: no band)."""
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    if np.isfinite(low).any():
        ax.fill_between(np.asarray(x, dtype=float), low, high, color=colour, alpha=0.2, lw=0,
                        **kw)


def _check_groups(groups: Mapping[str, Sequence[pd.DataFrame]]) -> None:
    if not groups:
        raise ValueError("groups: need at least one label with its tables")
    empty = [label for label, tables in groups.items() if len(tables) == 0]
    if empty:
        raise ValueError(f"groups: no table for {empty}")


def profile_bands(
    groups: Mapping[str, Sequence[pd.DataFrame]],
    metric: str,
    *,
    step: int | Literal["last"] = "last",
    level: float = seeds.LEVEL,
) -> Figure:
    """One panel per group of runs (seeds): the mean layer profile and its shaded 95% interval.

    Parameters
    ----------
    groups : dict of label -> list of DataFrame
        E.g. ``{"causal": [seed0, seed1, seed2], "bidirectional": [...]}``; the runs of a group
        must have been probed at the same steps.
    step : int or "last"
        The probe step drawn; ``"last"`` takes each group's last step.
    level : float
        Coverage of the interval (`seeds.t_interval`); a group of one run has no band.

    Returns
    -------
    Figure
        ``len(groups)`` panels on a shared y axis; per panel one mean line over the blocks (line
        ``gid == "mean"``), one band, and the final norm's output (where there is one) as an
        open marker with an error bar.
    """
    _check_groups(groups)
    seeds.check_steps(dict(groups))
    bands = {}
    for label, tables in groups.items():
        try:
            agg = seeds.aggregate([_select(t, metric) for t in tables], metric, level=level)
        except ValueError as err:
            raise ValueError(f"{label!r}: {err}") from None
        available = sorted(int(s) for s in agg["step"].unique())
        at = available[-1] if step == "last" else step
        if at not in available:
            raise ValueError(f"{label!r}: no step {step} for {metric!r}; steps: {available}")
        bands[label] = (at, len(tables), agg.loc[agg["step"] == at].sort_values("layer"))
    n = len(bands)
    fig = _new_figure(3.8 * n + 0.6, 4.3)
    axes = fig.subplots(1, n, sharey=True, squeeze=False).ravel()
    colours = mpl.colormaps["tab10"](np.arange(n) % 10)
    for ax, colour, (label, (at, count, profile)) in zip(axes, colours, bands.items(),
                                                         strict=True):
        final = profile["layer_name"] == FINAL_NORM
        inner = profile.loc[~final]
        _plot_profile(ax, profile, colour, f"mean of {count} seed{'s' if count > 1 else ''}",
                      ms=4, lw=2)
        ax.get_lines()[0].set_gid("mean")
        _band(ax, inner["layer"], inner["low"], inner["high"], colour,
              label=f"{level:.0%} interval over seeds")
        if final.any() and np.isfinite(profile.loc[final, "low"]).all():
            point = profile.loc[final]
            ax.errorbar(point["layer"], point["value"],
                        yerr=[point["value"] - point["low"], point["high"] - point["value"]],
                        fmt="none", ecolor=colour, capsize=3, lw=1)
        _layer_axis(ax, profile)
        ax.set_title(f"{label} (step {at}, {count} seed{'s' if count > 1 else ''})")
        ax.legend(fontsize="small", loc="best")
    axes[0].set_ylabel(metric_label(metric))
    fig.suptitle(f"{metric_label(metric)} by layer, mean over seeds")
    return fig


def metric_vs_step_bands(
    groups: Mapping[str, Sequence[pd.DataFrame]],
    metric: str,
    *,
    level: float = seeds.LEVEL,
    xscale: Literal["auto", "linear", "symlog"] = "auto",
) -> Figure:
    """The layer mean (blocks 1..L) against step, mean over seeds with a shaded 95% interval.

    One line per group; the maximum of each mean curve is a star (``gid == "max"``) named in
    the legend ("peak 9.35 at step 200"), not a text box: a label never leaves the axes.
    """
    _check_groups(groups)
    seeds.check_steps(dict(groups))
    fig, ax, _ = _single_axes(8.0, 4.6)
    colours = mpl.colormaps["tab10"](np.arange(len(groups)) % 10)
    all_steps = []
    for colour, (label, tables) in zip(colours, groups.items(), strict=True):
        bands = seeds.layer_mean_bands([_select(t, metric) for t in tables], metric, level=level)
        bands = bands.dropna(subset=["value"]).sort_values("step")
        all_steps.append(bands["step"].to_numpy(dtype=float))
        n = len(tables)
        ax.plot(bands["step"], bands["value"], "-o", color=colour, ms=3, lw=1.8,
                label=f"{label} (mean of {n} seed{'s' if n > 1 else ''})", gid="mean")
        _band(ax, bands["step"], bands["low"], bands["high"], colour)
        top = bands.loc[bands["value"].idxmax()]
        ax.plot([top["step"]], [top["value"]], marker="*", ms=14, color=colour, mec="black",
                mew=0.8, ls="none", gid="max", zorder=5,
                label=f"{label}: peak {top['value']:.3g} at step {int(top['step'])}")
    _auto_xscale(ax, np.concatenate(all_steps), xscale)
    ax.set_xlabel("training step")
    ax.set_ylabel(f"{metric_label(metric)}, mean over blocks")
    ax.set_title(f"{metric_label(metric)} during training (blocks 1..L, "
                 f"shaded: {level:.0%} interval over seeds)", fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    return fig


def per_layer_vs_step_bands(
    tables: Sequence[pd.DataFrame],
    metric: str,
    *,
    level: float = seeds.LEVEL,
    xscale: Literal["auto", "linear", "symlog"] = "auto",
) -> Figure:
    """One line per layer against step, mean over the seeds `tables`, with a shaded interval.

    Per-head metrics are averaged over heads first. The final norm's output, where there is one,
    is dashed and named ``final norm`` (it is not one more block).
    """
    if not tables:
        raise ValueError("tables: need at least one run")
    seeds.check_steps({"runs": list(tables)})
    agg = seeds.aggregate([_select(t, metric) for t in tables], metric, level=level)
    layers = agg.drop_duplicates("layer").sort_values("layer")
    fig, ax, _ = _single_axes(8.5, 4.5, right=1.6)
    colours = mpl.colormaps["plasma"](np.linspace(0.0, 0.9, max(len(layers), 2)))
    for colour, (layer, name) in zip(colours, layers[["layer", "layer_name"]].itertuples(
            index=False), strict=False):
        group = agg.loc[agg["layer"] == layer].sort_values("step")
        final = name == FINAL_NORM
        label = "final norm" if final else ("embedding" if layer == 0 else f"layer {layer}")
        ax.plot(group["step"], group["value"], "--" if final else "-o", ms=2.5, lw=1.5,
                color=colour, label=label)
        _band(ax, group["step"], group["low"], group["high"], colour)
    _auto_xscale(ax, agg["step"].to_numpy(dtype=float), xscale)
    ax.set_xlabel("training step")
    ax.set_ylabel(metric_label(metric))
    heads = ", mean over heads" if any((t.loc[t["metric"] == metric, "head"] >= 0).any()
                                       for t in tables) else ""
    ax.set_title(f"{metric_label(metric)} per layer ({len(tables)} seeds{heads}; shaded: "
                 f"{level:.0%} interval)", fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


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
    fig = _new_figure(12.0, 5.0)
    left, right = fig.subplots(1, 2, width_ratios=[1, 1.25])
    left.plot(np.arange(pooled.size), pooled, "-o", color="tab:blue", ms=4, lw=2)
    left.axhline(0.0, color="grey", lw=0.8)
    _layer_axis(left, pd.DataFrame({"layer": range(pooled.size),
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


# ---------------------------------------------------------------------------------------------
# The standard set


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
    fig, ax, cax = _single_axes(0.5 * n + 3.2, 0.5 * n + 2.4, left=1.1, bottom=1.1,
                                colorbar=True)
    image = ax.imshow(grid, cmap="viridis", vmin=0.0, vmax=1.0, origin="lower")
    ax.set_xticks(range(n), names, rotation=90)
    ax.set_yticks(range(n), names)
    ax.set_title(f"{metric_label(metric)}, layer \u00d7 layer at step {_fmt_step(step)}")
    fig.colorbar(image, cax=cax).set_label(metric_label(metric))
    return fig


def similarity_to_final(frame: pd.DataFrame, metric: str) -> Figure:
    """Layer x step map of each layer's similarity to itself at the final step (``step_b``)."""
    rows = frame.loc[(frame["metric"] == metric) & (frame["step_b"] >= 0)]
    if rows.empty:
        raise ValueError(f"no step-vs-final rows of {metric!r}")
    wide = rows.pivot_table(index="layer", columns="step", values="value")
    steps = list(wide.columns)
    fig, ax, cax = _single_axes(max(6.0, 0.3 * len(steps) + 3), 0.4 * len(wide) + 2.5,
                                left=1.1, colorbar=True)
    image = ax.imshow(wide.to_numpy(), aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0,
                      origin="lower")
    ticks, labels = _step_ticks(steps)
    ax.set_xticks(ticks, labels)
    ax.set_yticks(range(len(wide)), _layer_names(rows, int(wide.index.max()) + 1)[: len(wide)])
    ax.set_xlabel("step")
    final = int(rows["step_b"].max())
    ax.set_title(f"{metric_label(metric)} of each layer with itself at step {_fmt_step(final)}")
    fig.colorbar(image, cax=cax).set_label(metric_label(metric))
    return fig


def _layer_names(rows: pd.DataFrame, n: int) -> list[str]:
    names = [block_name(i) for i in range(n)]
    for row in rows[["layer", "layer_name"]].drop_duplicates().itertuples(index=False):
        if row.layer < n:
            names[row.layer] = row.layer_name
    return names


def _pair_jobs(rows: pd.DataFrame, metric: str) -> list[tuple[str, Callable[[], Figure]]]:
    jobs = []
    same_step = rows["step_b"] < 0 if "step_b" in rows.columns else rows["layer_b"] >= 0
    if "layer_b" in rows.columns and (same_step & (rows["layer_b"] >= 0)).any():
        jobs.append((f"similarity_{metric}", partial(layer_similarity, rows, metric)))
    if "step_b" in rows.columns and (rows["step_b"] >= 0).any():
        jobs.append((f"vs_final_{metric}", partial(similarity_to_final, rows, metric)))
    return jobs


def save_figures(
    frame: pd.DataFrame,
    out_dir: str | os.PathLike,
    *,
    metrics: Iterable[str] | None = None,
    dpi: int = DPI,
) -> list[Path]:
    """Write the standard figures of every metric in `frame` as PNGs; return their paths.

    For each metric present (or each of `metrics` that is present):

    - ``profile_<metric>.png``: `layer_profile` (one line per ``revision`` when the table has
      several, else per step), for the metrics whose catalogue entry asks for it
      (`repgeom.probes.catalogue`: anisotropy, mean cosine, the intrinsic dimensions, the
      standard and the user's state metrics);
    - ``vs_step_<metric>.png``: `metric_vs_step`, where the entry asks (twonn, anisotropy);
    - ``heatmap_<metric>.png``: `heatmap`, for every metric;
    - ``per_layer_<metric>.png``: `per_layer_vs_step`, where asked (attention entropies), and
      for revisions of one model (``hf_revisions``) also for every ``vs_step`` metric: one
      line per layer against the revision's step;
    - ``per_head_<metric>.png``: `per_head_vs_step`, where asked (qk_cosine);
    - ``similarity_<metric>.png``: `layer_similarity`, a layer x layer map of each pairwise
      metric (CKA, mutual k-NN) at the last step, and ``vs_final_<metric>.png``:
      `similarity_to_final`, each layer's similarity to itself at the final step.

    Figures over steps need at least two probe steps; with a single step every metric gets its
    profile instead. Absent metrics are skipped, and a figure that cannot be drawn (a metric with
    no finite value) is skipped with a warning naming it. Tables with several models or runs:
    call once per run.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    present = list(dict.fromkeys(frame["metric"]))
    wanted = present if metrics is None else [m for m in metrics if m in set(present)]
    several_steps = frame["step"].nunique() > 1
    by = (
        "revision"
        if "revision" in frame.columns and frame["revision"].nunique() > 1
        else "step"
    )
    # Split once: every figure then filters a few hundred rows instead of the whole table.
    by_metric = {m: rows for m, rows in frame.groupby("metric", sort=False) if m in wanted}
    jobs: list[tuple[str, Callable[[], Figure]]] = []
    for metric in wanted:
        rows = by_metric[metric]
        if is_pairwise(rows):
            jobs += _pair_jobs(rows, metric)
            continue
        kinds = catalogue.figures(metric)
        # With one probe step (one checkpoint) the profile is the only figure: draw it for all.
        if "profile" in kinds or not several_steps:
            jobs.append((f"profile_{metric}", partial(layer_profile, rows, metric, by=by)))
        if several_steps and "vs_step" in kinds:
            jobs.append((f"vs_step_{metric}", partial(metric_vs_step, rows, metric)))
        if several_steps:
            jobs.append((f"heatmap_{metric}", partial(heatmap, rows, metric)))
        # Revisions of one model: the layer mean hides the layers, so they get a line each too.
        if several_steps and ("per_layer" in kinds or (by == "revision" and "vs_step" in kinds)):
            jobs.append((f"per_layer_{metric}", partial(per_layer_vs_step, rows, metric)))
        if several_steps and "per_head" in kinds:
            jobs.append((f"per_head_{metric}", partial(per_head_vs_step, rows, metric)))
    paths = []
    for name, make in jobs:
        try:
            fig = make()
        except ValueError as err:  # e.g. a metric with no finite value: skip it, keep the rest
            warnings.warn(f"save_figures: skipped {name}.png: {err}", stacklevel=2)
            continue
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=dpi, facecolor="white")
        fig.clear()
        paths.append(path)
    return paths
