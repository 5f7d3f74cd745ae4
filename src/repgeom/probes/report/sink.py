"""Where one probe step's numbers go, for the training callback and probe.py alike: the tidy
table on disk, the W&B scalars, and the figures (files and W&B images)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from repgeom.probes.core import table
from repgeom.probes.report import aggregate, plots, wandb_charts


def wandb_scalars(frame: pd.DataFrame, *, prefix: str = "probe") -> dict[str, float]:
    """The W&B keys of one probe step: ``probe/<metric>/layer_<ii>[/head_<hh>]`` and the layer
    means ``probe/<metric>/mean`` (`aggregate.layer_means`); pairwise metrics as
    ``probe/<metric>/layer_<ii>/layer_<jj>`` (two layers), ``probe/<metric>_vs_final/layer_<ii>``
    (a step against the final one) and ``probe/<metric>_vs_<run_b>/layer_<ii>`` (two runs);
    rows of the whole model (``lm_loss``, ``bpc``: `table.MODEL_METRICS`) as ``probe/<metric>``.

    `prefix` replaces ``probe``: ``probe/encoder`` and ``probe/decoder`` keep the two stacks of
    an encoder-decoder model, probed at the same step, apart.

    >>> frame = pd.DataFrame({"step": [0], "layer": [1], "layer_name": ["block_1"], "head": [-1],
    ...                       "metric": ["anisotropy"], "value": [0.5]})
    >>> wandb_scalars(frame, prefix="probe/encoder")
    {'probe/encoder/anisotropy/layer_01': 0.5, 'probe/encoder/anisotropy/mean': 0.5}
    """
    return {prefix + key.removeprefix("probe"): value for key, value in _scalars(frame).items()}


def _scalars(frame: pd.DataFrame) -> dict[str, float]:
    scalars: dict[str, float] = {}
    pairs = aggregate.pair_rows(frame)
    for row in aggregate.single_set(frame).itertuples(index=False):
        if row.metric in table.MODEL_METRICS:  # the model's own rows (the LM loss)
            scalars[f"probe/{row.metric}"] = row.value
            continue
        key = f"probe/{row.metric}/layer_{row.layer:02d}"
        if row.head >= 0:
            key += f"/head_{row.head:02d}"
        scalars[key] = row.value
    for row in frame.loc[pairs].to_dict("records"):
        if row.get("run_b"):
            key = f"probe/{row['metric']}_vs_{row['run_b']}/layer_{row['layer']:02d}"
        elif row.get("step_b", -1) >= 0:
            key = f"probe/{row['metric']}_vs_final/layer_{row['layer']:02d}"
        else:
            key = f"probe/{row['metric']}/layer_{row['layer']:02d}/layer_{row['layer_b']:02d}"
        scalars[key] = row["value"]
    for row in aggregate.layer_means(table.layer_rows(frame)).itertuples(index=False):
        scalars[f"probe/{row.metric}/mean"] = row.value
    return scalars


def write_step(run_dir: str | os.PathLike, rows: list[dict], *, texts: str = "real"
               ) -> pd.DataFrame:
    """Add one probe step's rows to ``<run_dir>/probes/probes.{parquet,csv}``; the whole table.

    `texts` (``real`` or ``shuffled``: the probe set's, `ProbeSet.texts`) goes into each row's
    ``texts`` column where not ``real`` (`table.TEXTS_COLUMN`); a table of the other texts is
    refused (`table.append_rows`)."""
    if texts != "real":
        rows = [{**row, table.TEXTS_COLUMN: texts} for row in rows]
    return table.append_rows(table.probe_dir(run_dir), rows)


def prepare_wandb_run(run: Any, config: Mapping[str, Any]) -> None:
    """A W&B run ready for the probe's scalars: every ``probe/*`` key plotted against
    ``probe/step`` (the training step or revision step), and `config` in the run's config (the
    training callback and probe.py alike)."""
    run.define_metric("probe/step")
    run.define_metric("probe/*", step_metric="probe/step")
    run.config.update(dict(config), allow_val_change=True)


def log_scalars(
    runs: Iterable,
    step: int,
    frame: pd.DataFrame,
    extra: Mapping[str, Any],
    *,
    prefix: str = "probe",
) -> None:
    """Log one probe step's scalars (`wandb_scalars` with `prefix`) to every W&B run, on the
    ``probe/step`` axis."""
    scalars = {"probe/step": step, **extra, **wandb_scalars(frame, prefix=prefix)}
    for run in runs:
        wandb_charts.define_summaries(run, scalars)  # per-layer peak ID, final anisotropy
        run.log(scalars)


def figures(
    runs: Iterable,
    frame: pd.DataFrame,
    run_dir: str | os.PathLike,
    step: int,
    *,
    metrics: list[str] | None = None,
    interactive: bool = True,
) -> list[Path]:
    """Draw the standard figures into ``<run_dir>/probes/plots`` and log them to W&B."""
    paths = plots.save_figures(frame, table.plot_dir(run_dir), metrics=metrics)
    runs = list(runs)
    if runs:
        import wandb

        images = {f"probe/plots/{p.stem}": wandb.Image(str(p)) for p in paths}
        charts = wandb_charts.charts(aggregate.single_set(frame)) if interactive else {}
        for run in runs:
            run.log({**images, **charts, "probe/step": step})
    return paths
