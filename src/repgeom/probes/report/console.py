"""probe.py's console output: the per-layer table of the last model, the trend over steps, and
the pooled cosine of compare mode. The columns are the catalogue's console metrics
(`repgeom.probes.core.catalogue.console_metrics`)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd

from repgeom.probes.core import catalogue, table
from repgeom.probes.report import aggregate


def console():
    from rich.console import Console

    return Console(width=max(100, int(os.environ.get("COLUMNS", 120))))


def print_tables(frame: pd.DataFrame, subjects: list) -> None:
    """Per model (the two stacks of an encoder-decoder model are two): the per-layer table of
    its last probe and, for several probes, the trend of the layer means over steps."""
    models = list(dict.fromkeys(s.model for s in subjects))
    for model in models:
        rows = frame
        if len(models) > 1 and "model" in frame.columns:
            rows = frame.loc[frame["model"] == model]
        _print_model(rows, [s for s in subjects if s.model == model])


def _print_model(frame: pd.DataFrame, subjects: list) -> None:
    from rich.table import Table

    out_console = console()
    frame = aggregate.single_set(frame)
    model_rows = frame.loc[table.model_rows(frame)]  # the LM loss: one line below
    frame = table.layer_rows(frame)
    per_layer = aggregate.head_means(frame)
    last = subjects[-1]
    rows = per_layer.loc[per_layer["step"] == last.step]
    shown = [m for m in catalogue.console_metrics() if m in set(rows["metric"])]
    wide = rows.pivot_table(index="layer", columns="metric", values="value")
    out = Table(title=f"{last.label}: {last.kind}, per layer (heads averaged)")
    out.add_column("layer", justify="right")
    for metric in shown:
        out.add_column(metric, justify="right")
    names = rows.drop_duplicates("layer").set_index("layer")["layer_name"]
    for layer, values in wide.iterrows():
        label = "final norm" if names.get(layer) == table.FINAL_NORM else str(layer)
        out.add_row(label, *[_fmt(values.get(m)) for m in shown])
    out_console.print(out)
    now = model_rows.loc[model_rows["step"] == last.step]
    revision = getattr(last, "revision", None)
    if revision and "revision" in now.columns:  # revisions without steps may share a step
        now = now.loc[now["revision"] == revision]
    loss = now.groupby("metric")["value"].last()  # one value per metric, whatever the table
    if "lm_loss" in loss:
        out_console.print(f"LM loss on the probe's windows: {_fmt(loss['lm_loss'])} nats per "
                          f"token, {_fmt(loss.get('bpc'))} bits per character")
    if len(subjects) > 1:
        means = aggregate.layer_means(frame)
        wide = means.pivot_table(index="step", columns="metric", values="value")
        trend = Table(title="mean over blocks 1..L, per step")
        trend.add_column("step", justify="right")
        trend.add_column("checkpoint / revision")
        for metric in shown:
            trend.add_column(metric, justify="right")
        labels = {s.step: s.label for s in subjects}
        for step, values in wide.iterrows():
            trend.add_row(str(step), labels.get(step, ""), *[_fmt(values.get(m)) for m in shown])
        out_console.print(trend)


def print_drift_cosine(correlation: pd.DataFrame) -> None:
    """Godey et al. 2024, §3.3 (Fig. 5) and appendix A (Fig. 16): Spearman and Pearson
    correlation of the drift norm and the mean cosine across blocks 1..L, one row per step and
    model (`repgeom.probes.report.drift_cosine.drift_cosine_correlation`). Nothing when not
    measured."""
    from rich.table import Table

    if correlation is None or correlation.empty:
        return
    out = Table(title="drift norm vs mean cosine, blocks 1..L (Godey 2024 §3.3)")
    ids = ["step"] + [c for c in ("model", "revision") if c in correlation.columns
                      and correlation[c].nunique(dropna=False) > 1]
    for column in (*ids, "blocks", "Spearman rho", "p", "Pearson r", "p"):
        out.add_column(column, justify="left" if column in ("model", "revision") else "right")
    for row in correlation.itertuples(index=False):
        out.add_row(
            *[str(getattr(row, c)) for c in ids], str(row.n_layers),
            _fmt(row.spearman_rho), _fmt(row.spearman_p),
            _fmt(row.pearson_r), _fmt(row.pearson_p),
        )
    console().print(out)


def print_family_shares(shares: pd.DataFrame) -> None:
    """Per layer, the share of label groups each family group wins by log-likelihood
    (`repgeom.analyses.distributions.family_shares`)."""
    from rich.table import Table

    won = shares.query("criterion == 'loglik' and level == 'group'")
    wide = won.pivot_table(index=["layer", "layer_name"], columns="family", values="share")
    out = Table(title=f"share of {int(won['n_groups'].iloc[0])} label groups won (log-likelihood)")
    for column in ("layer", *wide.columns):
        out.add_column(str(column), justify="right")
    for (_, name), row in wide.iterrows():
        out.add_row(str(name), *[f"{v:.2f}" for v in row])
    console().print(out)


def print_compare(subject, pooled: pd.DataFrame) -> None:
    from rich.table import Table

    out = Table(title=f"{subject.label} ({subject.kind}): pooled cosine of text A and text B")
    out.add_column("layer", justify="right")
    out.add_column("pooled cosine", justify="right")
    for row in pooled.itertuples(index=False):
        out.add_row(str(row.layer), f"{row.pooled_cosine:.4f}")
    console().print(out)


def _fmt(value: Any) -> str:
    return "" if value is None or not np.isfinite(value) else f"{value:.4g}"


