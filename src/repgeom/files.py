"""Files written whole or not at all, and locks on them: the one atomic writer and the one file
lock every floor above uses (tables, skipped steps, download markers, download locks).

`atomic_write_text` writes through a fsynced temporary file (in the same folder, or in a
`tmp_dir` on the same file system) and renames it into place (`replace`, ``os.replace``, atomic
on POSIX): a kill or a crash leaves the old file or the new one, never a part. The new file gets
the mode a plain ``open()`` gives (``0666`` less the umask, and a folder's default ACL), unless a
`mode` is given: in a folder shared by a group (a Hugging Face cache) under umask 002 that is
0664, as the group's other tools write. `try_lock` takes an ``flock`` on a lock file and says
None, never waits for ever, when another process holds it.

`fenced`: while a check is set (the probe worker's `WorkerLock.check`), every `replace` runs it
just before its rename, so a process that lost the right to write (its lease taken over while it
was paused) raises instead of renaming its file over the new holder's.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

_FENCE: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "repgeom_fence", default=None)


@contextlib.contextmanager
def fenced(check: Callable[[], None]) -> Iterator[None]:
    """Run `check` before each `replace` of this thread (context) while inside the block; it
    raises when this process may no longer write."""
    token = _FENCE.set(check)
    try:
        yield
    finally:
        _FENCE.reset(token)


def check_fence() -> None:
    """Run the current `fenced` check, if any (before a rename or a deletion of shared state)."""
    check = _FENCE.get()
    if check is not None:
        check()


def replace(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """``os.replace(source, target)``, after the `fenced` check of this context."""
    check_fence()
    os.replace(source, target)


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a written file (or a folder's entries, after a rename) to the disk: without it a
    node that crashes can leave a renamed file empty, and a resume would read an empty file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike, text: str, *, mode: int | None = None,
                      tmp_dir: str | os.PathLike | None = None) -> None:
    """Write `text` to `path` through a fsynced temporary file and a rename: a kill or a crash
    leaves the old file or the new one, never a part (`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode(), mode=mode, tmp_dir=tmp_dir)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, mode: int | None = None,
                       tmp_dir: str | os.PathLike | None = None) -> None:
    """Write `data` to `path` whole or not at all.

    Parameters
    ----------
    mode : int, optional
        The new file's permission bits; by default what ``open()`` gives (``0666`` less the
        umask), never mkstemp's 0600.
    tmp_dir : path, optional
        Where the temporary file is written (same file system as `path`); by default `path`'s
        folder. A Hugging Face cache keeps it out of ``snapshots/`` and ``refs/``, which its
        scan reads.
    """
    path = Path(path)
    folder = Path(tmp_dir) if tmp_dir is not None else path.parent
    tmp = folder / f".{path.name}.{secrets.token_hex(4)}.tmp"
    # 0o666: the kernel applies the umask (and a default ACL), as for any open()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        replace(tmp, path)
        fsync_file(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


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
