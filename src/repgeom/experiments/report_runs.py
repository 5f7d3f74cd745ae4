"""The sweep on disk for the report: its run folders, their configs and the facts they state.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

MASKINGS = ("causal", "bidirectional")


RUN_FOLDER = re.compile(r"^(?P<masking>.+)-seed(?P<seed>\d+)$")
"""Hydra's sweep sub-folder of the preset: ``${masking.name}-seed${seed}``."""


PAPER_VOCAB = 205
"""Characters of the full enwik8 after the cleaning of Razzhigaev et al. 2023, §2.1."""


@dataclass
class Run:
    """One run folder of the sweep: its masking, seed, folder and saved config."""

    masking: str
    seed: int
    path: Path
    config: dict = field(default_factory=dict)


def find_runs(sweep: Path) -> dict[str, list[Run]]:
    """The run folders of a sweep, grouped by masking and sorted by seed.

    A run folder is a sub-folder of `sweep` with a probe table. Its masking and seed come from
    its ``.hydra/config.yaml`` (``masking.name``, ``seed``) where there is one, else from its name
    (``<masking>-seed<k>``; a folder named just ``causal`` is seed 0).

    Raises
    ------
    FileNotFoundError
        When `sweep` is missing or lacks runs of a masking in `MASKINGS`.
    ValueError
        When a folder's masking or seed cannot be told, or two folders share both.
    """
    if not sweep.is_dir():
        raise FileNotFoundError(f"sweep: {sweep} is not a folder")
    runs: dict[str, list[Run]] = {}
    for folder in sorted(p for p in sweep.iterdir() if p.is_dir()):
        if not any((folder / "probes" / f"probes.{ext}").is_file() for ext in ("parquet", "csv")):
            continue
        config_file = folder / ".hydra" / "config.yaml"
        config = yaml.safe_load(config_file.read_text()) if config_file.is_file() else {}
        named = RUN_FOLDER.match(folder.name)
        masking = (config.get("masking") or {}).get("name") or (
            named["masking"] if named else folder.name if folder.name in MASKINGS else None
        )
        seed = config.get("seed", int(named["seed"]) if named else 0 if masking else None)
        if masking is None or seed is None:
            raise ValueError(
                f"{folder}: cannot tell its masking and seed; name it <masking>-seed<k> or keep "
                "its .hydra/config.yaml"
            )
        runs.setdefault(str(masking), []).append(Run(str(masking), int(seed), folder, config))
    missing = [m for m in MASKINGS if m not in runs]
    if missing:
        found = {m: [r.path.name for r in rs] for m, rs in runs.items()}
        raise FileNotFoundError(
            f"{sweep}: no run folder with a probe table for masking {missing} "
            f"(expected <masking>-seed<k>/probes/probes.parquet); found {found or 'none'}"
        )
    for masking, group in runs.items():
        group.sort(key=lambda r: r.seed)
        seen = [r.seed for r in group]
        if len(set(seen)) < len(seen):
            raise ValueError(f"{sweep}: masking {masking!r} has a seed twice: {seen}")
    return runs


def vocab_size(run: Run) -> int | None:
    """``model.vocab_size`` of a run, from its config or the training run's ``hparams.yaml``.

    Hydra's saved config does not hold it (the data module sets it when it builds the
    vocabulary); Lightning's CSV logger saves the resolved one in ``csv/version_*/hparams.yaml``.
    None when no file of the run folder records it.
    """
    size = (run.config.get("model") or {}).get("vocab_size")
    if size is not None:
        return int(size)
    for path in [run.path / "hparams.yaml", *sorted(run.path.glob("csv/version_*/hparams.yaml"))]:
        if path.is_file():
            size = ((yaml.safe_load(path.read_text()) or {}).get("model") or {}).get("vocab_size")
            if size is not None:
                return int(size)
    return None


def _probe_set_used(group: list[Run]) -> dict | None:
    """The probe set a run actually used (``probes/probe_set.json``, written by the callback);
    None for runs written before it existed."""
    path = group[0].path / "probes" / "probe_set.json"
    return json.loads(path.read_text()) if path.exists() else None


def run_facts(runs: dict[str, list[Run]]) -> dict:
    """Model, data, steps, seeds, vocabulary and probe protocol of each masking's runs."""
    facts = {}
    for masking, group in runs.items():
        cfg = group[0].config
        if not cfg:
            raise FileNotFoundError(f"{group[0].path}: no .hydra/config.yaml to read the scale")
        probe = cfg.get("probe") or {}
        settings = probe.get("settings") or {}
        sizes = {vocab_size(r) for r in group}
        facts[masking] = {
            "model": cfg["model"]["name"],
            "layers": cfg["model"]["n_layer"],
            "width": cfg["model"]["n_embd"],
            "data": cfg["data"]["source"],
            "clean": bool(cfg["data"].get("clean", False)),
            "steps": cfg["trainer"]["max_steps"],
            "batch": cfg["data"]["batch_size"],
            "block": cfg["model"]["block_size"],
            "seeds": [r.seed for r in group],
            "vocab": sorted(s for s in sizes if s is not None),
            "n_states": probe.get("n_states"),
            "positions": probe.get("positions_per_window"),
            "used": _probe_set_used(group),
            "state_batch": settings.get("state_batch_size"),
            "accelerator": str(cfg["trainer"].get("accelerator", "cpu")),
            "near_duplicate_threshold": settings.get("near_duplicate_threshold"),
        }
    return facts
