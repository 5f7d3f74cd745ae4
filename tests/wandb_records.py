"""Read what a W&B offline run logged back from its run folder, as a user's tools would."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path


def wandb_history(run_dir: Path) -> list[dict]:
    """History rows (dicts of logged key -> value) of the offline run in `run_dir`.

    Uses `wandb leet inspect --json`, which prints the records of the run's .wandb file.
    """
    exe = shutil.which("wandb", path=str(Path(sys.executable).parent)) or "wandb"
    out = subprocess.run(
        [exe, "leet", "inspect", "--json", str(run_dir)], capture_output=True, text=True, check=True
    ).stdout
    rows = []
    for line in out.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("type") == "history":
                rows.append(record["history"]["item"])
    return rows


def logged_keys(run_dir: Path) -> set[str]:
    """Every key that appears in at least one history row."""
    return {key for row in wandb_history(run_dir) for key in row}
