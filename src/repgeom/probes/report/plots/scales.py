"""Figures of the intrinsic dimension against scale (the ``id_scales`` catalogue entry).

Facco et al. 2017 (Fig. 3) and Denti et al. 2022 draw the ID against the length scale it reads
and report it where the curve is flat. `id_vs_scale` draws that per layer at the first, peak and
last probe steps (TwoNN by decimation solid, GRIDE orders dashed, the plateau as a thick
segment); `scale_heatmap` draws the mean over the blocks as a step x scale map.
"""

from __future__ import annotations

import re

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from repgeom.probes.report.aggregate import blocks
from repgeom.probes.report.plots.style import new_figure, step_ticks

DECIMATION = re.compile(r"twonn_dec(\d+)")
GRIDE = re.compile(r"gride_k(\d+)")
SCALE_ROWS = re.compile(r"(twonn_dec\d+|gride_k\d+)_scale|twonn_dec\d+|id_plateau_(lo|hi)")
"""Rows drawn here only (not as standard per-metric figures)."""


def has_scales(frame: pd.DataFrame) -> bool:
    """Whether `frame` holds a scale profile (rows of ``id_scales``)."""
    return bool(frame["metric"].str.fullmatch(r"twonn_dec\d+_scale").any())


def profile_points(frame: pd.DataFrame) -> pd.DataFrame:
    """The scale profile as points: ``step, layer, layer_name, family (twonn_dec | gride),
    order (j or k), scale, value, std``, one row per estimate that has a scale."""
    single = frame.loc[frame["head"] == -1]
    keys = ["step", "layer", "layer_name"]
    parts = []
    for family, pattern in (("twonn_dec", DECIMATION), ("gride", GRIDE)):
        ids = single.loc[single["metric"].str.fullmatch(pattern.pattern)]
        scales = single.loc[single["metric"].str.fullmatch(pattern.pattern + "_scale")]
        ids = ids.assign(order=ids["metric"].str.extract(pattern.pattern)[0].astype(int))
        scales = scales.assign(
            order=scales["metric"].str.extract(pattern.pattern)[0].astype(int),
            scale=scales["value"])[[*keys, "order", "scale"]]
        merged = ids[[*keys, "order", "value", "std"]].merge(scales, on=[*keys, "order"])
        parts.append(merged.assign(family=family))
    out = pd.concat(parts, ignore_index=True)
    return out[["step", "layer", "layer_name", "family", "order", "scale", "value", "std"]]


def key_steps(frame: pd.DataFrame) -> list[int]:
    """The first, peak and last probe steps (fewer when they coincide): the peak of the block
    mean of ``id_plateau``, or of ``twonn`` where no plateau is finite."""
    steps = sorted(int(s) for s in frame["step"].unique())
    peak = steps[0]
    for metric in ("id_plateau", "twonn", "twonn_llm_microscope"):
        rows = blocks(frame.loc[(frame["metric"] == metric) & (frame["head"] == -1)])
        means = rows.groupby("step")["value"].mean().dropna()
        if len(means):
            peak = int(means.idxmax())
            break
    return list(dict.fromkeys([steps[0], peak, steps[-1]]))


def id_vs_scale(frame: pd.DataFrame) -> Figure:
    """ID against scale (mean neighbour distance, log axis), one panel per key step
    (`key_steps`), one colour per layer: TwoNN by decimation (solid, circles), GRIDE orders
    (dashed, squares), and each layer's plateau (thick segment at its ID from its lowest to
    its highest scale). The final norm is drawn dotted."""
    points = profile_points(frame)
    if points.empty:
        raise ValueError("id_vs_scale: the table has no scale profile (metric id_scales)")
    steps = key_steps(frame)
    layers = sorted(points["layer"].unique())
    colours = mpl.colormaps["plasma"](np.linspace(0.0, 0.9, max(len(layers), 2)))
    fig = new_figure(4.2 * len(steps) + 1.6, 4.2)
    axes = fig.subplots(1, len(steps), sharey=True, squeeze=False)[0]
    plateau = frame.loc[frame["metric"].isin(["id_plateau", "id_plateau_lo", "id_plateau_hi"])
                        & (frame["head"] == -1)]
    for ax, step in zip(axes, steps, strict=True):
        at = points.loc[points["step"] == step]
        for colour, layer in zip(colours, layers, strict=False):
            mine = at.loc[at["layer"] == layer]
            if mine.empty:
                continue
            name = mine["layer_name"].iloc[0]
            style = ":" if name == "final_norm" else "-"
            for family, marker, line in (("twonn_dec", "o", style), ("gride", "s", "--")):
                part = mine.loc[mine["family"] == family].sort_values("scale")
                ax.plot(part["scale"], part["value"], line, marker=marker, ms=3, lw=1.2,
                        color=colour, label=name if family == "twonn_dec" else None)
            here = plateau.loc[(plateau["step"] == step) & (plateau["layer"] == layer)]
            got = dict(zip(here["metric"], here["value"], strict=True))
            if np.isfinite([got.get(k, np.nan) for k in ("id_plateau", "id_plateau_lo",
                                                        "id_plateau_hi")]).all():
                ax.plot([got["id_plateau_lo"], got["id_plateau_hi"]], [got["id_plateau"]] * 2,
                        "-", lw=5, alpha=0.35, color=colour, solid_capstyle="butt")
        ax.set_xscale("log")
        _label_log_axis(ax.xaxis)
        ax.set_xlabel("scale: mean neighbour distance")
        ax.set_title(f"step {step}")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("intrinsic dimension")
    axes[-1].legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5),
                    title="solid: TwoNN decimation\ndashed: GRIDE k\nband: plateau",
                    title_fontsize="x-small")
    fig.suptitle("Intrinsic dimension against scale, first, peak and last probe")
    return fig


