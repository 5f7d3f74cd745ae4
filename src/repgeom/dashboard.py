"""The repgeom W&B dashboard, defined in code.

    repgeom-dashboard --entity E --project P [--dry-run FILE]

Builds a W&B workspace (saved view) with the `wandb-workspaces` package: one section per family
of numbers a run logs (loss and bpc; anisotropy per layer; TwoNN and GRIDE per layer with the
phase peak; attention entropy; Q/K alignment; the interactive profile and layer x step tables of
`repgeom.probes.report.wandb_charts`), runs grouped by masking and seed. Saving needs a W&B login;
``--dry-run FILE`` writes the full specification offline instead: the readable list of sections,
panels and the keys each one plots (`describe`), and W&B's own serialised view spec.

Per-layer plots select their keys with a regular expression (``probe/anisotropy/layer_\\d+``), so
one dashboard serves models of any depth.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repgeom.probes.report import wandb_charts

STEP = "trainer/global_step"
PROBE_STEP = "probe/step"
GROUP_BY = ("masking.name", "seed")
"""Run config keys the runs are grouped by (the resolved Hydra config of every run)."""
ID_METRICS = ("twonn", "gride_k16")


@dataclass(frozen=True)
class Panel:
    """One panel: what it plots, in repgeom's terms (`build_workspace` turns it into W&B's)."""

    kind: str  # "line", "scalar", "table", "lineseries", "heatmap"
    title: str
    x: str | None = None
    y: tuple[str, ...] = ()
    regex: str | None = None  # y keys matching this (full match), for per-layer/per-head plots
    summary: tuple[str, ...] = ()  # run-summary keys (not in the history)
    table: str | None = None  # a table (or chart table) key of the run
    log_x: bool = False


@dataclass(frozen=True)
class Section:
    name: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def _per_layer(metric: str, *, heads: bool = False) -> str:
    return rf"probe/{metric}/layer_\d+" + (r"/head_\d+" if heads else "")


def sections() -> list[Section]:
    """The dashboard's sections, in order."""
    id_panels = []
    for metric in ID_METRICS:
        id_panels.append(
            Panel("line", f"{metric} per layer", x=PROBE_STEP, regex=_per_layer(metric), log_x=True)
        )
    id_panels += [
        Panel("line", "Mean intrinsic dimension (blocks 1..L): expansion, then compression",
              x=PROBE_STEP, y=tuple(f"probe/{m}/mean" for m in ID_METRICS), log_x=True),
        Panel("scalar", "Step of the mean TwoNN peak", summary=("probe_summary/id_peak_step",)),
        Panel("scalar", "Mean TwoNN at its peak", summary=("probe_summary/id_peak_value",)),
    ]  # fmt: skip
    tables = []
    for metric in wandb_charts.PROFILE_METRICS:
        tables.append(Panel("lineseries", f"{metric} by layer, one line per probe",
                            table=f"probe/charts/profile_{metric}_table"))  # fmt: skip
    for metric in wandb_charts.LAYER_STEP_METRICS:
        tables.append(Panel("heatmap", f"{metric}: layer x step",
                            table=f"probe/charts/layer_step_{metric}_table"))  # fmt: skip
        tables.append(Panel("table", f"{metric} table (layer, step, value)",
                            table=f"probe/tables/layer_step_{metric}"))  # fmt: skip
    return [
        Section("Loss and bpc", (
            Panel("line", "Loss", x=STEP, y=("train/loss", "val/loss")),
            Panel("line", "Validation bits per character", x=STEP, y=("val/bpc",)),
            Panel("line", "Learning rate", x=STEP, regex=r"lr-AdamW/.*"),
        )),
        Section("Anisotropy per layer", (
            Panel("line", "Anisotropy per layer", x=PROBE_STEP, regex=_per_layer("anisotropy"),
                  log_x=True),
            Panel("line", "Mean anisotropy (blocks 1..L)", x=PROBE_STEP,
                  y=("probe/anisotropy/mean",), log_x=True),
            Panel("line", "Mean cosine similarity per layer", x=PROBE_STEP,
                  regex=_per_layer("mean_cosine"), log_x=True),
            Panel("scalar", "Most anisotropic layer at the end",
                  summary=("probe_summary/most_anisotropic_layer",)),
        )),
        Section("Intrinsic dimension (TwoNN, GRIDE) per layer", tuple(id_panels)),
        Section("Attention entropy", (
            Panel("line", "Attention entropy per head", x=PROBE_STEP,
                  regex=_per_layer("attention_entropy", heads=True), log_x=True),
            Panel("line", "Mean attention entropy", x=PROBE_STEP,
                  y=("probe/attention_entropy/mean",), log_x=True),
        )),
        Section("Q\u0304/K\u0304 alignment", (
            Panel("line", "Q\u0304/K\u0304 cosine per head", x=PROBE_STEP,
                  regex=_per_layer("qk_cosine", heads=True), log_x=True),
            Panel("line", "Mean Q\u0304/K\u0304 cosine", x=PROBE_STEP, y=("probe/qk_cosine/mean",),
                  log_x=True),
            Panel("line", "Q\u0304/K\u0304 cosine, heads concatenated, per layer (Godey et al. "
                  "Fig. 23)", x=PROBE_STEP, regex=_per_layer("qk_cosine_concat"), log_x=True),
        )),
        Section("Interactive profiles and layer x step maps", tuple(tables)),
    ]  # fmt: skip


