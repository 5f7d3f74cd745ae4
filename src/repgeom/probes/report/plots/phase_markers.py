"""The phases of a trajectory (`repgeom.probes.report.phases`) drawn on a metric-vs-step figure."""

from __future__ import annotations

import pandas as pd
from matplotlib.axes import Axes

from repgeom.probes.core import catalogue
from repgeom.probes.report import phases

MARKERS = {phases.TO_COMPRESSION: ("v", "expansion \u2192 compression"),
           phases.TO_EXPANSION: ("^", "compression \u2192 expansion")}
"""Marker and legend label of each kind of turn."""


def mark_turns(ax: Axes, rows: pd.DataFrame, metric: str, colour) -> int:
    """Mark the turns of the layer mean (blocks 1..L) of `metric` on `ax`: a hollow triangle
    pointing down where expansion turned to compression, up for the other way (``gid`` the
    event's name). Only intrinsic dimensions have phases; returns how many turns were drawn."""
    if not catalogue.is_intrinsic_dimension(metric):
        return 0
    events = phases.find_phases(rows, metrics=[metric])
    turns = events.loc[(events["layer"] == phases.MEAN_LAYER) & (events["event"] != phases.PEAK)]
    for event, (marker, label) in MARKERS.items():
        part = turns.loc[turns["event"] == event]
        if not part.empty:
            ax.plot(part["step"], part["value"], marker=marker, ms=11, mfc="none", mew=1.8,
                    color=colour, ls="none", gid=event, label=label, zorder=6)
    return len(turns)
