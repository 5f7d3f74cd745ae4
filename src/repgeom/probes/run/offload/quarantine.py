"""Snapshots that cannot be probed (docs/probing.md, "Quarantine"): a complete snapshot whose
marker is malformed, or whose files cannot be read or loaded, and that did not change while it
was read (`generation`), is broken for good; the worker records it in ``worker.json``, warns once
and skips it, and ``probes/skipped.json`` (`write_skipped`, the format of
`repgeom.probes.run.trajectory`'s) names every step without probe rows and why. A new generation
(the trainer's rewrite, a repaired file) is tried again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from repgeom.files import atomic_write_text
from repgeom.probes.core import table
from repgeom.probes.run.offload.layout import COMPLETE, WEIGHTS, snapshot_time

SKIPPED = "skipped.json"


def generation(path: Path) -> str:
    """What names the snapshot in `path` as it is now: its marker's time, and the inode, size,
    mtime and ctime of its two files ("-" for one missing)."""
    parts = [str(snapshot_time(path))]
    for name in (COMPLETE, WEIGHTS):
        try:
            info = os.stat(path / name)
        except OSError:
            parts.append("-")
            continue
        parts.append(f"{info.st_ino}:{info.st_size}:{info.st_mtime_ns}:{info.st_ctime_ns}")
    return "|".join(parts)


def write_skipped(run_dir: Path, steps: dict[int, dict[str, Any]]) -> None:
    """``probes/skipped.json``: step -> why it has no probe rows (empty: no such step)."""
    folder = table.probe_dir(run_dir)
    path = folder / SKIPPED
    if not steps and not path.exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    record = {f"step {step}": {"step": int(step), "revision": None, **why}
              for step, why in sorted(steps.items())}
    atomic_write_text(path, json.dumps(record, indent=2))
