"""Layer profiles of several models on one relative-depth axis: a survey across models.

Razzhigaev et al. 2023 (Fig. 1) and the GPT-2 anisotropy post (papers/000) lay the anisotropy
and intrinsic-dimension profiles of many encoders and decoders of different depths side by side.
Each model is probed on its own (``probe.py``, one folder per model); the survey reads the
finished folders and draws, per metric, one figure with one line per model against relative
depth: 0 = the embedding, 1 = the last block (layer / L). The final norm's output, where a model
has one, is drawn apart, as an open marker right of depth 1 joined by a dotted segment, as in
every layer profile; decoders are solid lines, encoders dashed (`plots.survey_profile`).

One command probes and surveys (a Hydra multirun; `SurveyCallback` draws the survey when the
sweep ends, in ``<sweep dir>/survey/``)::

    python probe.py -m hf=gpt2,bert-base-uncased,EleutherAI/pythia-160m

or, on probe folders that already exist (a sweep folder stands for every probe folder in it)::

    repgeom-survey outputs/probe/a outputs/probe/b --out survey/ \\
        --metrics anisotropy twonn

Why folders and not a list in one process: each model keeps its own complete probe folder
(table, figures, console summary, ``probe_info.json``), only one model is in memory at a time,
``hf_revisions`` keeps its meaning (revisions of one model), the models of a survey can be ours
and Hugging Face's alike, and a survey can be redrawn or extended without probing again.

Written to the output folder: ``survey.csv`` (the rows drawn: ``model``, ``kind``, ``step``,
``layer``, ``layer_name``, ``depth`` (NaN for the final norm), ``metric``, ``value``, ``std``),
``survey_<metric>.png`` per metric, and ``drift_cosine.csv``, Godey et al.'s drift/cosine
correlation per model (`repgeom.probes.report.drift_cosine`). A folder with several steps (a
trajectory, or
revisions) contributes its last step.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from repgeom.probes.core import catalogue, table
from repgeom.probes.report import aggregate
from repgeom.probes.report.drift_cosine import save_drift_cosine
from repgeom.probes.report.plots import DPI, survey_profile

INFO_FILE = "probe_info.json"
"""What probe.py writes beside its table: the subjects with their kind (encoder or decoder)."""
OUT_DIR = "survey"
"""The survey's folder inside a sweep folder (`SurveyCallback`, and the CLI's default)."""

__all__ = ["SurveyCallback", "probe_folders", "save_survey", "survey", "survey_table"]


def probe_folders(paths: Iterable[str | Path]) -> list[Path]:
    """The probe.py output folders named by `paths`: a folder with ``probe_info.json`` is one;
    any other folder stands for its sub-folders that have one (a multirun sweep: ``0/``, ``1/``,
    ... in number order).

    Raises
    ------
    FileNotFoundError
        Naming the path, when it does not exist or holds no probe folder.
    """
    found: list[Path] = []
    for path in map(Path, paths):
        if (path / INFO_FILE).is_file():
            found.append(path)
            continue
        if not path.is_dir():
            raise FileNotFoundError(f"{path}: no such folder (give probe.py output folders)")
        inner = [p.parent for p in path.glob(f"*/{INFO_FILE}")]
        if not inner:
            raise FileNotFoundError(
                f"{path}: not a probe.py output folder (no {INFO_FILE}) and none of its "
                "sub-folders is one; give the folders probe.py printed ('Probe outputs: ...')"
            )
        found += sorted(inner, key=lambda p: (0, int(p.name), "") if p.name.isdigit()
                        else (1, 0, p.name))
    return found


def _kinds(folder: Path) -> dict[str, str]:
    """{model: "decoder" / "encoder"} of the subjects in `folder`'s ``probe_info.json``."""
    info = json.loads((folder / INFO_FILE).read_text())
    return {str(s["model"]): s.get("kind") or "unknown" for s in info.get("subjects", [])}


def _relative_depth(rows: pd.DataFrame) -> pd.Series:
    """layer / L, L the last block; NaN at the final norm's layer and the model's own rows
    (the LM loss, `table.model_rows`)."""
    blocks = (rows["layer_name"] != table.FINAL_NORM) & ~table.model_rows(rows)
    last = rows.loc[blocks, "layer"].max()
    if pd.isna(last) or last < 1:
        raise ValueError(f"model {rows['model'].iloc[0]!r}: no block layers in its table")
    return (rows["layer"] / last).where(blocks)


