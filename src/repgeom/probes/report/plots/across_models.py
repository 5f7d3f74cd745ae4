"""`survey_profile`: one line per model against relative depth (a survey across models).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from repgeom.probes.core.table import (
    FINAL_NORM,
)
from repgeom.probes.report.plots.style import (
    group_colours,
    metric_label,
    plot_profile,
    select_metric,
    single_axes,
)

FINAL_NORM_GAP = 0.08
"""`survey_profile` draws the final norm this far right of relative depth 1 (the last block)."""


KIND_STYLE = {"decoder": "-", "encoder": "--"}
"""`survey_profile`'s line style of each kind of model; a model of unknown kind is dotted."""


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
        `repgeom.probes.report.survey.survey_table`'s rows (columns ``model``, ``kind``, ``depth``,
        ``layer_name``, ``metric``, ``value``).
    """
    missing = {"model", "kind", "depth"} - set(frame.columns)
    if missing:
        raise ValueError(f"frame lacks column(s) {sorted(missing)}: build it with "
                         "repgeom.probes.report.survey.survey_table(folders)")
    rows = select_metric(frame, metric).copy()
    rows["x"] = rows["depth"].fillna(1 + FINAL_NORM_GAP)
    models = list(pd.unique(rows["model"]))
    fig, ax, _ = single_axes(8.5, 4.8, right=3.0)
    for colour, model in zip(group_colours(len(models)), models, strict=True):
        group = rows.loc[rows["model"] == model]
        kind = str(group["kind"].iloc[0])
        plot_profile(ax, group, colour, f"{_short_name(model)} ({kind})", x="x",
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
