"""Snapshots that cannot be probed: recorded with their error, skipped, and named beside the
table, never tried again for ever (issue 38).

A complete snapshot (its ``complete.json`` present) whose marker or weights cannot be read or
loaded (cut short, unreadable, a weights file that is not a checkpoint) is not being replaced:
the training side renames a whole snapshot into place, so a worker that finds the same files
before and after its read (`generation`: the marker's time and the two files' inode, size, mtime
and ctime) has found one broken for good. The worker records it in ``worker.json``
(``quarantined``: step -> its generation, file and reason), warns once naming the file, and goes
on to the later steps. The same generation is never tried again, by this worker or a rerun; one
the trainer writes again (a new time), or a file repaired or given other permissions (a new
mtime or ctime), is a new generation, tried again.

``probes/skipped.json`` (`SKIPPED`, the file `repgeom.probes.run.trajectory` writes for hub
revisions, in its format: label -> step, reason) names every step of the run without probe rows,
and why: quarantined, incomplete (training killed while writing it), or skipped by training for
lack of disk space.
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
