"""One probe worker per run folder: `WorkerLock` on ``<run>/probes/snapshots/``.

Every worker takes the lease file, whatever its kind, so that no two workers can hold one run by
different means (a file server that sees ext4 and its NFS clients that see nfs4 would pick
different kinds with ``follow_lock=auto``, and a flock and a lease never exclude each other):

- the lease, ``worker.lease``, created with ``O_CREAT | O_EXCL``. It holds the holder's host,
  boot id and pid namespace (`repgeom.probes.run.offload.host`), pid and a random token, and its
  modification time is the heartbeat: a thread touches it every `LEASE_HEARTBEAT_S` seconds.
  Another worker respects it until the heartbeat has not moved for `LEASE_STALE_S` seconds on
  its own clock (no clock is compared across hosts), or at once when the holder's pid is gone on
  this same host (same hostname, boot and pid namespace; a container that shares the node's
  hostname is not the same host). Then it takes the lease over.
- with kind ``flock`` (a local file system), an exclusive `fcntl.flock` on ``worker.lock``
  (`repgeom.files.try_lock`; it holds the holder's pid) is taken first, as an extra: two
  workers of one node wait on it without reading the lease.

The token is the fencing token: `WorkerLock.check` raises `LockLostError` once the lease names
another token, and the worker runs it (`repgeom.files.fenced`) just before each rename into
place of the table, ``worker.json``, ``skipped.json`` and each deletion. A holder paused past the
stale time (SIGSTOP, an NFS partition, a frozen VM) that wakes up writes nothing over the new
holder's files. What no file system offers is a rename that checks the token itself, so a pause
of more than `LEASE_STALE_S` between that check and its rename (microseconds apart) is not
covered.

flock is taken only where it can be trusted. That is a shared file system, where flock may be
refused (NFS without lockd: ENOLCK; ENOSYS, EOPNOTSUPP) or, worse, may succeed on each node alone
(NFS ``local_lock=flock``, Lustre ``localflock``), and then two workers would delete each other's
snapshots. `auto` takes the lease alone on the file systems in `SHARED_FILE_SYSTEMS`
(``/proc/self/mountinfo``) and when flock is refused. Any other error of flock is raised as what it
is, not read as "another worker holds it". A file descriptor opened here is closed on every way
out.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import IO

from repgeom.files import read_json, try_lock
from repgeom.probes.run.offload.host import host_identity, pid_of, same_host

LOCK_KINDS = ("auto", "flock", "file")
"""``follow_lock``'s values: pick by file system, or force one kind."""
FLOCK_NAME = "worker.lock"
LEASE_NAME = "worker.lease"
LEASE_HEARTBEAT_S = 5.0
"""Seconds between two touches of the lease file by its holder."""
LEASE_STALE_S = 60.0
"""A lease whose heartbeat has not moved for this long (the waiter's own clock) is stale."""
POLL_S = 0.5
"""Seconds between two tries while another worker holds the run."""
LEASE_READS = 3
LEASE_READ_GAP_S = 0.2
"""A holder reads its lease up to `LEASE_READS` times, this far apart, before it counts a lease
it cannot read as lost: one ESTALE or EIO on a shared file system, or a lease a waiter moved
aside by mistake and put back (`WorkerLock._put_back`), is not a takeover."""
SHARED_FILE_SYSTEMS = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "beegfs", "ceph", "glusterfs",
    "fuse.glusterfs", "fuse.sshfs", "fuse.ceph", "panfs", "ocfs2", "gfs2", "9p", "wekafs",
})
"""File systems that several nodes mount: flock there is refused or may be node-local."""
# flock's "the file system cannot do this" (NFS without lockd, FUSE): fall back to the lease.
_UNSUPPORTED = frozenset({errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL})


class LockLostError(RuntimeError):
    """Another worker took this worker's lease over (its heartbeat was judged stale)."""


def _unescape(field: str) -> str:
    """A mount point as ``/proc/self/mountinfo`` writes it, with its octal escapes (``\\040``
    space, ``\\011`` tab, ``\\012`` newline, ``\\134`` backslash) read back."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def file_system_type(path: Path) -> str | None:
    """The type of the file system holding `path` (``/proc/self/mountinfo``); None off Linux."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    target, best, kind = str(Path(path).resolve()), "", None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mount = _unescape(fields[4])
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, right.split()[0]
    return kind


