"""Interactive W&B charts and sortable summaries from the tidy probe table.

Pure functions from a tidy probes DataFrame (`repgeom.probes.core.table`) to `wandb.Table`s, W&B
charts and summary dicts; the callback logs what they return beside the PNG figures. In W&B:

=====================================  =========================================================
key                                    what
=====================================  =========================================================
``probe/tables/profile_<metric>``      ``wandb.Table`` (step, layer, layer_name, value): the
                                       layer profile of every probe step, filterable and
                                       comparable across runs
``probe/charts/profile_<metric>``      line series over layers, one line per probe step
``probe/tables/layer_step_<metric>``   ``wandb.Table`` (layer, layer_name, step, value)
``probe/charts/layer_step_<metric>``   layer x step heatmap (W&B's matrix chart preset,
                                       ``wandb/confusion_matrix/v1``, read as rows = layer,
                                       columns = step, colour = value)
``probe_summary/<name>/layer_<ii>``    run summary: the step of each layer's intrinsic-dimension
                                       peak and its value, the final anisotropy profile; the
                                       final LM loss and bpc as ``.../model``
=====================================  =========================================================

Profiles are drawn for `PROFILE_METRICS`, layer x step maps for `LAYER_STEP_METRICS` (those
present in the table). Per-head metrics are averaged over heads first. The table may carry a
``layer_name`` column (e.g. ``final_norm``); where it does not, layers are named ``layer_<ii>``
as in the scalar keys. Each maker takes the metric's `layer_values` as ``values=`` where the
caller has them (`charts` computes them once per metric).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from repgeom.probes.core import catalogue
from repgeom.probes.core.table import MODEL_LAYER_NAME, MODEL_METRICS, rows_to_frame
from repgeom.probes.report.aggregate import head_means

# What each metric gets in W&B is a fact of its catalogue entry (`Output.wandb`).
PROFILE_METRICS = catalogue.wandb_metrics("profile")
"""The main metrics: each gets a layer profile chart (one line per probe step)."""
LAYER_STEP_METRICS = catalogue.wandb_metrics("layer_step")
"""The metrics whose layer x step map shows the expansion and compression phases."""
PEAK_METRICS = catalogue.wandb_metrics("peak")
"""Intrinsic dimensions whose per-layer peak (step and value) goes into the run summary."""
FINAL_METRICS = catalogue.wandb_metrics("final")
"""Metrics whose final per-layer profile goes into the run summary."""
_LAYER_KEY = re.compile(r"probe/(?P<metric>[^/]+)/layer_\d+")


def layer_values(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One row per (step, layer) of `metric`, heads averaged, NaNs dropped.

    Returns
    -------
    DataFrame
        Columns ``step`` (int), ``layer`` (int), ``layer_name`` (str), ``value`` (float), sorted by
        step then layer; empty when the metric is absent.
    """
    rows = rows_to_frame(frame.loc[frame["metric"] == metric])
    out = pd.DataFrame(columns=["step", "layer", "layer_name", "value"])
    if rows.empty:
        return out
    per_layer = head_means(rows).dropna(subset=["value"])
    if per_layer.empty:
        return out
    per_layer = per_layer.sort_values(["step", "layer"], kind="stable")
    out = per_layer[["step", "layer", "layer_name", "value"]].reset_index(drop=True)
    return out.astype({"step": "int64", "layer": "int64", "value": "float64"})


def layer_key(layer: int, metric: str = "") -> str:
    """``layer_<ii>``: the name of a layer in the scalar keys (``probe/<metric>/layer_<ii>``);
    ``model`` for the rows of the whole model (the LM loss: `metric` in `MODEL_METRICS`)."""
    return MODEL_LAYER_NAME if metric in MODEL_METRICS else f"layer_{int(layer):02d}"


def profile_table(frame: pd.DataFrame, metric: str, *, values: pd.DataFrame | None = None):
    """A ``wandb.Table`` (step, layer, layer_name, value) of `metric`: every layer profile."""
    import wandb

    values = layer_values(frame, metric) if values is None else values
    return wandb.Table(dataframe=values[["step", "layer", "layer_name", "value"]])


def profile_chart(frame: pd.DataFrame, metric: str, *, values: pd.DataFrame | None = None):
    """A W&B line series of `metric` against the layer, one line per probe step."""
    import wandb

    values = layer_values(frame, metric) if values is None else values
    steps = sorted(values["step"].unique())
    xs = [values.loc[values["step"] == s, "layer"].tolist() for s in steps]
    ys = [values.loc[values["step"] == s, "value"].tolist() for s in steps]
    return wandb.plot.line_series(
        xs=xs, ys=ys, keys=[f"step {s}" for s in steps], title=f"{metric} by layer", xname="layer"
    )


def layer_step_table(frame: pd.DataFrame, metric: str, *, values: pd.DataFrame | None = None):
    """A ``wandb.Table`` (layer, layer_name, step, value) of `metric`: the layer x step map."""
    import wandb

    values = layer_values(frame, metric) if values is None else values
    return wandb.Table(dataframe=values[["layer", "layer_name", "step", "value"]])


