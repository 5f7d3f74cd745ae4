"""`ProbeJob`: what one ``probe.py`` command asks, read from its config once and checked.

`probe_job` is the one function that reads ``conf/probe.yaml``'s options (a Hydra DictConfig,
or any mapping with its keys): it checks every one of them, naming the option and the fix, and
returns a frozen `ProbeJob` whose fields carry the config keys' names. `runner.probe` and
everything below it (the targets, compare mode, the trajectory, W&B, ``probe_info.json``, the
analyses' extras) take the job, or the parts of it they need, never the config; so does
`runner.follow_job`, the probe worker of a ``follow=`` job::

    job = probe_job(cfg)      # every option checked here, before any work
    runner.follow_job(job) if job.mode == FOLLOW else runner.probe(job)

The probe options proper (the probe set, metrics, estimator settings, texts) are the job's
`ProbeRequest` (`repgeom.probes.core.spec`); ``None`` in it is "as the checkpoint's training
probe, else the default" (`spec.resolve`), so each default stays written once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from repgeom.models.checkpoints import resolve_device
from repgeom.models.hub.calls import RETRY_BUDGET_S
from repgeom.probes.core import catalogue
from repgeom.probes.core.spec import ProbeRequest, resolve
from repgeom.probes.run import schedule

MODES = ("run", "ckpt", "hf")
"""The three ways to name what is probed (exactly one per job, or ``follow=``)."""
FOLLOW = "follow"
"""The mode of ``follow=<run folder>``: the probe worker of a run trained with probe.offload."""

__all__ = ["FOLLOW", "MODES", "CompareTexts", "Labels", "ProbeJob", "probe_job",
           "probe_request"]


@dataclass(frozen=True)
class CompareTexts:
    """``compare.text_a`` and ``compare.text_b``: compare mode's two texts (both non-empty)."""

    text_a: str
    text_b: str


@dataclass(frozen=True)
class Labels:
    """``labels.csv`` (None: no label-group fits) and ``labels.group_by``."""

    csv: Path | None = None
    group_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProbeJob:
    """One ``probe.py`` command, checked (`probe_job`); the fields are the config's keys.

    mode : ``run``, ``ckpt``, ``hf`` (the one of the three given) or ``follow``
    run, ckpt, hf : what is probed (the one named by `mode`; the others None)
    request : the probe options (`ProbeRequest`: probe set, metrics, settings, texts)
    hf_revisions : ``"all"``, a tuple of revision names, or None (the default revision)
    max_revisions, shard, shards : `schedule.thin_steps` and `sources.shard_of`
    tokenizer, dtype, model_name : an HF model's tokenizer, weights dtype; the table's ``model``
    work_dir, keep_weights, retry_skipped, retry_budget_s : the trajectory's downloads,
        skipped steps and hub retry budget (seconds per revision)
    compare : the two texts of compare mode, or None
    labels : `Labels` (``labels.csv``, ``labels.group_by``)
    qk_projection : ``run=`` only: the Q/K projection figures (an extra of the analyses)
    plot_metrics : the metrics to draw (None: all; ``()``: none)
    output_dir : the run folder, absolute
    device : resolved (``auto``: CUDA when available)
    follow, follow_timeout_s, keep_snapshots, follow_lock : ``follow=``'s worker options
    run_name, tags, logger : W&B; `logger` is the config's ``logger`` group as written (its
        ``${run_name}``, ``${tags}``, ``${output_dir}`` are read against the job's `config`)
    config : the whole config, resolved, as ``probe_info.json`` and W&B record it
    """

    mode: str
    request: ProbeRequest
    output_dir: Path
    device: torch.device
    run: str | None = None
    ckpt: str | None = None
    hf: str | None = None
    hf_revisions: str | tuple[str, ...] | None = None
    max_revisions: int | None = None
    shard: int | None = None
    shards: int | None = None
    tokenizer: str | None = None
    dtype: str | None = None
    model_name: str | None = None
    work_dir: Path | None = None
    keep_weights: bool = False
    retry_skipped: bool = False
    retry_budget_s: float = RETRY_BUDGET_S
    compare: CompareTexts | None = None
    labels: Labels = field(default_factory=Labels)
    qk_projection: bool = False
    plot_metrics: tuple[str, ...] | None = None
    follow: str | None = None
    follow_timeout_s: float = 600.0
    keep_snapshots: bool = False
    follow_lock: str = "auto"
    run_name: str | None = None
    tags: tuple[str, ...] = ()
    logger: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def protocol(self) -> str:
        """The protocol that makes the numbers (``conf/protocol/``): repgeom or llm_microscope."""
        return self.request.protocol or "repgeom"

    @property
    def pairwise(self) -> bool:
        """A metric of the job compares each step with the final one (linear CKA, mutual
        k-NN, linearity: `catalogue.PAIR_NAMES`): the final step is probed first, and every
        shard probes it as a reference."""
        return bool(catalogue.select(resolve(self.request).probe_settings()).pairs)