def lock_kind(folder: Path, wanted: str = "auto") -> str:
    """``flock`` or ``file`` for `folder`: `wanted` itself unless ``auto``; a ValueError names a
    bad value."""
    if wanted not in LOCK_KINDS:
        raise ValueError(f"follow_lock must be one of {', '.join(LOCK_KINDS)}, got {wanted!r}")
    if wanted != "auto":
        return wanted
    return "file" if file_system_type(folder) in SHARED_FILE_SYSTEMS else "flock"


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


class WorkerLock:
    """The run's worker lock in `folder` (see the module); `acquire`, `check`, `release`."""

    def __init__(self, folder: Path, *, kind: str = "auto", stale_s: float = LEASE_STALE_S,
                 heartbeat_s: float = LEASE_HEARTBEAT_S) -> None:
        if not 0 < heartbeat_s < stale_s:
            raise ValueError(f"the lease heartbeat ({heartbeat_s} s) must be > 0 and shorter "
                             f"than its stale time ({stale_s} s)")
        self.folder = Path(folder)
        self.kind = lock_kind(self.folder, kind)
        self.stale_s = float(stale_s)
        self.heartbeat_s = float(heartbeat_s)
        self.token = uuid.uuid4().hex
        self._handle: IO | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self.lost = False

    @property
    def lease(self) -> Path:
        return self.folder / LEASE_NAME

    # -- acquire ---------------------------------------------------------------------------------

    def acquire(self, timeout_s: float, what: str) -> None:
        """Hold the lock within `timeout_s` seconds, saying once whom it waits for; `what` (the
        run folder) is named in the messages."""
        self.folder.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout_s
        said = False
        watch: dict[str, float] = {}
        try:
            while True:
                other = self._try_flock() if self.kind == "flock" and self._handle is None else None
                if other is None:
                    other = self._try_lease(watch)
                if other is None:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"another probe worker ({other}) follows {what} and did not finish "
                        f"within {timeout_s:.0f} s (follow_timeout_s); two would probe each "
                        "snapshot twice. Stop it first, or let it finish"
                    )
                if not said:  # e.g. a resumed train.py's worker while the last start's finishes
                    print(f"Another probe worker ({other}) follows {what}; waiting for it to "
                          f"finish (its lease counts as stale after {self.stale_s:.0f} s without "
                          "a heartbeat)", flush=True)
                    said = True
                time.sleep(POLL_S)
        except BaseException:
            self.release()  # a flock taken while the lease was another's
            raise

    def _try_flock(self) -> str | None:
        """None once held; else who holds it. Falls back to the lease where flock is refused."""
        path = self.folder / FLOCK_NAME
        try:
            handle = try_lock(path, create_mode=0o644)
        except OSError as error:  # not another worker holding it (`repgeom.files.LOCK_HELD`)
            if error.errno in _UNSUPPORTED:
                print(f"flock on {path} is not supported here ({errno.errorcode.get(error.errno)}"
                      f": {error.strerror}); using a lease file with a heartbeat instead "
                      f"({self.lease})", flush=True)
                self.kind = "file"
                return None  # the lease alone
            raise OSError(error.errno, f"cannot lock {path} for the probe worker: "
                          f"{error.strerror} ({errno.errorcode.get(error.errno, error.errno)}); "
                          "this is not another worker holding it. Check the folder's file "
                          "system, or pass follow_lock=file to use a lease file") from error
        if handle is None:  # held by another worker, which wrote its pid into the file
            try:
                holder = path.read_bytes()[:256].decode(errors="replace").strip()
            except FileNotFoundError:
                if not self.folder.is_dir():
                    raise  # the run's folder is gone: nobody to wait for
                holder = ""  # deleted this instant: the next try makes it again
            return f"pid {holder or '?'}"
        try:
            handle.truncate(0)
            handle.write(str(os.getpid()).encode())
        except BaseException:
            handle.close()
            raise
        self._handle = handle
        return None

    def _try_lease(self, watch: dict[str, float]) -> str | None:
        """None once the lease is ours; else who holds it. `watch` keeps, between tries, the
        holder's last heartbeat seen and when (this process's clock) it was seen to move."""
        try:
            fd = os.open(self.lease, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return self._judge(watch)
        try:
            os.write(fd, json.dumps({**host_identity(), "pid": os.getpid(),
                                     "token": self.token, "time": time.time()}).encode())
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            self.lease.unlink(missing_ok=True)
            raise
        os.close(fd)
        self._stop.clear()
        self._beat = threading.Thread(target=self._beat_loop, name="worker-lease", daemon=True)
        self._beat.start()
        return None

    def _judge(self, watch: dict[str, float]) -> str | None:
        """Another's lease: who holds it, or None when it was stale and is now ours."""
        holder = read_json(self.lease) or {}
        try:
            beat = self.lease.stat().st_mtime
        except FileNotFoundError:  # released just now: try again
            return "a worker that just finished"
        now = time.monotonic()
        if watch.get("beat") != beat or holder.get("token") != watch.get("token"):
            watch.update(beat=beat, seen=now, token=holder.get("token"))
        name = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
        pid = pid_of(holder)  # none (a malformed lease): judged by its heartbeat alone
        gone = same_host(holder) and pid is not None and not process_alive(pid)
        if not gone and now - watch["seen"] < self.stale_s:
            return name
        # Stale: move it aside (only one taker's rename succeeds), then take it.
        aside = self.lease.with_name(f".{LEASE_NAME}.stale.{self.token}")
        try:
            os.rename(self.lease, aside)
        except FileNotFoundError:
            return name
        moved = read_json(aside) or {}
        if moved.get("token") != holder.get("token"):
            # Another waiter took the stale lease over between our look and our rename: what we
            # moved is its fresh lease, and it may be at work already. Put it back, and wait.
            self._put_back(aside)
            return f"pid {moved.get('pid', '?')} on {moved.get('host', '?')}"
        aside.unlink(missing_ok=True)
        print(f"The probe worker lease of {name} is stale ("
              + ("its process is gone" if gone else
                 f"no heartbeat for {now - watch['seen']:.0f} s") + "); taking it over",
              flush=True)
        return self._try_lease(watch)

    def _put_back(self, aside: Path) -> None:
        """Return another's lease moved to `aside` by mistake (`_judge`), never over a newer one."""
        try:
            os.link(aside, self.lease)  # fails where a lease is there again: that one stays
        except FileExistsError:
            pass
        except OSError:  # no hard links here (some FUSE file systems): a rename instead
            if not self.lease.exists():
                with contextlib.suppress(OSError):
                    os.rename(aside, self.lease)
        aside.unlink(missing_ok=True)

    # -- hold ------------------------------------------------------------------------------------

    def _read_holder(self) -> dict | None:
        """The lease as it reads now (a JSON object), read up to `LEASE_READS` times
        `LEASE_READ_GAP_S` apart while it cannot be read (missing, ESTALE, EIO, cut short, not
        an object); None when no read succeeded."""
        for attempt in range(LEASE_READS):
            if attempt:
                time.sleep(LEASE_READ_GAP_S)
            holder = read_json(self.lease)
            if holder is not None:
                return holder
        return None

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            holder = self._read_holder()
            if holder is None:  # cannot be read now: the next beat (and `check`) looks again
                continue
            if holder.get("token") != self.token:  # another's: taken over
                self.lost = True
                return
            with contextlib.suppress(OSError):  # a full disk: the next beat tries again
                os.utime(self.lease)

    def check(self) -> None:
        """Raise `LockLostError` when this worker no longer holds the run: the fencing check,
        run just before each write and deletion (`repgeom.files.fenced`), so that a worker
        that lost its lease never touches the new holder's files.

        Lost: the lease names another token, or it could not be read `LEASE_READS` times in a
        row (a holder that cannot prove it holds the run writes nothing); one failed read is
        not enough."""
        if self._beat is None:
            return
        holder = None if self.lost else self._read_holder()
        if holder is None or holder.get("token") != self.token:
            seen = ("seen by its heartbeat" if self.lost else holder
                    or f"unreadable or removed, {LEASE_READS} reads")
            self.lost = True
            raise LockLostError(
                f"another probe worker took over {self.lease} ({seen}): this worker's "
                f"heartbeat was judged stale (over {self.stale_s:.0f} s); it stops and leaves "
                "the run to that worker"
            )

    def release(self) -> None:
        """Let go of the lock (idempotent); the lease file is removed only while it is ours,
        then the flock is dropped."""
        if self._beat is not None:
            self._stop.set()
            self._beat.join()
            self._beat = None
            holder = read_json(self.lease)
            if holder is not None and holder.get("token") == self.token:
                self.lease.unlink(missing_ok=True)
        if self._handle is not None:
            handle, self._handle = self._handle, None
            handle.close()  # drops the flock

