"""One probe worker per run (`repgeom.probes.run.offload.lock`): flock where it works, a lease
file with a heartbeat where flock is refused or cannot be trusted (a shared file system), flock's
other errors named as what they are, and no file descriptor left open on an error."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repgeom.probes.run.offload import lock as worker_lock
from repgeom.probes.run.offload.lock import LockLostError, WorkerLock, lock_kind


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _refuse_flock(code: int):
    def flock(fd, operation):
        raise OSError(code, os.strerror(code))
    return flock


def test_a_refused_flock_falls_back_to_the_lease_at_once(tmp_path: Path, monkeypatch, capsys
                                                         ) -> None:
    # NFS without lockd answers ENOLCK: that is not another worker, and nobody is waited for.
    monkeypatch.setattr(fcntl, "flock", _refuse_flock(errno.ENOLCK))
    before = _open_fds()
    held = WorkerLock(tmp_path, kind="flock")
    started = time.monotonic()
    held.acquire(timeout_s=600, what="the run")
    assert time.monotonic() - started < 5
    assert held.kind == "file" and held.lease.is_file()
    assert "not supported here (ENOLCK" in capsys.readouterr().out
    held.release()
    assert not held.lease.exists() and _open_fds() == before


@pytest.mark.parametrize("code", [errno.EIO, errno.EBADF])
def test_other_flock_errors_are_named_and_close_the_file(tmp_path: Path, monkeypatch,
                                                         code: int) -> None:
    monkeypatch.setattr(fcntl, "flock", _refuse_flock(code))
    before = _open_fds()
    started = time.monotonic()
    with pytest.raises(OSError, match=rf"cannot lock .*worker.lock.*\({errno.errorcode[code]}\);"
                                      r" this is not another worker holding it"):
        WorkerLock(tmp_path, kind="flock").acquire(timeout_s=600, what="the run")
    assert time.monotonic() - started < 5  # raised at once, not after follow_timeout_s
    assert _open_fds() == before  # the lock file's descriptor was closed


def test_auto_takes_the_lease_on_a_shared_file_system(tmp_path: Path, monkeypatch) -> None:
    assert lock_kind(tmp_path) in ("flock", "file")
    # /proc/self/mountinfo as a node with its run folders on NFS and Lustre sees it.
    mounts = tmp_path / "mountinfo"
    mounts.write_text(
        "22 1 0:21 / / rw,relatime - overlay overlay rw\n"
        "40 22 0:40 / /scratch rw,relatime - lustre 10.0.0.1@o2ib:/scratch rw,localflock\n"
        "41 22 0:41 / /home rw,relatime - nfs4 server:/home rw,local_lock=flock\n"
    )
    real = Path
    monkeypatch.setattr(worker_lock, "Path", lambda p: mounts if p == "/proc/self/mountinfo"
                        else real(p))
    assert worker_lock.file_system_type(real("/scratch/me/run")) == "lustre"
    assert worker_lock.file_system_type(real("/home/me/run")) == "nfs4"
    assert worker_lock.file_system_type(real("/tmp/run")) == "overlay"
    assert lock_kind(real("/home/me/run")) == "file" and lock_kind(real("/tmp")) == "flock"
    with pytest.raises(ValueError, match="follow_lock must be one of auto, flock, file, got 'nfs'"):
        lock_kind(tmp_path, "nfs")


def test_a_second_worker_respects_a_live_lease_and_names_its_holder(tmp_path: Path) -> None:
    first = WorkerLock(tmp_path, kind="file", stale_s=2.0, heartbeat_s=0.2)
    first.acquire(timeout_s=5, what="the run")
    second = WorkerLock(tmp_path, kind="file", stale_s=2.0, heartbeat_s=0.2)
    # The first beats every 0.2 s: never stale, so the second waits out its limit.
    with pytest.raises(RuntimeError, match=rf"another probe worker \(pid {os.getpid()} on "
                                           rf"{socket.gethostname()}\) follows the run"):
        second.acquire(timeout_s=3, what="the run")
    first.check()  # still the holder
    first.release()
    second.acquire(timeout_s=5, what="the run")  # released: taken at once
    second.release()


def test_a_lease_without_heartbeat_is_taken_over_and_its_holder_stops(tmp_path: Path) -> None:
    first = WorkerLock(tmp_path, kind="file", stale_s=1.0, heartbeat_s=0.2)
    first.acquire(timeout_s=5, what="the run")
    first._stop.set()  # its heartbeat stops, as a hung worker's (or one on a cut-off node) does
    first._beat.join()
    second = WorkerLock(tmp_path, kind="file", stale_s=1.0, heartbeat_s=0.2)
    started = time.monotonic()
    second.acquire(timeout_s=30, what="the run")
    # Taken over once the heartbeat stood still for the stale time, on the second's own clock.
    assert 1.0 <= time.monotonic() - started < 10
    with pytest.raises(LockLostError, match="another probe worker took over"):
        first.check()  # the first writes and deletes nothing more
    first.release()
    assert second.lease.is_file()  # the first left the new holder's lease alone
    second.check()
    second.release()


def test_the_lease_of_a_dead_process_on_this_host_is_taken_at_once(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    lease = tmp_path / worker_lock.LEASE_NAME
    from repgeom.probes.run.offload.host import host_identity

    lease.write_text(json.dumps({**host_identity(), "pid": gone.pid, "token": "x"}))
    held = WorkerLock(tmp_path, kind="file", stale_s=600, heartbeat_s=1)
    started = time.monotonic()
    held.acquire(timeout_s=600, what="the run")
    assert time.monotonic() - started < 5
    held.release()


def test_mountinfo_escapes_are_read_for_the_longest_mount(tmp_path: Path, monkeypatch) -> None:
    # The kernel writes a space, tab, newline and backslash in a mount point as \040, \011,
    # \012 and \134 (octal); a run folder under such an NFS mount must still be found on it.
    mounts = tmp_path / "mountinfo"
    mounts.write_text(
        "22 1 0:21 / / rw,relatime - ext4 /dev/sda1 rw\n"
        "41 22 0:41 / /home/my\\040lab rw - nfs4 server:/home rw\n"
        "42 22 0:42 / /data/a\\134b rw - lustre 10.0.0.1@o2ib:/data rw\n"
        "43 22 0:43 / /data/tab\\011dir rw - gpfs gpfs0 rw\n"
    )
    real = Path
    monkeypatch.setattr(worker_lock, "Path", lambda p: mounts if p == "/proc/self/mountinfo"
                        else real(p))
    assert worker_lock.file_system_type(real("/home/my lab/run")) == "nfs4"
    assert worker_lock.file_system_type(real("/data/a\\b/run")) == "lustre"
    assert worker_lock.file_system_type(real("/data/tab\tdir/run")) == "gpfs"
    assert worker_lock.file_system_type(real("/data/ab/run")) == "ext4"


def test_two_takeovers_of_one_stale_lease_at_once_leave_it_to_the_first(tmp_path: Path,
                                                                        monkeypatch) -> None:
    # Two waiters judge the lease of a dead host stale on the same tick. The first moves it
    # aside and writes its own; the second, which read the dead one just before, then renames.
    # It must not move the first's fresh lease away: the first may already probe and delete.
    from repgeom.probes.run.offload.snapshots import read_json

    lease = tmp_path / worker_lock.LEASE_NAME
    lease.write_text('{"host": "elsewhere", "pid": 1, "token": "dead"}')
    first = WorkerLock(tmp_path, kind="file", stale_s=60, heartbeat_s=30)
    second = WorkerLock(tmp_path, kind="file", stale_s=60, heartbeat_s=30)

    def stale() -> dict:  # what a waiter has seen: the dead lease, its heartbeat still 61 s
        return {"beat": lease.stat().st_mtime, "seen": time.monotonic() - 61, "token": "dead"}

    real_rename = os.rename

    def rename(src, dst):
        if str(dst).endswith(second.token):  # the second's move of the lease it judged stale
            monkeypatch.setattr(os, "rename", real_rename)
            assert first._judge(stale()) is None  # ... comes just after the first's takeover
        return real_rename(src, dst)

    second_saw = stale()
    monkeypatch.setattr(os, "rename", rename)
    assert second._judge(second_saw) is not None  # the second waits: the lease is live
    assert read_json(lease)["token"] == first.token
    first.check()  # still the holder
    assert not list(tmp_path.glob(".worker.lease.stale.*"))
    first.release()
    assert not lease.exists()


def test_one_unreadable_look_at_its_own_lease_does_not_lose_it(tmp_path: Path,
                                                               monkeypatch) -> None:
    # NFS answers EIO (or ESTALE) to one read of the lease: that is not another worker taking
    # it over. The holder keeps the run; it stops only for a lease gone or another's.
    import threading

    held = WorkerLock(tmp_path, kind="file", stale_s=10, heartbeat_s=0.05)
    held.acquire(timeout_s=5, what="the run")
    real_read, failed, beaten = Path.read_text, threading.Event(), threading.Event()

    def read_text(self, *args, **kwargs):
        if self == held.lease and threading.current_thread() is held._beat:
            if not failed.is_set():
                failed.set()
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            beaten.set()  # a beat after the failed one
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    assert beaten.wait(30)
    monkeypatch.setattr(Path, "read_text", real_read)
    held.check()  # still the holder
    assert not held.lost
    held.release()
    assert not held.lease.exists()  # released as its own
