"""The training starts of one run, in the order they began: which start is the newest, and which
older ones are gone, so that two starts alive at once (a requeue on another node while the old
start still runs on a hung one; two containers) never undo each other's snapshots.

Each start claims the next number in ``<run>/probes/snapshots/starts/``: it creates
``<number>.lock`` with ``O_EXCL`` (atomic on local file systems and NFSv3+), so no two starts get
the same number and a later start always gets a larger one, whatever the hosts' clocks say. It
then holds an exclusive ``flock`` on that file for its whole life (`repgeom.files.try_lock`); the
kernel releases it when the process dies (on NFS, when the server ends the dead client's lease).
The rules the snapshot writer (`repgeom.probes.run.offload.snapshots`) keeps with them:

- **newest wins:** a complete snapshot names its start's number; a start never replaces a
  snapshot of a newer start (its own weights belong to an abandoned trajectory), and replaces an
  older start's (the replay's weights are the run's now);
- **only the dead's temporaries are swept:** a start removes a half-written snapshot of an older
  start only when it can take that start's lock (the start is gone). Where the lock cannot be
  asked (a file system without ``flock``) or is held, the temporary stays: a live start is still
  writing it.

The lock files stay (a few bytes a start): deleting a lock file races with a process that opens
it to lock it. A limitation: on the NFS server itself, a local ``flock`` and the NFS clients'
locks do not see each other, so a start on the file server may take a client start for gone and
remove its write in progress; that client's snapshot then fails and its training stops with the
error (never a wrong snapshot).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

from repgeom.files import try_lock

STARTS = "starts"
SUFFIX = ".lock"


def _number(path: Path) -> int | None:
    stem = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else ""
    return int(stem) if stem.isdigit() else None


def claim(folder: Path) -> tuple[int, IO | None]:
    """This start's number (larger than every earlier start's in `folder`) and its lock, held
    until the handle is closed or the process ends; None as the lock where ``flock`` cannot be
    used there (then other starts take this one for alive: they never sweep its writes)."""
    starts = folder / STARTS
    starts.mkdir(parents=True, exist_ok=True)
    number = 1 + max((n for n in map(_number, starts.iterdir()) if n is not None), default=-1)
    while True:
        path = starts / f"{number:09d}{SUFFIX}"
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except FileExistsError:  # another start took this number meanwhile: the next one
            number += 1
            continue
        try:  # blocking: another start may be testing it for a moment (`gone`)
            return number, try_lock(path, blocking=True)
        except OSError:
            return number, None


def gone(folder: Path, number: int) -> bool:
    """Whether start `number` of `folder` has ended for sure: its lock can be taken (and is let go
    at once). False where it is held, or cannot be asked."""
    path = folder / STARTS / f"{number:09d}{SUFFIX}"
    if not path.is_file():
        return False  # never claimed this way (an older version's start): not known to be gone
    try:
        handle = try_lock(path)
    except OSError:
        return False
    if handle is None:
        return False
    handle.close()
    return True
