"""A trajectory spread over jobs: merge the shards' tables into one, as a single job writes it.

``python probe.py -m hf=EleutherAI/pythia-160m hf_revisions=all shard=0,1,2,3 shards=4
hydra/launcher=slurm`` runs every fourth revision per job (`sources.shard_of`), each in its own
folder of the sweep. A shard whose pairwise metrics compare with the final revision, when
another shard owns it, probes that revision for its states only (`sources.subjects`,
``reference``), so every shard's "against the final checkpoint" rows are the single job's.
When the sweep ends, `ShardMergeCallback` (``conf/probe.yaml``, ``hydra.callbacks``) merges
the jobs that differ only in ``shard`` into ``<sweep dir>/merged/`` (one group) or
``merged-<k>/`` (several, e.g. ``hf=a,b``): the table (``probes/probes.csv``), its figures,
``phases.csv``, ``drift_cosine.csv``, ``probe_info.json`` and, with a W&B logger, one W&B run.
By hand::

    repgeom-shards <sweep dir> [--out DIR]
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from repgeom.loggers import is_wandb
from repgeom.models.hf import STACKS
from repgeom.probes.core import table
from repgeom.probes.report import sink
from repgeom.probes.report.survey import INFO_FILE
from repgeom.probes.run import runner
from repgeom.probes.run.job import ProbeJob, probe_job

MERGED = "merged"
"""The merged folder's name inside the sweep folder (``merged-<k>`` for the k-th group)."""
KEYS = ("step", "step_b", "layer", "layer_b", "head", "metric", "model", "revision")
"""Columns that name one row: a row twice in the shards' tables means overlapping shards."""

__all__ = ["MERGED", "ShardMergeCallback", "merge_shards", "merge_sweep", "shard_groups"]


def _info(folder: Path) -> dict[str, Any]:
    return json.loads((folder / INFO_FILE).read_text())


def shard_groups(sweep: str | Path) -> list[list[Path]]:
    """The sweep's shard jobs (``probe_info.json`` with ``shards`` set), grouped by everything
    in their config but ``shard`` and ``output_dir``, each group in shard order and the groups
    in the order of their first folder (``merged-<k>``'s k). The loggers count without the
    ``save_dir`` and ``name`` that resolve to each job's own (`_logger_key`). A record from
    before the written group (no ``logger``) joins the group whose written group, read against
    it, gives that group's key (a shard re-run after the upgrade beside older ones): of several,
    the one that keeps the most settings as values (`_values_kept`); with none, it counts
    without them."""
    groups: dict[str, list[tuple[int, Path]]] = {}
    written_of: dict[str, Any] = {}  # a group's key: its logger group as written
    older = []
    for info_file in sorted(Path(sweep).glob(f"*/{INFO_FILE}")):
        info = _info(info_file.parent)
        config = dict(info.get("config") or {})
        if config.get("shards") is None:
            continue
        shard = int(config.pop("shard"))
        config.pop("output_dir", None)
        if "logger" not in info:
            older.append((config, shard, info_file.parent))
            continue
        key = _group_key(config, info["logger"])
        written_of.setdefault(key, info["logger"])
        groups.setdefault(key, []).append((shard, info_file.parent))
    for config, shard, folder in older:
        matches = [k for k, written in written_of.items() if _group_key(config, written) == k]
        key = max(matches, key=lambda k: _values_kept(written_of[k]),
                  default=_group_key(config, None))
        groups.setdefault(key, []).append((shard, folder))
    ordered = sorted(groups.values(), key=lambda members: min(folder for _, folder in members))
    return [[folder for _, folder in sorted(members)] for members in ordered]


def _group_key(config: dict[str, Any], written: Any) -> str:
    """A shard job's config (without ``shard`` and ``output_dir``) as `shard_groups` compares
    it, its logger group read against `written` (`_logger_key`)."""
    return json.dumps({**config, "logger": _logger_key(config.get("logger"), written)},
                      sort_keys=True, default=str)


