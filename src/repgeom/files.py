"""Files written whole or not at all, and locks on them: the one atomic writer, the one
directory fsync, the one file lock and the one "read a JSON object or None" that every floor
above uses (tables, snapshots, skipped steps, download markers and proofs, download locks, the
probe worker's lock and lease).

`atomic_write` writes through fsynced temporary files (in the same folder, or in a `tmp_dir` on
the same file system) and renames them into place (``os.replace``, atomic on POSIX):
a kill or a crash leaves the old file or the new one, never a part. What goes into a file is
written by a callback given its temporary path (a table's ``to_parquet``, a download's stream),
or is text or bytes (`atomic_write_text`, `atomic_write_bytes`); several files are renamed only
once all of them are written (`atomic_write_many`). A new file gets the mode a plain ``open()``
gives (``0666`` less the umask, and a folder's default ACL), never mkstemp's 0600, unless a
`mode` is given: in a folder shared by a group (a Hugging Face cache) under umask 002 that is
0664, as the group's other tools write. `fsync_dir` flushes a folder's entries after a rename.
`try_lock` takes an ``flock`` on a lock file and says None, never waits for ever, when another
process holds it. `read_json` reads a JSON object, or says None (`read_json_why`: and why).

`fenced`: while a check is set (the probe worker's `WorkerLock.check`), every atomic write runs it
once just before its renames (`check_fence`, which deletions of shared state run too), so a
process that lost the right to write (its lease taken over while it was paused) raises instead of
renaming its files over the new holder's, and renames none of them rather than some.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import fcntl
import glob
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

_FENCE: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "repgeom_fence", default=None)


@contextlib.contextmanager
def fenced(check: Callable[[], None]) -> Iterator[None]:
    """Run `check` before each atomic write's renames in this thread (context) while inside the
    block; it raises when this process may no longer write."""
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


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a written file to the disk: without it a node that crashes can leave a renamed file
    empty, and a resume would read an empty file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(folder: str | os.PathLike) -> None:
    """Flush a folder's entries (the renames and new names in it) to the disk, where the file
    system allows it: some refuse to open or fsync a directory, and a rename already made is
    not undone by that, so the refusal is passed over."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on a directory
        pass
    finally:
        os.close(fd)


Write = Callable[[Path], None]
"""A callback that writes a file's whole content to the (empty, already made) path it is
given."""


def atomic_write(path: str | os.PathLike, write: Write, *, mode: int | None = None,
                 tmp_dir: str | os.PathLike | None = None) -> None:
    """Write `path` whole or not at all: `write` fills a temporary file, which is fsynced and
    renamed into place (`atomic_write_many` of one file; its parameters)."""
    atomic_write_many([(path, write)], mode=mode, tmp_dir=tmp_dir)


def atomic_write_many(writes: Sequence[tuple[str | os.PathLike, Write]], *,
                      mode: int | None = None,
                      tmp_dir: str | os.PathLike | None = None) -> None:
    """Write several files whole or not at all: each `write` fills a temporary file of its own,
    and only once every one is written and fsynced are they renamed into place, in the order
    given (a kill between two renames leaves the first ones new), then their folders fsynced.
    If a callback raises, no file is renamed and every temporary file is removed.

    Parameters
    ----------
    writes : sequence of (path, write)
        Each target and the callback that writes its content to the temporary path it is given
        (``lambda tmp: frame.to_parquet(tmp)``); the file exists, empty, with its mode set.
    mode : int, optional
        The new files' permission bits; by default what ``open()`` gives (``0666`` less the
        umask), never mkstemp's 0600.
    tmp_dir : path, optional
        Where the temporary files are written (same file system as the targets); by default
        each target's folder. A Hugging Face cache keeps them out of ``snapshots/`` and
        ``refs/``, which its scan reads.
    """
    temps: list[tuple[Path, Path]] = []
    try:
        for target, write in writes:
            target = Path(target)
            folder = Path(tmp_dir) if tmp_dir is not None else target.parent
            tmp = folder / _temporary_name(target.name, secrets.token_hex(4))
            # 0o666: the kernel applies the umask (and a default ACL), as for any open()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            temps.append((tmp, target))
            try:
                if mode is not None:
                    os.fchmod(fd, mode)
            finally:
                os.close(fd)
            write(tmp)
            fsync_file(tmp)
        check_fence()  # once, before the first rename: a process that lost the right to write
        for tmp, target in temps:  # renames none of them, never the first ones only
            os.replace(tmp, target)
        for folder in dict.fromkeys(target.parent for _, target in temps):
            fsync_dir(folder)  # the renames themselves
    finally:
        for tmp, _ in temps:
            tmp.unlink(missing_ok=True)