def layer_step_chart(frame: pd.DataFrame, metric: str, *, values: pd.DataFrame | None = None):
    """A layer x step heatmap of `metric` (W&B's matrix preset: rows layer, columns step).

    Labels are zero-padded (``03 layer_03``, ``step 0000250``) because the preset orders its
    axes as text.
    """
    import wandb

    values = layer_values(frame, metric) if values is None else values
    width = len(str(int(values["step"].max()))) if not values.empty else 1
    data = [
        [f"{row.layer:02d} {row.layer_name}", f"step {row.step:0{width}d}", float(row.value)]
        for row in values.itertuples(index=False)
    ]
    table = wandb.Table(columns=["layer", "step", "value"], data=data)
    return wandb.plot_table(
        "wandb/confusion_matrix/v1",
        table,
        {"Actual": "layer", "Predicted": "step", "nPredictions": "value"},
        {"title": f"{metric}: layer x step"},
    )


def chart_keys(frame: pd.DataFrame) -> dict[str, str]:
    """The W&B keys `charts` logs for this table, each with the metric it shows."""
    present = set(frame["metric"])
    keys: dict[str, str] = {}
    for metric in PROFILE_METRICS:
        if metric in present:
            keys[f"probe/tables/profile_{metric}"] = metric
            keys[f"probe/charts/profile_{metric}"] = metric
    for metric in LAYER_STEP_METRICS:
        if metric in present:
            keys[f"probe/tables/layer_step_{metric}"] = metric
            keys[f"probe/charts/layer_step_{metric}"] = metric
    return keys


def charts(frame: pd.DataFrame) -> dict[str, Any]:
    """Every table and chart of `chart_keys`, ready for ``run.log``; metrics with no finite
    value are left out."""
    makers = {
        "probe/tables/profile_": profile_table,
        "probe/charts/profile_": profile_chart,
        "probe/tables/layer_step_": layer_step_table,
        "probe/charts/layer_step_": layer_step_chart,
    }
    out: dict[str, Any] = {}
    values: dict[str, pd.DataFrame] = {}  # each metric's `layer_values`, computed once
    for key, metric in chart_keys(frame).items():
        if metric not in values:
            values[metric] = layer_values(frame, metric)
        if values[metric].empty:
            continue
        prefix = key[: -len(metric)]
        out[key] = makers[prefix](frame, metric, values=values[metric])
    return out


def summary(frame: pd.DataFrame) -> dict[str, float | int]:
    """Per-layer run-summary values, for the W&B run table (sortable and groupable).

    ``probe_summary/<metric>_peak_step/layer_<ii>`` and ``probe_summary/<metric>_peak/layer_<ii>``
    for `PEAK_METRICS`: the step at which that layer's value was largest (the earliest on ties)
    and the value; ``probe_summary/final_<metric>/layer_<ii>`` for `FINAL_METRICS`: the value at
    the last step it was probed. Absent metrics give no keys.

    Examples
    --------
    >>> frame = pd.DataFrame({"step": [0, 10, 0, 10], "layer": [1, 1, 2, 2],
    ...                       "metric": "twonn", "value": [2.0, 5.0, 3.0, 1.0]})
    >>> summary(frame)["probe_summary/twonn_peak_step/layer_02"]
    0
    """
    out: dict[str, float | int] = {}
    for metric in PEAK_METRICS:
        values = layer_values(frame, metric)
        for layer, rows in values.dropna(subset=["value"]).groupby("layer"):  # NaN: guarded
            top = rows.loc[rows["value"].idxmax()]  # rows are sorted by step: the earliest max
            out[f"probe_summary/{metric}_peak_step/{layer_key(layer, metric)}"] = int(top["step"])
            out[f"probe_summary/{metric}_peak/{layer_key(layer, metric)}"] = float(top["value"])
    for metric in FINAL_METRICS:
        values = layer_values(frame, metric)
        if values.empty:
            continue
        last = values.loc[values["step"] == values["step"].max()]
        for row in last.itertuples(index=False):
            out[f"probe_summary/final_{metric}/{layer_key(row.layer, metric)}"] = float(row.value)
    return {k: v for k, v in out.items() if not (isinstance(v, float) and np.isnan(v))}


def summary_definitions(keys: Iterable[str]) -> dict[str, str]:
    """W&B summary modes of the per-layer scalar keys among `keys`: ``"max"`` for the
    intrinsic dimensions (`PEAK_METRICS`: the peak of each layer), ``"last"`` for `FINAL_METRICS`
    (the final profile).

    Exact names, not globs: wandb applies the first ``define_metric`` glob that matches a key,
    and the probe's ``probe/*`` (its step axis) is defined first, so a glob's summary mode would
    never take effect.

    >>> summary_definitions(["probe/twonn/layer_01", "probe/twonn/mean", "probe/step"])
    {'probe/twonn/layer_01': 'max'}
    """
    modes = {**{m: "max" for m in PEAK_METRICS}, **{m: "last" for m in FINAL_METRICS}}
    out = {}
    for key in keys:
        match = _LAYER_KEY.fullmatch(key)
        if match and match["metric"] in modes:
            out[key] = modes[match["metric"]]
    return out


def define_summaries(run, keys: Iterable[str]) -> None:
    """``run.define_metric`` every key of `summary_definitions` on the ``probe/step`` axis, so
    the run table shows each layer's peak intrinsic dimension and final anisotropy."""
    for key, mode in summary_definitions(keys).items():
        run.define_metric(key, step_metric="probe/step", summary=mode)