def merge_shards(folders: Sequence[Path], out: Path) -> pd.DataFrame:
    """Merge the probe folders of one trajectory's shards into `out`; returns the table.

    Raises
    ------
    ValueError
        A shard missing (``shards=4`` but no folder for shard 2: that job failed; rerun it with
        the same output folder), shards of different ``shards``, or a row in two shards.
    """
    infos = [_info(Path(f)) for f in folders]
    counts = {int(info["config"]["shards"]) for info in infos}
    if len(counts) != 1:
        raise ValueError(f"the folders hold shards of different shards= ({sorted(counts)})")
    (shards,) = counts
    present = sorted(int(info["config"]["shard"]) for info in infos)
    missing = sorted(set(range(shards)) - set(present))
    if missing or len(present) != shards:
        raise ValueError(
            f"shards={shards} but the folders hold shards {present}: shard(s) {missing} missing "
            "or repeated; rerun the missing jobs (same shard=, same output folder) first"
        )
    frame = pd.concat([table.read_table(f) for f in folders], ignore_index=True)
    keys = [k for k in KEYS if k in frame.columns]
    twice = frame.loc[frame.duplicated(keys, keep=False), keys]
    if not twice.empty:
        raise ValueError(f"{len(twice)} rows appear in two shards, e.g. {twice.iloc[0].to_dict()}")
    frame = table.rows_to_frame(frame.sort_values(keys, na_position="first", kind="stable")
                                .reset_index(drop=True))
    out = Path(out)
    table.write_table(frame, table.probe_dir(out))
    subjects = [s for info in infos for s in info["subjects"] if not s.get("reference")]
    stacks = {s.get("stack"): s["model"] for s in subjects}
    # The shards' job, as one job would have run it: this folder, no shard, and a run name.
    config = infos[0]["config"]
    name = config.get("run_name") or f"probe-{subjects[0]['model']}-merged".replace("/", "-")
    job = probe_job(OmegaConf.create({**config, "logger": _merged_logger(infos[0], name),
                                      "output_dir": str(out), "shard": None, "shards": None,
                                      "run_name": name}))
    wanted = job.plot_metrics
    figures = runner.save_figures(frame, stacks, out, None if wanted is None else list(wanted))
    loggers = _wandb_runs(job, frame, stacks)
    runner.summarise(frame, out, loggers)
    info = {**infos[0], "subjects": subjects, "merged_from": [str(f) for f in folders],
            "config": job.config}
    (out / INFO_FILE).write_text(json.dumps(info, indent=2, default=str))
    for run in loggers:
        images = {f"probe/plots/{p.parent.name}/{p.stem}" if p.parent.name in STACKS
                  else f"probe/plots/{p.stem}": p for p in figures}
        _log_images(run, images, int(frame["step"].max()))
        run.finish()
    print(f"Merged {shards} shards ({len(frame)} rows, {frame['step'].nunique()} steps) into "
          f"{out}")
    return frame


def _logger_key(resolved: Any, written: Any) -> Any:
    """The logger group as `shard_groups` compares it: each entry without its ``save_dir`` and
    ``name`` unless the written group (`written`, ``probe_info.json``'s ``logger``) holds them
    as plain values: interpolated (``${output_dir}``, ``${run_name}``), they resolve to each
    job's own folder and run name, and a record from before the written group, or an entry
    written as one interpolation, does not say. A plain value counts:
    ``logger.wandb.name=a,b`` with shards makes two groups."""
    if not isinstance(resolved, dict):
        return resolved
    key = {}
    for group, entry in resolved.items():
        if not isinstance(entry, dict):
            key[group] = entry
            continue
        as_written = _written_entry(written, group) or {}
        key[group] = {k: v for k, v in entry.items()
                      if k not in _OWN or (k in as_written and _is_value(as_written[k]))}
    return key


def _written_entry(written: Any, group: str) -> dict[str, Any] | None:
    """One logger's settings as written; None where they are not written out one by one (a
    record from before the written group, or the whole entry one interpolation)."""
    entry = written.get(group) if isinstance(written, dict) else None
    return entry if isinstance(entry, dict) else None


def _values_kept(written: Any) -> int:
    """How many ``save_dir``/``name`` settings the logger group `written` holds as values: of
    two groups an older record matches, the one keyed on more of them is the closer match."""
    groups = written if isinstance(written, dict) else {}
    entries = [_written_entry(written, group) or {} for group in groups]
    return sum(field in _OWN and _is_value(value)
               for entry in entries for field, value in entry.items())


