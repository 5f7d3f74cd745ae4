"""Files written whole or not at all, and locks on them: the one atomic writer and the one file
lock every floor above uses (tables, skipped steps, download markers, download locks).

`atomic_write_text` writes through a fsynced temporary file in the same folder and renames it
into place (``os.replace``, atomic on POSIX): a kill or a crash leaves the old file or the new
one, never a part. `try_lock` takes an ``flock`` on a lock file and says None, never waits for
ever, when another process holds it.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path
from typing import IO


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a written file (or a folder's entries, after a rename) to the disk: without it a
    node that crashes can leave a renamed file empty, and a resume would read an empty file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` through a fsynced temporary file and a rename: a kill or a crash
    leaves the old file or the new one, never a part."""
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """`atomic_write_text` for bytes."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_file(path.parent)
    finally:
        Path(tmp).unlink(missing_ok=True)


def try_lock(path: str | os.PathLike, *, blocking: bool = False) -> IO | None:
    """The lock file `path` opened and locked (``flock``, exclusive) for as long as the returned
    handle stays open, or None when another holder has it, or when the file is gone (a folder
    being deleted) or was replaced while we waited. `blocking` waits for the holder."""
    try:
        handle = open(path, "a+")  # noqa: SIM115 - held open for as long as the lock
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        if os.fstat(handle.fileno()).st_ino != os.stat(path).st_ino:
            raise FileNotFoundError(path)  # deleted and made again while we waited
    except (BlockingIOError, FileNotFoundError):
        handle.close()
        return None
    return handle
