"""Figures across runs: profiles side by side, and bands of the mean over seeds with their
95% interval (`repgeom.experiments.seeds`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from repgeom.experiments import seeds
from repgeom.probes.core.table import (
    FINAL_NORM,
)
from repgeom.probes.report.plots.style import (
    auto_xscale,
    layer_axis,
    metric_label,
    new_figure,
    one_run,
    plot_profile,
    select_metric,
    single_axes,
)


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
            rows = one_run(select_metric(frame, metric), metric)
        except ValueError as err:
            raise ValueError(f"run {label!r}: {err}") from None
        profiles[label] = _profile_at(rows, step, f"run {label!r}", metric)
    n = len(profiles)
    fig = new_figure(3.6 * n + 0.6, 4.2)
    axes = fig.subplots(1, n, sharey=True, squeeze=False).ravel()
    colours = mpl.colormaps["tab10"](np.arange(n) % 10)
    for ax, colour, (label, (at, profile)) in zip(axes, colours, profiles.items(), strict=True):
        plot_profile(ax, profile, colour, label, ms=4, lw=2)
        if profile["std"].notna().any():
            ax.fill_between(profile["layer"], profile["value"] - profile["std"],
                            profile["value"] + profile["std"], color=colour, alpha=0.2, lw=0)
        layer_axis(ax, profile)
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
            agg = seeds.aggregate([select_metric(t, metric) for t in tables], metric, level=level)
        except ValueError as err:
            raise ValueError(f"{label!r}: {err}") from None
        at, profile = _profile_at(agg, step, repr(label), metric)
        bands[label] = (at, len(tables), profile)
    n = len(bands)
    fig = new_figure(3.8 * n + 0.6, 4.3)
    axes = fig.subplots(1, n, sharey=True, squeeze=False).ravel()
    colours = mpl.colormaps["tab10"](np.arange(n) % 10)
    for ax, colour, (label, (at, count, profile)) in zip(axes, colours, bands.items(),
                                                         strict=True):
        final = profile["layer_name"] == FINAL_NORM
        inner = profile.loc[~final]
        plot_profile(ax, profile, colour, f"mean of {count} seed{'s' if count > 1 else ''}",
                      ms=4, lw=2)
        ax.get_lines()[0].set_gid("mean")
        _band(ax, inner["layer"], inner["low"], inner["high"], colour,
              label=f"{level:.0%} interval over seeds")
        if final.any() and np.isfinite(profile.loc[final, "low"]).all():
            point = profile.loc[final]
            ax.errorbar(point["layer"], point["value"],
                        yerr=[point["value"] - point["low"], point["high"] - point["value"]],
                        fmt="none", ecolor=colour, capsize=3, lw=1)
        layer_axis(ax, profile)
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
    fig, ax, _ = single_axes(8.0, 4.6)
    colours = mpl.colormaps["tab10"](np.arange(len(groups)) % 10)
    all_steps = []
    for colour, (label, tables) in zip(colours, groups.items(), strict=True):
        chosen = [select_metric(t, metric) for t in tables]
        bands = seeds.layer_mean_bands(chosen, metric, level=level)
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
    auto_xscale(ax, np.concatenate(all_steps), xscale)
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
    agg = seeds.aggregate([select_metric(t, metric) for t in tables], metric, level=level)
    layers = agg.drop_duplicates("layer").sort_values("layer")
    fig, ax, _ = single_axes(8.5, 4.5, right=1.6)
    colours = mpl.colormaps["plasma"](np.linspace(0.0, 0.9, max(len(layers), 2)))
    for colour, (layer, name) in zip(colours, layers[["layer", "layer_name"]].itertuples(
            index=False), strict=False):
        group = agg.loc[agg["layer"] == layer].sort_values("step")
        final = name == FINAL_NORM
        label = "final norm" if final else ("embedding" if layer == 0 else f"layer {layer}")
        ax.plot(group["step"], group["value"], "--" if final else "-o", ms=2.5, lw=1.5,
                color=colour, label=label)
        _band(ax, group["step"], group["low"], group["high"], colour)
    auto_xscale(ax, agg["step"].to_numpy(dtype=float), xscale)
    ax.set_xlabel("training step")
    ax.set_ylabel(metric_label(metric))
    heads = ", mean over heads" if any((t.loc[t["metric"] == metric, "head"] >= 0).any()
                                       for t in tables) else ""
    ax.set_title(f"{metric_label(metric)} per layer ({len(tables)} seeds{heads}; shaded: "
                 f"{level:.0%} interval)", fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


def _profile_at(rows: pd.DataFrame, step: int | str, what: str,
                metric: str) -> tuple[int, pd.DataFrame]:
    """The probe step `step` (``"last"``: the table's last) and its rows by layer; `what` names
    the run or group in the error when the table has no such step."""
    available = sorted(int(s) for s in rows["step"].unique())
    at = available[-1] if step == "last" else step
    if at not in available:
        raise ValueError(f"{what}: no step {step} for {metric!r}; steps: {available}")
    return int(at), rows.loc[rows["step"] == at].sort_values("layer")
