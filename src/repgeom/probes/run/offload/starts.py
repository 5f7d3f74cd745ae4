"""The training starts of one run, in the order they began: each claims the next number in
``<run>/probes/snapshots/starts/`` (created with ``O_EXCL``: no clocks compared) and the newest
wins (`keeps`, `install`). docs/probing.md, "Overlapping starts", states the rules."""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from repgeom.files import fsync_dir
from repgeom.probes.run.offload.layout import (
    COMPLETE,
    marker_time,
    read_json,
    remove_snapshot,
    start_number,
)
from repgeom.probes.run.offload.lease import LEASE_READ_GAP_S, LEASE_READS, start_gone

log = logging.getLogger(__name__)

STARTS = "starts"
SUFFIX = ".lock"
STALE_S = 3600.0  # a temporary unchanged this long is a dead start's (no write takes as long)


def _number(path: Path) -> int | None:
    stem = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else ""
    return int(stem) if stem.isascii() and stem.isdigit() else None


def newest(folder: Path) -> int:
    """The largest start number claimed in `folder` (-1 when none). A listing that fails other
    than for a missing folder (NFS's ESTALE, an EIO) is read again as the lease is
    (`LEASE_READS`) before it reads as "no start", which lets the fence pass a superseded start."""
    for attempt in range(LEASE_READS):
        if attempt:
            time.sleep(LEASE_READ_GAP_S)
        try:
            names = list((folder / STARTS).iterdir())
        except FileNotFoundError:
            return -1
        except OSError:
            continue
        return max((n for n in map(_number, names) if n is not None), default=-1)
    return -1


def claim(folder: Path) -> int:
    """This start's number: larger than every earlier start's in `folder`. Where the listing
    fails (`newest`: -1) the ``O_EXCL`` walk from 0 still ends past the newest, as no start file
    is ever deleted (docs/probing.md, "Overlapping starts")."""
    starts = folder / STARTS
    starts.mkdir(parents=True, exist_ok=True)
    number = 1 + newest(folder)
    while True:
        path = starts / f"{number:09d}{SUFFIX}"
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return number
        except FileExistsError:  # another start took this number meanwhile: the next one
            number += 1


def gone(folder: Path, number: int, written: Path) -> bool:
    """Whether start `number` (which wrote `written`) has ended: its lease, or `STALE_S` idle."""
    if not (folder / STARTS / f"{number:09d}{SUFFIX}").is_file():
        return False  # never claimed this way: not known to be gone
    if start_gone(folder, number):
        return True
    try:  # its latest change, of the folder or a file in it (unreadable: now)
        changed = max(p.stat().st_mtime for p in [written, *written.iterdir()])
    except OSError:
        return False
    return time.time() - changed > STALE_S


def keeps(marker: dict[str, Any] | None, number: int, start_id: str) -> bool:
    """Whether the snapshot with `marker` stays for start `number`: its own, or a newer start's."""
    return marker is not None and (
        marker.get("start") == start_id or start_number(marker) > number)


def install(tmp: Path, folder: Path, *, number: int, start_id: str,
            superseded: Callable[[], bool]) -> bool:
    """Rename the complete snapshot `tmp` of start `number` to `folder`, the newest start winning
    (`keeps`; nothing once `superseded()`); whether it went there (else `tmp` is the caller's)."""
    for _ in range(3):
        if superseded():
            return False
        try:
            os.rename(tmp, folder)  # the whole snapshot appears at once
        except OSError as error:  # ENOTEMPTY/EEXIST: a snapshot is there
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        else:
            fsync_dir(folder.parent)
            return True
        marker = read_json(folder / COMPLETE)  # read once: it decides, and names what is removed
        if keeps(marker, number, start_id):
            return False
        remove_snapshot(folder, written=marker_time(marker) if marker else None,
                        incomplete=marker is None)
    log.warning("the snapshot in %s is not written: it kept changing under it (other training "
                "starts of this run write it too)", folder)
    return False
