"""Who holds a run, and whether its trainer lives, on `filelock.SoftFileLease`: the worker's
lease (`WorkerLock`), each start's (`hold_start`) and `training_alive` ("The run folder")."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import SoftFileLease, Timeout

from repgeom.files import read_json
from repgeom.probes.run.offload.layout import TRAINING, TRAINING_FIELDS, problem

LOCK_KINDS = ("auto", "flock", "file")  # ``follow_lock``: every kind takes the lease alone
LEASE_NAME = "worker.lease"
LEASE_HEARTBEAT_S, LEASE_STALE_S = 5.0, 60.0  # every worker must use the same stale time
START_LEASE_S = 3600.0  # a start's lease: only asked whether its process is gone (`start_gone`)
POLL_S = 0.5
BEATS_PER_TIMEOUT = 2  # the fewest heartbeats in follow_timeout_s: one late beat is no death
LEASE_READS, LEASE_READ_GAP_S = 3, 0.2  # one ESTALE or EIO on a shared file system is no loss


class LockLostError(RuntimeError):
    """Another worker took this worker's lease over (its heartbeat was judged stale)."""


class WorkerLock:
    """The run's worker lease in `folder`: `acquire`, `check` (the fence), `release`."""

    def __init__(self, folder: Path, *, kind: str = "auto", stale_s: float = LEASE_STALE_S,
                 heartbeat_s: float = LEASE_HEARTBEAT_S) -> None:
        if kind not in LOCK_KINDS:
            raise ValueError(f"follow_lock must be one of {', '.join(LOCK_KINDS)}, got {kind!r}")
        if not 0 < heartbeat_s < stale_s:
            raise ValueError(f"the lease heartbeat ({heartbeat_s} s) must be > 0 and shorter "
                             f"than its stale time ({stale_s} s)")
        self.folder = Path(folder)  # `kind`: checked, and every kind takes the lease alone
        self.path = self.folder / LEASE_NAME
        self.stale_s, self.heartbeat_s = float(stale_s), float(heartbeat_s)
        self.lease: SoftFileLease | None = None
        self.token: str | None = None  # while held: the fencing token

    def holder(self) -> str:
        owner = self.lease.owner if self.lease is not None else None
        return "an unknown holder" if owner is None else f"pid {owner.pid} on {owner.hostname}"

    def acquire(self, timeout_s: float, what: str) -> None:
        """Hold the lease within `timeout_s` s, saying once whom it waits for (`what`: the run)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.lease = SoftFileLease(self.path, lease_duration=self.stale_s,
                                   heartbeat_interval=self.heartbeat_s, thread_local=False)
        deadline, said = time.monotonic() + timeout_s, False
        while True:
            try:
                self.lease.acquire(timeout=0)  # takes a stale lease over (filelock's rules)
            except Timeout:
                pass
            else:
                self.token = self.lease.token
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"another probe worker ({self.holder()}) follows {what} and did not finish "
                    f"within {timeout_s:.0f} s (follow_timeout_s); two would probe each snapshot "
                    "twice. Stop it first, or let it finish")
            if not said:  # e.g. a resumed train.py's worker while the last start's finishes
                print(f"Another probe worker ({self.holder()}) follows {what}; waiting for it to "
                      f"finish (its lease counts as stale after {self.stale_s:.0f} s without a "
                      "heartbeat)", flush=True)
                said = True
            time.sleep(POLL_S)

    def check(self) -> None:
        """`LockLostError` unless it still holds the run (docs/probing.md, "The run folder")."""
        if self.token is None or self.lease is None:
            return
        owner = None
        for attempt in range(LEASE_READS):
            if attempt:
                time.sleep(LEASE_READ_GAP_S)
            owner = self.lease.owner
            if owner is not None:
                break
        lost = self.lease.compromise
        if lost is not None or owner is None or owner.token != self.token:
            seen = lost.reason if lost is not None else (
                f"it names pid {owner.pid} on {owner.hostname}" if owner is not None else
                f"unreadable or removed, {LEASE_READS} reads")
            raise LockLostError(
                f"another probe worker took over {self.path} ({seen}): this worker's heartbeat "
                f"was judged stale (over {self.stale_s:.0f} s); it stops and leaves the run to "
                "that worker")

    def release(self) -> None:
        """Let go (idempotent); filelock removes the marker only while it is ours."""
        lease, self.lease, self.token = self.lease, None, None
        if lease is not None and lease.is_locked:
            lease.release()


def _start_lease(folder: Path, number: int) -> SoftFileLease:
    return SoftFileLease(folder / "starts" / f"{number:09d}.lease", lease_duration=START_LEASE_S,
                         thread_local=False)


def hold_start(folder: Path, number: int) -> SoftFileLease:
    """Training start `number`'s lease, held until released (or the process ends)."""
    lease = _start_lease(folder, number)
    lease.acquire(timeout=0)  # its number is its own (`starts.claim`): nobody else holds it
    return lease