def probe_request(cfg: Any) -> ProbeRequest:
    """probe.py's probe options (`ProbeRequest`), every field by its name, absent keys as the
    field's default; `ProbeRequest` checks them."""
    given = {f.name: cfg.get(f.name) for f in dataclasses.fields(ProbeRequest)
             if cfg.get(f.name) is not None}
    if "metrics" in given:
        given["metrics"] = tuple(str(m) for m in given["metrics"])
    given["settings"] = {str(k): v for k, v in dict(given.get("settings") or {}).items()
                         if v is not None}
    if "text_file" in given:
        given["text_file"] = str(given["text_file"])
    return ProbeRequest(**given)


def _given(value: Any) -> bool:
    return value not in (None, "")


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _retry_budget(value: Any) -> float:
    """``retry_budget_s``: seconds of hub retries allowed per revision (default 15 minutes)."""
    if value is None:
        return RETRY_BUDGET_S
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"retry_budget_s must be a number of seconds >= 0 (0: no retries), "
                         f"got {value!r}")
    return float(value)


def _mode(cfg: Any) -> str:
    """The one of run= / ckpt= / hf= given (or follow=); a ValueError otherwise."""
    given = [m for m in MODES if _given(cfg.get(m))]
    if _given(cfg.get(FOLLOW)):
        if given:
            raise ValueError(
                f"follow= probes a training run's snapshots as they appear and takes none of "
                f"run=/ckpt=/hf= (got {', '.join(given)}); run them as separate probe.py commands"
            )
        return FOLLOW
    if len(given) != 1:
        got = ", ".join(f"{m}={cfg.get(m)}" for m in given) or "none"
        raise ValueError(
            f"give exactly one of run=<train run folder>, ckpt=<file.ckpt> or hf=<hub name or "
            f"folder> (got {got}); e.g. python probe.py ckpt=outputs/.../checkpoints/last.ckpt "
            "(or follow=<run folder> for the worker of a run trained with probe.offload)"
        )
    return given[0]


def _compare(cfg: Any, mode: str) -> CompareTexts | None:
    compare = cfg.get("compare") or {}
    texts = [compare.get("text_a"), compare.get("text_b")]
    if all(t is None for t in texts):
        return None
    if any(t is None or t == "" for t in texts):
        raise ValueError("compare needs both compare.text_a=... and compare.text_b=... (non-empty)")
    if mode == "run":
        raise ValueError(
            "compare takes ckpt= or hf=, not run=; pick one checkpoint, e.g. "
            "ckpt=<run>/checkpoints/last.ckpt"
        )
    return CompareTexts(str(texts[0]), str(texts[1]))


def _labels(cfg: Any, mode: str) -> Labels:
    labels = cfg.get("labels") or {}
    group_by = tuple(str(c) for c in labels.get("group_by") or [])
    if not labels.get("csv"):
        return Labels(None, group_by)
    if mode == "run" or cfg.get("hf_revisions"):
        raise ValueError(
            "labels.csv fits the distributions of one model: give ckpt=<file.ckpt> or "
            f"hf=<name> without hf_revisions (got {mode}=)"
        )
    csv = Path(str(labels.get("csv"))).expanduser()
    if not csv.is_file():
        raise FileNotFoundError(
            f"labels.csv={labels.get('csv')} does not exist; give a CSV with a 'text' column and "
            "label columns (e.g. data/examples/subject_attribute.csv)"
        )
    return Labels(csv, group_by)


