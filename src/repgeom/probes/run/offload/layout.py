"""The files of ``<run>/probes/snapshots/`` (`repgeom.probes.run.offload.snapshots` describes
them): their names, how snapshots are listed, and how one is deleted. Shared by the training side
(`repgeom.probes.run.offload.snapshots`), the worker (`repgeom.probes.run.offload.follow`) and its
lock (`repgeom.probes.run.offload.lock`)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from repgeom import files
from repgeom.files import atomic_write_text, read_json  # noqa: F401 - read_json: the layout's
from repgeom.probes.core import table

SNAPSHOT_DIR = "snapshots"
MARKER = ".repgeom-snapshots"
"""The file that marks ``probes/snapshots/`` as repgeom's (only such a folder is cleaned)."""
WEIGHTS = "weights.ckpt"
COMPLETE = "complete.json"
TRAINING = "training.json"
DONE = "done.json"
RUN = "run.json"
WORKER = "worker.json"


def snapshot_dir(run_dir: str | os.PathLike) -> Path:
    """``<run_dir>/probes/snapshots``."""
    return table.probe_dir(run_dir) / SNAPSHOT_DIR


def step_dir(folder: Path, step: int) -> Path:
    return folder / f"step_{step:09d}"


WRITING = ".tmp"
"""The suffix of a hidden snapshot folder being written (``.step_<N>.<start number>-<random
id>.tmp``, `writer_of`)."""
REMOVED = ".removed"
"""The suffix of a hidden snapshot folder being deleted (``.step_<N>.<random id>.removed``: not
the pid, which processes in other containers share)."""


def step_of(path: Path) -> int | None:
    """``step_000000125`` (or its hidden ``.step_000000125.<id>.tmp`` or ``.<id>.removed``) -> 125;
    None for any other name."""
    name = path.name
    if name.startswith(".") and name.endswith((WRITING, REMOVED)):
        name = name[1:].split(".", 1)[0]
    if not name.startswith("step_") or not name[5:].isdigit():
        return None
    return int(name[5:])


def writer_of(path: Path) -> int | None:
    """The number of the start that writes (or wrote) the hidden snapshot folder `path`
    (``.step_<N>.<number>-<id>.tmp``); None for any other name (an older version's temporary, an
    incomplete ``step_<N>``)."""
    if not path.name.startswith(".") or not path.name.endswith(WRITING):
        return None
    number = path.name[1:].split(".", 1)[-1].split("-", 1)[0]
    return int(number) if number.isdigit() else None


def snapshots(folder: Path) -> tuple[list[tuple[int, Path]], list[tuple[int, Path]]]:
    """(complete, incomplete) snapshots of `folder` as (step, folder), each in step order.

    Incomplete: a ``step_<N>`` without ``complete.json``, or a hidden one still being written
    (``.step_<N>.<id>.tmp``: a training process writes it now, or was killed while writing)."""
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


def leftovers(folder: Path) -> list[Path]:
    """Snapshots a worker renamed to delete them and was killed before it could."""
    if not folder.is_dir():
        return []
    return [p for p in folder.iterdir() if p.name.endswith(REMOVED) and step_of(p) is not None]


def write_json(path: Path, data: dict[str, Any]) -> None:
    """`data` as JSON at `path`, atomically (`repgeom.files.atomic_write_text`: a temporary file
    of its own, fsync, rename, fsync the folder); a full disk leaves no temporary file."""
    atomic_write_text(path, json.dumps(data, indent=1))


def snapshot_time(path: Path) -> float | None:
    """The ``time`` in the ``complete.json`` of the snapshot in `path` (what names it; 0.0 for a
    marker without one); None when it cannot be read or is not a number."""
    return marker_time(read_json(path / COMPLETE))


def marker_time(marker: Any) -> float | None:
    """`snapshot_time` of a ``complete.json`` already read (None: unreadable)."""
    if not isinstance(marker, dict):
        return None
    try:
        return float(marker.get("time", 0.0))
    except (TypeError, ValueError):
        return None


def remove_snapshot(path: Path, *, written: float | None = None) -> None:
    """Delete one snapshot folder of ours (``probes/snapshots/step_<N>`` of a marked folder, or
    one of its hidden forms): renamed to ``.step_<N>.<random id>.removed`` first, so
    ``step_<N>`` is gone at once and a training start never finds it half-deleted; a folder
    already gone is fine.

    With `written` (the ``time`` of the snapshot probed), only that snapshot is deleted: one
    found in its place once moved aside (a resumed training start replaced it with its replay
    meanwhile) is put back. The `repgeom.files.fenced` check runs first, before any rename or
    deletion (a leftover's too): a worker that lost the run deletes nothing.
    """
    if step_of(path) is None or not (path.parent / MARKER).is_file():
        raise ValueError(f"{path} is not a repgeom snapshot folder; not deleting it")
    files.check_fence()  # through the module: whatever check is in force (and tests' patches)
    gone = path
    if not path.name.endswith(REMOVED):
        gone = _move_aside(path)
        if gone is None:  # deleted meanwhile (another look at the same folder)
            return
        if written is not None and snapshot_time(gone) != written:
            try:  # not the one probed: back where it was (unless a newer one is there)
                os.rename(gone, path)
                return
            except OSError:
                pass
    shutil.rmtree(gone, ignore_errors=True)


def _move_aside(path: Path, tries: int = 3) -> Path | None:
    """`path` renamed to a hidden ``.step_<N>.<random id>.removed`` beside it; None when it is
    gone. A name already taken (ENOTEMPTY, EEXIST: never by chance with a random id) gets
    another."""
    stem = path.name.lstrip(".").split(".", 1)[0]
    for attempt in range(tries):
        gone = path.with_name(f".{stem}.{uuid.uuid4().hex}{REMOVED}")
        try:
            os.rename(path, gone)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST) or attempt == tries - 1:
                raise
            continue
        return gone
    return None  # not reached: the last try returns or raises