def start_gone(folder: Path, number: int) -> bool:
    """Whether training start `number` is gone for sure (docs/probing.md, "The run folder")."""
    lease = _start_lease(folder, number)
    try:
        lease.acquire(timeout=0)
    except (Timeout, OSError):
        return False
    lease.release()
    return True


class Life(enum.Enum):
    """What the worker reads of the run's trainer (`training_alive`; STOPPED: it may come back)."""

    ALIVE, NOT_STARTED, FINISHED, STOPPED, FAILED, GONE, SILENT, STUCK, MALFORMED = range(9)

    @property
    def certain(self) -> bool:
        """Gone for sure: the worker stops at once (after a last look), not after its timeout."""
        return self in (Life.FAILED, Life.GONE)


@dataclass(frozen=True)
class Verdict:
    life: Life
    why: str = ""


STATES = {"running": Life.ALIVE, "finished": Life.FINISHED, "stopped": Life.STOPPED,
          "failed": Life.FAILED}  # training.json's states


def training_alive(folder: Path, timeout_s: float, now: float | None = None,
                   watch: dict[str, Any] | None = None, newest: int = -1) -> Verdict:
    """What `folder`'s ``training.json`` says of its trainer (`Life`), and why; `watch` (kept by
    the caller): ages on this clock since each change was seen (nodes' clocks differ); `newest`:
    the newest start claimed (`starts.newest`), whose word outranks an older start's beat."""
    beat = read_json(folder / TRAINING)
    if beat is None:
        return Verdict(Life.NOT_STARTED, "no training process has started in this run folder yet")
    bad = problem(beat, TRAINING_FIELDS) or (
        None if beat["state"] in STATES else f"state is not one of {sorted(STATES)}")
    if bad is not None:
        return Verdict(Life.MALFORMED, f"its heartbeat {folder / TRAINING} is malformed: {bad}")
    if beat["number"] < newest:  # a newer start claimed the run and has not beaten yet: the
        # older start's word no longer counts, and the newer one's lease is not asked either
        # (a probe of it between its claim and its hold would take it): waited out, not certain
        return Verdict(Life.NOT_STARTED, f"training start {newest} has begun, no heartbeat yet")
    life = STATES[beat["state"]]
    if life is not Life.ALIVE:
        return Verdict(life, f"the training process {beat['state']}")
    if start_gone(folder, beat["number"]):
        return Verdict(Life.GONE, f"the training process (pid {beat['pid']}) is gone")
    if watch is not None:
        seen = time.monotonic()
        if watch.get("time") != beat["time"]:
            watch.update(time=beat["time"], seen=seen)
        if watch.get("step") != beat["step"]:
            watch.update(step=beat["step"], step_seen=seen)
        age, stuck = seen - watch["seen"], seen - watch["step_seen"]
    else:
        now = time.time() if now is None else now
        age, stuck = now - beat["time"], now - beat["step_time"]
    if age > timeout_s:
        return Verdict(Life.SILENT, f"no heartbeat from the training process for {age:.0f} s")
    if stuck > timeout_s:
        return Verdict(Life.STUCK, f"the training process beats but has been at step "
                                   f"{beat['step']} for {stuck:.0f} s (no progress)")
    return Verdict(Life.ALIVE)


def check_heartbeat(heartbeat_s: float, timeout_s: float) -> None:
    """A ValueError unless `timeout_s` holds `BEATS_PER_TIMEOUT` heartbeats of `heartbeat_s`."""
    if timeout_s < BEATS_PER_TIMEOUT * heartbeat_s:
        raise ValueError(
            f"the worker's timeout ({timeout_s:g} s: probe.worker.timeout_s, or probe.py's "
            f"follow_timeout_s) must be at least {BEATS_PER_TIMEOUT} heartbeats of the training "
            f"run (probe.worker.heartbeat_s={heartbeat_s:g} s), or a late beat reads as a dead "
            f"run; raise the timeout to >= {BEATS_PER_TIMEOUT * heartbeat_s:g} s or lower "
            "heartbeat_s")