def _plain(value: Any) -> Any:
    """A config node as plain Python (lists and dicts), a plain value as it is."""
    if isinstance(value, DictConfig) or OmegaConf.is_list(value):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _common(cfg: Any) -> dict[str, Any]:
    """What every job has: its folder and device, and what W&B and ``probe_info.json`` record."""
    logger = cfg.get("logger") or {}
    return {
        "output_dir": Path(str(cfg.get("output_dir"))).expanduser().resolve(),
        "run_name": _str(cfg.get("run_name")),
        "tags": tuple(str(t) for t in cfg.get("tags") or ()),
        "logger": (OmegaConf.to_container(logger, resolve=False)
                   if isinstance(logger, DictConfig) else dict(logger)),
        "config": _plain(cfg) if isinstance(cfg, DictConfig) else dict(cfg),
        "device": resolve_device(cfg.get("device")),  # last: the one call below this layer
    }


def probe_job(cfg: Any) -> ProbeJob:
    """The job `cfg` (``conf/probe.yaml``, composed by Hydra) asks for, every option checked.

    Raises
    ------
    ValueError
        Not exactly one of run= / ckpt= / hf= (or follow= with one of them); hf_revisions= or
        tokenizer= without hf=; a bad hf_revisions / max_revisions / shard / shards
        (`schedule.check_options`, `schedule.check_shard`); one compare text alone, or compare
        with run=; labels.csv with run= or hf_revisions; qk_projection without run=; a bad
        retry_budget_s; a bad probe option (`ProbeRequest`).
    FileNotFoundError
        ``labels.csv`` names no file.
    """
    mode = _mode(cfg)
    fields = _follow_fields(cfg) if mode == FOLLOW else _probe_fields(cfg, mode)
    return ProbeJob(mode, **fields, **_common(cfg))


def _follow_fields(cfg: Any) -> dict[str, Any]:
    """follow=: the training probe's spec; probe.py's own probe options do not apply."""
    return {"request": ProbeRequest(), "follow": str(cfg.get(FOLLOW)),
            "follow_timeout_s": float(cfg.get("follow_timeout_s") or 600.0),
            "keep_snapshots": bool(cfg.get("keep_snapshots")),
            "follow_lock": str(cfg.get("follow_lock") or "auto")}


def _probe_fields(cfg: Any, mode: str) -> dict[str, Any]:
    """run= / ckpt= / hf=: every option of a probe, checked."""
    for key in ("hf_revisions", "tokenizer"):
        if cfg.get(key) and mode != "hf":
            raise ValueError(f"{key}= needs hf=<name>; got {mode}=")
    hf_revisions, max_revisions = _plain(cfg.get("hf_revisions")), cfg.get("max_revisions")
    schedule.check_options(hf_revisions, max_revisions, mode)
    shard, shards = cfg.get("shard"), cfg.get("shards")
    schedule.check_shard(shard, shards, mode)
    compare = _compare(cfg, mode)
    labels = _labels(cfg, mode)
    if cfg.get("qk_projection") and mode != "run":
        raise ValueError(
            f"qk_projection=true draws a trajectory and needs run=<train run folder>, got {mode}=; "
            "or leave qk_projection=false"
        )
    retry_budget_s = _retry_budget(cfg.get("retry_budget_s"))
    request = probe_request(cfg)  # the probe options, read (and checked) once
    work_dir, plot_metrics = cfg.get("work_dir"), cfg.get("plot_metrics")
    return {
        "request": request,
        **{m: _str(cfg.get(m)) if m == mode else None for m in MODES},
        "hf_revisions": (tuple(str(r) for r in hf_revisions) if isinstance(hf_revisions, list)
                         else hf_revisions),
        "max_revisions": max_revisions, "shard": shard, "shards": shards,
        "tokenizer": _str(cfg.get("tokenizer")), "dtype": _str(cfg.get("dtype")),
        "model_name": _str(cfg.get("model_name")),
        "work_dir": None if work_dir is None else Path(str(work_dir)),
        "keep_weights": bool(cfg.get("keep_weights")),
        "retry_skipped": bool(cfg.get("retry_skipped")),
        "retry_budget_s": retry_budget_s, "compare": compare, "labels": labels,
        "qk_projection": bool(cfg.get("qk_projection")),
        "plot_metrics": None if plot_metrics is None else tuple(str(m) for m in plot_metrics),
    }
