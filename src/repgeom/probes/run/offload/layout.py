"""The files of ``<run>/probes/snapshots/`` (docs/probing.md, "The run folder"): their names and
fields (`problem`), how snapshots are listed, and how one is deleted."""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from repgeom import files
from repgeom.files import atomic_write_text, read_json  # noqa: F401 - read_json: the layout's
from repgeom.probes.core import table

SNAPSHOT_DIR = "snapshots"
MARKER = ".repgeom-snapshots"  # marks probes/snapshots/ as repgeom's: only such a one is cleaned
WEIGHTS = "weights.ckpt"
COMPLETE = "complete.json"
TRAINING = "training.json"
DONE = "done.json"
RUN = "run.json"
WORKER = "worker.json"

NUMBER, WHOLE, TEXT, OBJECT = "a finite number", "a whole number", "a text", "an object"
COMPLETE_FIELDS = {"step": WHOLE, "time": NUMBER, "rank": WHOLE, "pid": WHOLE, "start": TEXT,
                   "number": WHOLE, "bytes": WHOLE}
TRAINING_FIELDS = {"pid": WHOLE, "step": WHOLE, "step_time": NUMBER, "time": NUMBER,
                   "state": TEXT, "heartbeat_s": NUMBER, "number": WHOLE}
DONE_FIELDS = {"step": WHOLE, "time": NUMBER, "skipped_for_space": OBJECT, "number": WHOLE}
"""Every field of each marker: one missing, of a wrong type, NaN or infinite is malformed."""
is_a = {NUMBER: lambda v: isinstance(v, int | float) and not isinstance(v, bool)
       and math.isfinite(v),
       WHOLE: lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
       TEXT: lambda v: isinstance(v, str), OBJECT: lambda v: isinstance(v, dict)}


def problem(record: Any, fields: dict[str, str]) -> str | None:
    """What is wrong with `record` (a marker read) against `fields`, or None."""
    if not isinstance(record, dict):
        return "it is not a JSON object"
    for key, kind in fields.items():
        if key not in record:
            return f"{key} is missing"
        if not is_a[kind](record[key]):
            return f"{key} is not {kind}: {record[key]!r}"
    return None


def marker_problem(path: Path, marker: Any) -> tuple[Path, str] | None:
    """The file of the snapshot in `path` and what is wrong with it ("Quarantine"), or None."""
    bad = problem(marker, COMPLETE_FIELDS)
    if bad is None and marker["step"] != step_of(path):
        bad = f"step is {marker['step']}, in the folder of step {step_of(path)}"
    if bad is not None:
        return path / COMPLETE, f"its marker is malformed: {bad}"
    try:
        size = (path / WEIGHTS).stat().st_size
    except OSError:
        return None  # gone: `read_checkpoint` says so
    if size != marker["bytes"]:
        return path / WEIGHTS, f"it holds {size} bytes, its marker says {marker['bytes']}"
    return None


def snapshot_dir(run_dir: str | os.PathLike) -> Path:
    """``<run_dir>/probes/snapshots``."""
    return table.probe_dir(run_dir) / SNAPSHOT_DIR


def step_dir(folder: Path, step: int) -> Path:
    return folder / f"step_{step:09d}"


WRITING = ".tmp"  # a hidden snapshot being written: .step_<N>.<start number>-<random id>.tmp
REMOVED = ".removed"  # one being deleted: .step_<N>.<random id>.removed (no pid: containers)


def step_of(path: Path) -> int | None:
    """``step_000000125`` (or its hidden ``.tmp`` or ``.removed``) -> 125; else None."""
    name = path.name
    if name.startswith(".") and name.endswith((WRITING, REMOVED)):
        name = name[1:].split(".", 1)[0]
    if not name.startswith("step_") or not (name[5:].isascii() and name[5:].isdigit()):
        return None
    return int(name[5:])


def writer_of(path: Path) -> int | None:
    """The number of the start that writes the hidden snapshot folder `path`, or None."""
    if not path.name.startswith(".") or not path.name.endswith(WRITING):
        return None
    number = path.name[1:].split(".", 1)[-1].split("-", 1)[0]
    return int(number) if number.isascii() and number.isdigit() else None