def scale_heatmap(frame: pd.DataFrame, *, n_scales: int = 40) -> Figure:
    """The mean over blocks 1..L of the ID, over step (columns, one per probe) and scale (rows,
    log-spaced), one panel for TwoNN by decimation and one for GRIDE, on one colour scale.

    At each step the blocks' mean ID at each decimation level or GRIDE order is placed at the
    blocks' mean scale of that level, and interpolated linearly in log scale onto `n_scales`
    rows spanning every step's scales; cells outside a step's range are blank. The white line is
    the block mean of the plateau's ends, where every block has one.
    """
    points = profile_points(frame)
    points = blocks(points)
    if points.empty:
        raise ValueError("scale_heatmap: the table has no scale profile of a block")
    steps = sorted(int(s) for s in points["step"].unique())
    grid = np.geomspace(points["scale"].min(), points["scale"].max(), n_scales)
    panels = {}
    for family in ("twonn_dec", "gride"):
        mine = points.loc[points["family"] == family]
        mean = mine.groupby(["step", "order"])[["scale", "value"]].mean().reset_index()
        image = np.full((n_scales, len(steps)), np.nan)
        for i, step in enumerate(steps):
            curve = mean.loc[mean["step"] == step].sort_values("scale")
            curve = curve.loc[np.isfinite(curve["value"])]
            if len(curve) < 2:
                continue
            x = np.log(curve["scale"].to_numpy())
            inside = (np.log(grid) >= x[0]) & (np.log(grid) <= x[-1])
            image[inside, i] = np.interp(np.log(grid[inside]), x, curve["value"].to_numpy())
        panels[family] = image
    finite = np.concatenate([p[np.isfinite(p)] for p in panels.values()])
    if not finite.size:
        raise ValueError("scale_heatmap: no finite ID in the scale profile")
    norm = mpl.colors.Normalize(finite.min(), finite.max())
    fig = new_figure(min(max(4.0 + 0.35 * len(steps), 7.0), 14.0), 6.5)
    axes = fig.subplots(2, 1, sharex=True)
    edges_x = np.arange(len(steps) + 1) - 0.5
    edges_y = np.sqrt(grid[1:] * grid[:-1])
    edges_y = np.concatenate([[grid[0] ** 2 / edges_y[0]], edges_y, [grid[-1] ** 2 / edges_y[-1]]])
    plateau = blocks(frame.loc[frame["metric"].isin(["id_plateau_lo", "id_plateau_hi"])
                               & (frame["head"] == -1)])
    ends = plateau.groupby(["step", "metric"])["value"].agg(lambda v: v.mean(skipna=False))
    for ax, (family, image) in zip(axes, panels.items(), strict=True):
        mesh = ax.pcolormesh(edges_x, edges_y, np.ma.masked_invalid(image), norm=norm,
                             cmap="viridis", shading="flat")
        for end in ("id_plateau_lo", "id_plateau_hi"):
            ys = [ends.get((s, end), np.nan) for s in steps]
            ax.plot(range(len(steps)), ys, "w-", lw=1.2)
        ax.set_yscale("log")
        _label_log_axis(ax.yaxis)
        ax.set_ylabel("scale (mean neighbour distance)")
        ax.set_title("TwoNN by decimation" if family == "twonn_dec" else "GRIDE, k = 2 ... 64",
                     fontsize="medium")
    idx, labels = step_ticks(steps, max_ticks=24)
    axes[-1].set_xticks(idx, labels=labels, rotation=45 if len(idx) > 6 else 0,
                        ha="right" if len(idx) > 6 else "center", rotation_mode="anchor")
    axes[-1].set_xlabel("training step (one column per probe)")
    fig.colorbar(mesh, ax=axes, label="intrinsic dimension, mean over blocks")
    fig.suptitle("Intrinsic dimension over scale and step (white: the plateau's ends)")
    return fig


def _label_log_axis(axis) -> None:
    """Labels at 1, 2 and 5 times each power of ten, written plainly (0.2, 1, 5), none on the
    minor ticks: matplotlib's own log labels overlap on a narrow axis under two decades wide,
    and leave one label on an axis that barely spans a decade."""
    axis.set_major_locator(LogLocator(base=10.0, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())
