"""Read what a W&B offline run logged back from its run folder, as a user's tools would."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path


def wandb_records(run_dir: Path, record_type: str) -> list[dict]:
    """The records of one type ("history", "config", "run", ...) of the offline run in
    `run_dir`, in order: `wandb leet inspect --json` prints the records of its .wandb file."""
    exe = shutil.which("wandb", path=str(Path(sys.executable).parent)) or "wandb"
    out = subprocess.run(
        [exe, "leet", "inspect", "--json", str(run_dir)], capture_output=True, text=True, check=True
    ).stdout
    records = (json.loads(line) for line in out.splitlines() if line.startswith("{"))
    return [record[record_type] for record in records if record.get("type") == record_type]


def wandb_history(run_dir: Path) -> list[dict]:
    """History rows (dicts of logged key -> value) of the offline run in `run_dir`."""
    return [record["item"] for record in wandb_records(run_dir, "history")]


def wandb_config(run_dir: Path) -> dict:
    """The run's config (every `config` record merged)."""
    config: dict = {}
    for record in wandb_records(run_dir, "config"):
        config.update(record.get("update", {}))
    return config


def logged_keys(run_dir: Path) -> set[str]:
    """Every key that appears in at least one history row."""
    return {key for row in wandb_history(run_dir) for key in row}