def _is_value(value: Any) -> bool:
    """A setting written as a value, not an interpolation."""
    return not (isinstance(value, str) and "${" in value)


_OWN = ("save_dir", "name")
"""Logger settings that resolve to each shard job's own folder or run name."""
_MERGED_KEYS = re.compile(r"\$\{(?!(?:output_dir|run_name|tags)\})")
"""An interpolation other than ``${output_dir}``, ``${run_name}`` and ``${tags}``."""


def _merged_logger(info: dict[str, Any], name: str) -> dict[str, Any]:
    """The merged job's logger group: the first shard's, as it resolved, but with every setting
    written as ``${output_dir}``/``${run_name}`` (``probe_info.json``'s ``logger``, as written)
    read against the merged job, so its W&B run lives in the merged folder under its name.
    Settings written with another interpolation (``${hydra:...}``, ``${now:...}``) keep the
    shard's value: the merge has no Hydra context to resolve them again. A logger whose
    settings are not written out one by one (a record from before the written group was kept,
    or an entry written as one interpolation) drops ``save_dir`` (W&B then writes into the
    merged folder, `repgeom.loggers.run_folder`), and its W&B run takes `name`."""
    resolved = (info.get("config") or {}).get("logger") or {}
    written = info.get("logger")
    merged = {}
    for key, entry in resolved.items():
        if not isinstance(entry, dict):
            merged[key] = entry
            continue
        entry = dict(entry)
        as_written = _written_entry(written, key)
        if as_written is None:
            entry["save_dir"] = None
            if is_wandb(entry):
                entry["name"] = name
        else:
            for field, value in as_written.items():
                if not _is_value(value):
                    entry[field] = (value if _MERGED_KEYS.search(value) is None
                                    else None if field == "save_dir" else entry.get(field))
        merged[key] = entry
    return merged


def _wandb_runs(job: ProbeJob, frame: pd.DataFrame, stacks: dict) -> list:
    """The merged table in one W&B run (when the jobs logged to W&B), step by step."""
    runs = runner._wandb_runs(job, [])
    stack_of = {model: stack for stack, model in stacks.items()}
    for (model, step), part in frame.groupby(["model", "step"], dropna=False):
        sink.log_scalars(runs, int(step), part, {},
                         prefix=runner._wandb_prefix(stack_of.get(model)))
    return runs


def _log_images(run: Any, images: dict[str, Path], step: int) -> None:
    import wandb

    if images:
        run.log({**{k: wandb.Image(str(p)) for k, p in images.items()}, "probe/step": step})


class ShardMergeCallback(Callback):
    """Hydra callback of ``probe.py -m ... shard=... shards=N``: when the sweep ends, merge each
    trajectory's shards (`merge_shards`) into ``<sweep dir>/merged`` (``merged-<k>`` when the
    sweep holds several trajectories)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(str(config.hydra.sweep.dir))
        groups = shard_groups(sweep)
        for k, folders in enumerate(groups):
            merge_shards(folders, sweep / (MERGED if len(groups) == 1 else f"{MERGED}-{k}"))


def merge_sweep(sweep: str | Path, out: str | Path | None = None) -> pd.DataFrame:
    """Merge the shard jobs of the sweep folder `sweep` (its jobs are 0/, 1/, ...): into `out`,
    or ``<sweep>/merged`` (one trajectory) / ``<sweep>/merged-<k>`` (several); returns the last
    merged table.

    Raises
    ------
    ValueError
        When `sweep` holds no shard jobs, or `out` is given for several trajectories.
    """
    sweep = Path(sweep)
    groups = shard_groups(sweep)
    if not groups:
        raise ValueError(f"{sweep} holds no shard jobs (probe_info.json with shards set)")
    if len(groups) > 1 and out is not None:
        raise ValueError(f"{sweep} holds {len(groups)} trajectories; leave out unset")
    frame = None
    for k, folders in enumerate(groups):
        default = sweep / (MERGED if len(groups) == 1 else f"{MERGED}-{k}")
        frame = merge_shards(folders, out or default)
    return frame