def _w_panel(panel: Panel):
    """The `wandb_workspaces` panel of `panel`."""
    import wandb_workspaces.reports.v2 as wr

    if panel.kind == "line":
        kwargs: dict[str, Any] = {"title": panel.title, "x": panel.x or "Step"}
        if panel.regex:
            kwargs["metric_regex"] = f"^{panel.regex}$"
        else:
            kwargs["y"] = list(panel.y)
        if panel.log_x:
            kwargs["log_x"] = True
        return wr.LinePlot(**kwargs)
    if panel.kind == "scalar":
        return wr.ScalarChart(title=panel.title, metric=panel.summary[0])
    if panel.kind == "table":
        return wr.WeavePanelSummaryTable(table_name=panel.table)
    if panel.kind == "lineseries":
        return wr.CustomChart(
            query={"summaryTable": {"tableKey": panel.table}},
            chart_name="wandb/lineseries/v0",
            chart_fields={"step": "step", "lineKey": "lineKey", "lineVal": "lineVal"},
            chart_strings={"title": panel.title, "xname": "layer"},
        )
    if panel.kind == "heatmap":
        return wr.CustomChart(
            query={"summaryTable": {"tableKey": panel.table}},
            chart_name="wandb/confusion_matrix/v1",
            chart_fields={"Actual": "layer", "Predicted": "step", "nPredictions": "value"},
            chart_strings={"title": panel.title},
        )
    raise ValueError(f"panel kind {panel.kind!r} is unknown")


def build_workspace(entity: str, project: str, *, name: str = "repgeom"):
    """The `wandb_workspaces.workspaces.Workspace` of `sections`, runs grouped by `GROUP_BY`."""
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces import expr

    return ws.Workspace(
        entity=entity,
        project=project,
        name=name,
        sections=[
            ws.Section(name=s.name, panels=[_w_panel(p) for p in s.panels], is_open=True)
            for s in sections()
        ],
        runset_settings=ws.RunsetSettings(groupby=[expr.Config(key) for key in GROUP_BY]),
    )


def describe(entity: str, project: str, *, name: str = "repgeom") -> dict[str, Any]:
    """The dashboard as plain data: sections, panels and the keys each plots, and the grouping."""
    return {
        "entity": entity,
        "project": project,
        "name": name,
        "group_by": list(GROUP_BY),
        "sections": [
            {
                "name": s.name,
                "panels": [
                    {k: v for k, v in vars(p).items() if v not in (None, (), False)}
                    for p in s.panels
                ],
            }
            for s in sections()
        ],
    }


def specification(entity: str, project: str, *, name: str = "repgeom") -> dict[str, Any]:
    """`describe` plus W&B's serialised view (``viewspec``): what ``save`` would upload."""
    workspace = build_workspace(entity, project, name=name)
    return {**describe(entity, project, name=name), "viewspec": workspace._spec}


def missing_keys(spec: dict[str, Any], history_keys: set[str], summary_keys: set[str]) -> list[str]:
    """The keys a specification plots that a run does not have, as readable strings.

    A history key counts as present when it was logged or, for a table, when its fields were
    (a ``wandb.Table`` is recorded as ``<key>._type``, ``<key>.path``, ...); a regex must match at
    least one logged key; summary keys are looked up in the run's summary.
    """
    present = set(history_keys) | {k.split(".", 1)[0] for k in history_keys}
    missing = []
    for section in spec["sections"]:
        for panel in section["panels"]:
            where = f"{section['name']} / {panel['title']}"
            keys = [*panel.get("y", ()), *([panel["x"]] if panel.get("x") else [])]
            keys += [panel["table"]] if panel.get("table") else []
            missing += [f"{where}: {k}" for k in keys if k not in present]
            if panel.get("regex") and not any(re.fullmatch(panel["regex"], k) for k in present):
                missing.append(f"{where}: no key matches {panel['regex']}")
            missing += [f"{where}: {k} (summary)" for k in panel.get("summary", ())
                        if k not in summary_keys]  # fmt: skip
    return missing


def write_specification(entity: str, project: str, path: str | Path, *,
                        name: str = "repgeom") -> dict[str, Any]:
    """Write the dashboard's specification to `path` as JSON (saves nothing to W&B)."""
    spec = specification(entity, project, name=name)
    Path(path).write_text(json.dumps(spec, indent=1, ensure_ascii=False))
    return spec