def survey_table(folders: Sequence[str | Path]) -> pd.DataFrame:
    """The per-layer rows (heads averaged) of every model in `folders`, at its last step, with
    its ``kind`` and relative ``depth``.

    Raises
    ------
    ValueError
        When two folders hold the same model (its lines would be drawn twice).
    """
    parts = []
    seen: dict[str, Path] = {}
    for folder in map(Path, folders):
        frame = aggregate.head_means(aggregate.single_set(table.read_table(folder)))
        if "model" not in frame.columns:
            raise ValueError(f"{folder}: the table has no 'model' column; probe it with probe.py")
        kinds = _kinds(folder)
        for model, rows in frame.groupby("model", sort=False):
            if model in seen:
                raise ValueError(
                    f"model {model!r} is in {seen[model]} and in {folder}: give each model once"
                )
            seen[model] = folder
            rows = rows.loc[rows["step"] == rows["step"].max()].copy()
            rows["kind"] = kinds.get(str(model), "unknown")
            rows["depth"] = _relative_depth(rows)
            parts.append(rows)
    if not parts:
        raise ValueError("no probe tables to survey")
    out = pd.concat(parts, ignore_index=True)
    first = ["model", "kind", "step", "layer", "layer_name", "depth", "metric", "value", "std"]
    rest = [c for c in out.columns if c not in first and c != "head"]
    return out[first + rest]


def default_metrics(frame: pd.DataFrame) -> list[str]:
    """The metrics of `frame` whose catalogue entry draws a layer profile, in table order."""
    return [m for m in pd.unique(frame["metric"]) if "profile" in catalogue.figures(m)]


def save_survey(
    folders: Sequence[str | Path],
    out: str | Path,
    *,
    metrics: Sequence[str] | None = None,
    skip_missing: bool = False,
) -> list[Path]:
    """Write ``survey.csv``, ``drift_cosine.csv`` and ``survey_<metric>.png`` for `metrics`
    (default: `default_metrics`) to `out`; return the paths of the figures.

    Raises
    ------
    ValueError
        When a requested metric is in none of the tables (naming those present), unless
        `skip_missing` (the sweep's callback: ``plot_metrics`` may name what was not probed).
    """
    frame = survey_table(folders)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "survey.csv", index=False)
    save_drift_cosine(frame.drop(columns=["kind", "depth"]), out)
    wanted = default_metrics(frame) if metrics is None else list(metrics)
    if skip_missing:
        wanted = [m for m in wanted if m in set(frame["metric"])]
    paths = []
    for metric in wanted:
        fig = survey_profile(frame, metric)
        path = out / f"survey_{metric}.png"
        fig.savefig(path, dpi=DPI, facecolor="white", bbox_inches="tight")
        fig.clear()
        paths.append(path)
    return paths


def _whole(folder: Path) -> bool:
    """False for one shard of a trajectory (``shards=``; `repgeom.probes.run.shards` merges
    them)."""
    info = json.loads((folder / INFO_FILE).read_text())
    return (info.get("config") or {}).get("shards") is None


class SurveyCallback(Callback):
    """Hydra callback of ``probe.py -m``: when the sweep ends, survey its probe folders into
    ``<sweep dir>/survey/`` (``conf/probe.yaml``, ``hydra.callbacks``). A sweep of one model, or
    one whose jobs wrote no table, is left as it is."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(str(config.hydra.sweep.dir))
        if not any(sweep.glob(f"*/{INFO_FILE}")):
            return
        folders = [f for f in probe_folders([sweep]) if table.probe_dir(f).is_dir()
                   and _whole(f)]  # a trajectory's shards count once: their merged folder
        if len(folders) < 2:
            return
        wanted = config.get("plot_metrics")
        paths = save_survey(folders, sweep / OUT_DIR,
                            metrics=None if wanted is None else [str(m) for m in wanted],
                            skip_missing=True)
        print(f"Survey of {len(folders)} probe folders: {sweep / OUT_DIR} ({len(paths)} figures)")


def survey(folders: Sequence[str | Path], out: str | Path | None = None, *,
           metrics: Sequence[str] | None = None) -> list[Path]:
    """`save_survey` of the probe folders in `folders` (or the sweep folders holding them) to
    `out` (default ``<FOLDER>/survey`` for one folder); returns the figures' paths.

    Raises
    ------
    ValueError
        When `out` is None and several folders are given.
    """
    folders = [Path(f) for f in folders]
    if out is None:
        if len(folders) > 1:
            raise ValueError("out is needed with several folders")
        out = folders[0] / OUT_DIR
    out = Path(out)
    found = probe_folders(folders)
    paths = save_survey(found, out, metrics=metrics)
    print(f"wrote {out / 'survey.csv'} and {len(paths)} figures of {len(found)} probe folders")
    return paths