def snapshots(folder: Path) -> tuple[list[tuple[int, Path]], list[tuple[int, Path]]]:
    """(complete, incomplete) snapshots of `folder` as (step, folder), each in step order."""
    complete, incomplete = [], []
    if not folder.is_dir():
        return complete, incomplete
    for path in sorted(folder.iterdir(), key=lambda p: p.name.lstrip(".")):
        step = step_of(path)
        if step is None or not path.is_dir() or path.name.endswith(REMOVED):
            continue
        whole = not path.name.startswith(".") and (path / COMPLETE).is_file()
        (complete if whole else incomplete).append((step, path))
    return complete, incomplete


SETTLED_S = 60.0  # a .removed folder younger than this may be on its way back: not a leftover


def leftovers(folder: Path, *, min_age_s: float = 0.0) -> list[Path]:
    """``.removed`` folders whose deletion a kill cut, moved aside at least `min_age_s` ago."""
    if not folder.is_dir():
        return []
    now = time.time()
    found = []
    for path in folder.iterdir():
        if not path.name.endswith(REMOVED) or step_of(path) is None:
            continue
        try:
            if now - path.stat().st_ctime >= min_age_s:  # a rename sets the ctime
                found.append(path)
        except OSError:
            pass  # gone meanwhile
    return found


def write_json(path: Path, data: dict[str, Any]) -> None:
    """`data` as JSON at `path`, atomically."""
    atomic_write_text(path, json.dumps(data, indent=1))


def snapshot_time(path: Path) -> float | None:
    """The ``time`` in the ``complete.json`` of the snapshot in `path` (what names it)."""
    return marker_time(read_json(path / COMPLETE))


def marker_time(marker: Any) -> float | None:
    """`snapshot_time` of a marker read; None unless a finite number (NaN never equals itself)."""
    time_ = marker.get("time") if isinstance(marker, dict) else None
    return float(time_) if is_a[NUMBER](time_) else None


def remove_snapshot(path: Path, *, written: float | None = None,
                    incomplete: bool = False) -> None:
    """Delete a snapshot of ours, moved aside first; another found in its place is put back."""
    if step_of(path) is None or not (path.parent / MARKER).is_file():
        raise ValueError(f"{path} is not a repgeom snapshot folder; not deleting it")
    files.check_fence()  # through the module: whatever check is in force (and tests' patches)
    gone = path
    if not path.name.endswith(REMOVED):
        gone = _move_aside(path)
        if gone is None:  # deleted meanwhile (another look at the same folder)
            return
        found = snapshot_time(gone)
        if (written is not None and found != written) or (incomplete and found is not None):
            gone = _put_back(gone, path)  # not the one meant: back where it was
            if gone is None:
                return
    shutil.rmtree(gone, ignore_errors=True)


def start_number(marker: dict[str, Any] | None) -> int:
    """The number of the start that wrote a snapshot, from its marker read; -1 when none."""
    number = (marker or {}).get("number")
    return number if isinstance(number, int) and not isinstance(number, bool) else -1


def _put_back(aside: Path, path: Path) -> Path | None:
    """Rename `aside` back to `path` (None), unless a newer start's is there: `aside` to delete."""
    for _ in range(2):
        try:
            os.rename(aside, path)
            return None
        except OSError:
            pass
        if start_number(read_json(path / COMPLETE)) >= start_number(read_json(aside / COMPLETE)):
            return aside
        there = _move_aside(path)  # an older start's took the place: ours goes back instead
        if there is not None:
            shutil.rmtree(there, ignore_errors=True)
    return aside


def _move_aside(path: Path) -> Path | None:
    """`path` renamed to a hidden ``.step_<N>.<random id>.removed`` beside it; None: gone."""
    stem = path.name.lstrip(".").split(".", 1)[0]
    for attempt in range(3):
        gone = path.with_name(f".{stem}.{uuid.uuid4().hex}{REMOVED}")
        try:
            os.rename(path, gone)
            return gone
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST) or attempt == 2:
                raise
    return None  # not reached: the last try returns or raises
