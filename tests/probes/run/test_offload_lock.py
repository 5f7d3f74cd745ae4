"""One probe worker per run, and whether a trainer lives, on `filelock.SoftFileLease`
(`repgeom.probes.run.offload.lease`): a live lease is respected and its holder named, an
unbeaten one is taken over on the waiter's own clock, a dead holder's at once, and the fence
(`WorkerLock.check`) raises once another holds the run. The holders here are real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filelock import SoftFileLease

from repgeom.probes.run.offload import lease as lease_module
from repgeom.probes.run.offload.lease import Life, LockLostError, WorkerLock, training_alive

SRC = str(Path(lease_module.__file__).parents[4])


def _holder(folder: Path, *, then: str, stale_s: float = 60.0, heartbeat_s: float = 5.0
            ) -> subprocess.Popen:
    """A worker process that takes the lease of `folder`, says so, then `then`: ``exit`` (dies
    without letting go: os._exit), ``stop`` (SIGSTOP: a paused holder, no heartbeat) or
    ``wait`` (holds it until killed)."""
    code = (
        "import os, signal, sys, time\n"
        "from repgeom.probes.run.offload.lease import WorkerLock\n"
        f"lock = WorkerLock(__import__('pathlib').Path({str(folder)!r}), stale_s={stale_s}, "
        f"heartbeat_s={heartbeat_s})\n"
        "lock.acquire(5, 'the run')\n"
        "print(lock.token, flush=True)\n"
        f"then = {then!r}\n"
        "if then == 'exit': os._exit(0)\n"
        "if then == 'stop':\n"
        "    os.kill(os.getpid(), signal.SIGSTOP)\n"
        "    try:\n"
        "        lock.check()\n"
        "        print('held', flush=True)\n"
        "    except Exception as error:\n"
        "        print(type(error).__name__, flush=True)\n"
        "time.sleep(600)\n")
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": SRC})
    process.token = process.stdout.readline().strip()  # type: ignore[attr-defined]
    assert process.token, "the holder process did not take the lease"
    return process


def _end(process: subprocess.Popen) -> None:
    process.kill()
    process.wait()


def test_a_live_lease_is_respected_and_its_holder_named(tmp_path: Path, capsys) -> None:
    holder = _holder(tmp_path, then="wait")
    try:
        with pytest.raises(RuntimeError, match=f"another probe worker \\(pid {holder.pid} on "):
            WorkerLock(tmp_path).acquire(timeout_s=1.0, what="the run")
        assert "waiting for it to finish" in capsys.readouterr().out
    finally:
        _end(holder)


def test_the_lease_of_a_dead_process_on_this_host_is_taken_at_once(tmp_path: Path) -> None:
    holder = _holder(tmp_path, then="exit")
    holder.wait()
    lock = WorkerLock(tmp_path)
    started = time.monotonic()
    lock.acquire(timeout_s=30, what="the run")  # no 60 s wait: its process is gone
    try:
        assert time.monotonic() - started < 5 and lock.token != holder.token
        lock.check()
    finally:
        lock.release()
    assert not lock.path.exists()


def test_a_paused_holders_lease_is_taken_over_and_the_fence_then_refuses(tmp_path: Path) -> None:
    holder = _holder(tmp_path, then="stop", stale_s=1.0, heartbeat_s=0.5)  # SIGSTOP: no beats
    try:
        lock = WorkerLock(tmp_path, stale_s=1.0, heartbeat_s=0.5)
        lock.acquire(timeout_s=30, what="the run")  # after 1 s unchanged, on this clock
        try:
            assert lock.lease.owner.token == lock.token != holder.token
            os.kill(holder.pid, signal.SIGCONT)  # the holder wakes up and runs its fence
            assert holder.stdout.readline().strip() == "LockLostError"
            lock.check()  # the run is still ours
            # and ours refuses in turn once another holds it
            lock.lease.force_break()
            SoftFileLease(lock.path, lease_duration=1.0, heartbeat_interval=0.5).acquire(0)
            with pytest.raises(LockLostError, match="another probe worker took over"):
                lock.check()
        finally:
            lock.release()
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        _end(holder)


def test_one_unreadable_look_at_its_own_lease_does_not_lose_it(tmp_path: Path,
                                                               monkeypatch) -> None:
    # One ESTALE or EIO on a shared file system (the marker reads as missing) is not a takeover.
    lock = WorkerLock(tmp_path)
    lock.acquire(timeout_s=5, what="the run")
    reads = []
    real = type(lock.lease).owner

    def flaky(self):
        reads.append(1)
        return None if len(reads) < 3 else real.fget(self)

    monkeypatch.setattr(type(lock.lease), "owner", property(flaky))
    monkeypatch.setattr(lease_module, "LEASE_READ_GAP_S", 0.01)
    try:
        lock.check()  # two failed reads, then its own token
        assert len(reads) == 3
        reads.clear()
        monkeypatch.setattr(type(lock.lease), "owner", property(lambda self: None))
        with pytest.raises(LockLostError, match="unreadable or removed, 3 reads"):
            lock.check()
    finally:
        monkeypatch.undo()
        lock.release()


def test_bad_settings_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="follow_lock must be one of auto, flock, file"):
        WorkerLock(tmp_path, kind="nfs")
    with pytest.raises(ValueError, match="shorter than its stale time"):
        WorkerLock(tmp_path, stale_s=5, heartbeat_s=5)


def test_a_trainer_is_gone_at_once_when_its_start_lease_has_no_live_process(tmp_path) -> None:
    # The worker decides on Life, never on a message's wording.
    from repgeom.probes.run.offload import snapshots

    run_dir = tmp_path / "run"
    writer = snapshots.SnapshotWriter(run_dir, heartbeat_s=60, min_free_gb=0)
    writer.start({"wandb": None})
    folder = writer.folder
    try:
        assert training_alive(folder, 600).life is Life.ALIVE
        writer._lease.release()  # as the kernel's end of its process lets filelock find it
        verdict = training_alive(folder, 600)
        assert verdict.life is Life.GONE and verdict.life.certain
    finally:
        writer._stop.set()
        writer._release()
    snapshots.write_json(folder / snapshots.TRAINING, {
        **snapshots.read_json(folder / snapshots.TRAINING), "time": float("nan")})
    assert training_alive(folder, 600).life is Life.MALFORMED  # NaN: never "alive for ever"