def _temporary_name(name: str, random: str) -> str:
    """The name of `atomic_write_many`'s temporary file for a target called `name`."""
    return f".{name}.{random}.tmp"


def stale_temporaries(path: str | os.PathLike, *, min_age_s: float = 0.0) -> list[Path]:
    """The temporary files `atomic_write` made for `path` (hidden, `_temporary_name`, beside it)
    unchanged for `min_age_s` seconds or more: a kill's leftovers. With no age, only for a file
    one process writes at a time (another writer's temporary would be among them); with an age
    longer than any write takes, for any file. The temporary itself is aged (``lstat``): one
    that is a link (`repgeom.callbacks.checkpoint_policy.link_or_copy`'s) may dangle."""
    target = Path(path)
    now, found = time.time(), []
    for tmp in sorted(target.parent.glob(_temporary_name(glob.escape(target.name), "*"))):
        try:
            if now - tmp.lstat().st_mtime >= min_age_s:
                found.append(tmp)
        except OSError:
            pass  # renamed or removed meanwhile: its writer finished
    return found


def atomic_write_text(path: str | os.PathLike, text: str, *, mode: int | None = None,
                      tmp_dir: str | os.PathLike | None = None) -> None:
    """Write `text` to `path` whole or not at all (`atomic_write_many`; its parameters)."""
    atomic_write_bytes(path, text.encode(), mode=mode, tmp_dir=tmp_dir)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, mode: int | None = None,
                       tmp_dir: str | os.PathLike | None = None) -> None:
    """Write `data` to `path` whole or not at all (`atomic_write_many`; its parameters)."""
    atomic_write(path, lambda tmp: tmp.write_bytes(data), mode=mode, tmp_dir=tmp_dir)


LOCK_HELD = frozenset({errno.EWOULDBLOCK, errno.EAGAIN})
"""``flock``'s errnos for "another process holds it" (EWOULDBLOCK == EAGAIN on Linux). Any other
error is not contention, and `try_lock` raises it: EACCES from ``flock`` is a refusal (a security
module, an NFSv4 server), which "wait for the other process" would misname."""


def try_lock(path: str | os.PathLike, *, blocking: bool = False,
             create_mode: int = 0o666) -> IO | None:
    """The lock file `path` opened (read and write, made if missing with `create_mode` less the
    umask) and locked (``flock``, exclusive) for as long as the returned binary handle stays
    open, or None when another holder has it, or when the file is gone (a folder being deleted)
    or was replaced while we waited. `blocking` waits for the holder. Any other error of
    ``flock`` (`LOCK_HELD`: not contention; a file system that cannot lock) is raised as it
    is, the file closed."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, create_mode)
    except FileNotFoundError:
        return None
    handle = os.fdopen(fd, "r+b", buffering=0)  # noqa: SIM115 - open for as long as the lock
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        if os.fstat(handle.fileno()).st_ino != os.stat(path).st_ino:
            raise FileNotFoundError(path)  # deleted and made again while we waited
    except OSError as error:
        handle.close()
        if isinstance(error, FileNotFoundError) or error.errno in LOCK_HELD:
            return None
        raise
    except BaseException:
        handle.close()
        raise
    return handle


def read_json_why(path: str | os.PathLike) -> tuple[dict[str, Any] | None, str | None]:
    """The JSON object at `path`, or None and why it cannot be read: (None, None) when the file
    is missing, (None, the error) when it cannot be read or parsed (caught mid-replace
    elsewhere, cut short), or is not a JSON object."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as error:
        return None, f"{type(error).__name__}: {error}"
    if not isinstance(data, dict):
        return None, f"not a JSON object: {str(data)[:80]}"
    return data, None


def read_json(path: str | os.PathLike) -> dict[str, Any] | None:
    """The JSON object at `path`, or None when it is missing, cannot be read or parsed, or is
    not an object (`read_json_why` says which)."""
    return read_json_why(path)[0]
