"""The world of `test_offload_model`: one run folder, a training process and probe workers, all
in this process and driven one event at a time, with the real files, the real lock, the real
snapshot writer and the real worker loop (`Follower.run`); only the model, the probe and the
table are stand-ins (a 3-number "model" whose probe row is its sum, in a JSON table read, merged
and renamed into place as the real one is), so that an event costs milliseconds.

Each worker runs `Follower.run` in a thread of its own, and only one thread runs at a time: a
worker stops ("parks") at its yield points, and the driver resumes it. The yield points are the
worker's own steps, found through the names it calls: each pass over the snapshot folder
(``snapshots.snapshots``), each sleep (``time.sleep`` of the worker and its lease: the clock of
the world moves by that much), and each write into place (`repgeom.files.check_fence`, just
before the fenced rename; ``os.replace`` on code without fencing). At a yield point the driver
can kill the worker (it raises, and its lease is left as kill -9 leaves it: the marker file kept,
no heartbeat), pause it (it is not resumed, and its lease does not beat), or
fill the disk (its next write fails with ENOSPC).

"Never two holders" is checked where it matters, at each rename and deletion a worker performs
in the run folder (``os.replace``, ``os.rename``, ``shutil.rmtree``: `_holds`): the lease must
name that worker's token at that moment. A worker whose fence was skipped, or that lost the run
and still writes, is caught as it writes, not only by who claims the lock between events.

Clocks: the worker's monotonic clock is the world's (`World.clock`), moved by sleeps and by the
driver, so "paused past the lease" is one call; so is the clock on which filelock's
`SoftFileLease` judges a lease stale (its recovery module's ``time``, patched: a private module
of filelock, patched in this test only, because filelock offers no clock to inject). A lease
beats when the driver says so (`World.beat`), for every live, unpaused worker, as its heartbeat
thread would; filelock's own heartbeat thread waits longer than an example lasts.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import filelock._soft._exclusive._recovery as filelock_recovery
import torch

from repgeom import files
from repgeom.probes.core import table
from repgeom.probes.run.offload import follow as follow_module
from repgeom.probes.run.offload import lease as lease_module
from repgeom.probes.run.offload import snapshots

STALE_S = 60.0
SPIN_LIMIT = 25
"""Passes over the folder without a write and without a sleep: more is a busy loop."""
_local = threading.local()


class Killed(BaseException):
    """Raised in a worker thread at a yield point: kill -9."""


class Violation(AssertionError):
    """An invariant broke; the message says which and how."""


@functools.lru_cache(maxsize=1)
def dead_pid() -> int:
    """A pid that no longer runs: a killed trainer's, in its heartbeat."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


class Hand:
    """One probe worker (a `Follower` in a thread of its own)."""

    def __init__(self, world: World, name: str, kind: str, keep: bool) -> None:
        self.world, self.name, self.kind = world, name, kind
        # the job starts: what the constructor reads, it reads now
        self.follower = follow_module.Follower(world.run_dir, device=torch.device("cpu"),
                                               timeout_s=1e6, keep_snapshots=keep, wandb=False,
                                               lock=kind)
        self.go, self.parked = threading.Semaphore(0), threading.Semaphore(0)
        self.at, self.outcome = "new", None
        self.ended_while_trained = False  # it ended while the newest training start lived
        self.kill = self.full = self.paused = False
        self.idle = 0  # passes since its last write or sleep
        self.thread = threading.Thread(target=self._main, name=f"worker-{name}", daemon=True)
        self.thread.start()

    @property
    def alive(self) -> bool:
        return self.outcome is None

    def _main(self) -> None:
        _local.hand = self
        self.go.acquire()
        try:
            if self.kill:
                raise Killed
            self.outcome = ("done", self.follower.run())
        except Killed:  # kill -9: its lease file stays, unbeaten
            _kill_lease(self.follower.lock)
            self.outcome = ("killed", None)
        except BaseException as error:  # noqa: BLE001 - the driver judges it
            self.outcome = ("error", error)
        finally:
            self.ended_while_trained = self.world.trainer_alive()
            self.at = "end"
            self.parked.release()

    def park(self, where: str) -> None:
        """In the worker's thread: stop here until the driver resumes it."""
        self.at = where
        self.parked.release()
        self.go.acquire()
        if self.kill:
            raise Killed
        if self.full and where == "write":
            raise OSError(errno.ENOSPC, "No space left on device (the world's disk is full)")

    def resume(self) -> None:
        """In the driver: let the worker run to its next yield point (or its end)."""
        if not self.alive:
            return
        self.go.release()
        if not self.parked.acquire(timeout=60):
            raise Violation(f"worker {self.name} is stuck outside its yield points ({self.at})")


def _hand() -> Hand | None:
    return getattr(_local, "hand", None)


def lease_token(folder: Path) -> str | None:
    """The token the lease marker in `folder` names (filelock's ``key=value`` lines), or None."""
    try:
        lines = (folder / lease_module.LEASE_NAME).read_text().splitlines()
    except OSError:
        return None
    return next((line[6:] for line in lines if line.startswith("token=")), None)


def _kill_lease(lock: lease_module.WorkerLock) -> None:
    """kill -9 of a holder: its heartbeat stops and its marker stays as it was (here: released,
    then written back with its bytes and times, as a dead process leaves it)."""
    lock.held = False
    held = lock.lease
    if held is None or not held.is_locked:
        return
    path = lock.path
    ours = lease_token(lock.folder) == lock.token  # False where the marker is gone meanwhile
    if ours:
        data, info = path.read_bytes(), path.stat()
    lock.lease = None
    held.release()
    if ours and not path.exists():
        path.write_bytes(data)
        os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


ROWS = "rows.json"
"""The stand-in table beside the real one: step -> value, read, merged and written whole
(`repgeom.files.atomic_write_text`, a fenced rename), as the table is, without pandas' cost."""


def read_rows(run_dir: Path) -> dict[int, float]:
    try:
        return {int(k): v for k, v in
                json.loads((table.probe_dir(run_dir) / ROWS).read_text()).items()}
    except FileNotFoundError:
        return {}


class FakeRecorder:
    """`ProbeRecorder`'s part the worker calls: one row per step, in `ROWS`."""

    settings = None
    pairs: list = []

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def record(self, step: int, output: Any, runs: list, **_: Any) -> None:
        rows = read_rows(self.run_dir)
        rows[step] = output.value
        table.probe_dir(self.run_dir).mkdir(parents=True, exist_ok=True)
        files.atomic_write_text(table.probe_dir(self.run_dir) / ROWS, json.dumps(rows))

    def finish(self, *args: Any, **kwargs: Any) -> float:
        return 0.0

    def state_dict(self) -> list:
        return []

    def load_state_dict(self, state: Any) -> None:
        pass


class World:
    """The run folder, its trainer and its workers (see the module)."""

    def __init__(self, run_dir: Path, steps: tuple[int, ...]) -> None:
        self.run_dir, self.steps = run_dir, steps
        self.folder = snapshots.snapshot_dir(run_dir)
        self.clock = 1000.0
        self.hands: list[Hand] = []
        self.violations: list[str] = []
        self.performed: list[tuple[str, str, str]] = []  # (worker, operation, file): `_holds`
        self.generations: dict[int, tuple[int, float]] = {}  # gen -> (step, marker time)
        self.next_gen = 0
        self.disk_full = False
        self.dead = dead_pid()
        # the trainer
        self.start_no, self.writer = 0, None
        self.next_i = self.ckpt_i = 0
        self.finished = False
        self.hung: tuple[snapshots.SnapshotWriter, int, int] | None = None  # (writer, i, start)
        self.trained: dict[int, int] = {}  # step -> the start whose weights are the run's now
        self.no_space: set[int] = set()  # steps whose latest training skipped its snapshot
        self.latest: dict[int, float] = {}  # step -> the marker time of its newest snapshot
        self.corrupted: dict[int, float] = {}  # step -> marker time of a corrupted snapshot
        self.seen_rows: set = set()
        self.seen_done: set = set()
        World.active = self

    # -- patches: install once for a session of examples ----------------------------------------

    @staticmethod
    def install(patch: Any) -> None:
        """Patch the names the worker and the trainer call (see the module), for every world."""
        monotonic = types.SimpleNamespace(
            monotonic=lambda: World.active.clock, sleep=_sleep, time=time.time,
            perf_counter=time.perf_counter)
        patch.setattr(lease_module, "time", monotonic)
        patch.setattr(follow_module, "time", monotonic)
        patch.setattr(filelock_recovery, "time", monotonic)
        original_scan = snapshots.snapshots
        patch.setattr(snapshots, "snapshots", lambda folder: (_pass(), original_scan(folder))[1])
        if hasattr(files, "check_fence"):  # fenced code: the yield point is before the check
            original_check = files.check_fence
            patch.setattr(files, "check_fence", lambda: (_write(), original_check())[1])
        else:
            original_replace = os.replace
            patch.setattr(os, "replace", lambda *a, **k: (_write(), original_replace(*a, **k))[1])
        original_init, original_release = lease_module.WorkerLock.__init__, \
            lease_module.WorkerLock.release

        original_acquire = lease_module.WorkerLock.acquire

        def init(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            self.heartbeat_s = STALE_S - 1  # real seconds: beats come from the driver

        def acquire(self, *args, **kwargs):
            original_acquire(self, *args, **kwargs)
            self.held = True  # for `World.holders`

        def release(self):
            self.held = False
            hand = _hand()
            if hand is not None and hand.kill:  # kill -9: the marker stays, unbeaten
                _kill_lease(self)
                return
            original_release(self)

        for module, name in ((os, "replace"), (os, "rename"), (shutil, "rmtree")):
            patch.setattr(module, name, _performed(name, getattr(module, name)))

        patch.setattr(lease_module.WorkerLock, "__init__", init)
        patch.setattr(lease_module.WorkerLock, "release", release)
        patch.setattr(lease_module.WorkerLock, "acquire", acquire)
        patch.setattr(follow_module.Follower, "_prepare", _prepare)
        patch.setattr(follow_module, "gpt_from_checkpoint", _model)
        patch.setattr(follow_module, "probe_gpt", _probe)
        patch.setattr(follow_module, "checkpoint_masking", lambda ckpt, vocab: None)
        # No fsync: the world is never power-cut (kills are played by the threads)
        patch.setattr(os, "fsync", lambda fd: None)
        patch.setattr(snapshots, "_free_bytes",
                      lambda folder: 0 if World.active.disk_full else 1 << 40)

    active: World

    # -- the trainer ----------------------------------------------------------------------------

    def trainer_alive(self) -> bool:
        return self.writer is not None

    def requeue(self) -> None:
        """A training start (the first, or a requeued one after a kill): resumes from the last
        checkpoint, so the steps after it are replayed (with other weights: a new start)."""
        if self.writer is not None or self.finished:
            return
        self.start_no += 1
        self.writer = snapshots.SnapshotWriter(self.run_dir, heartbeat_s=3600, min_free_gb=0)
        self.writer.start({"wandb": None})
        self.next_i = self.ckpt_i

    def train_step(self) -> None:
        """Train to the next probe step and snapshot it (checkpoint every other step)."""
        if self.writer is None or self.next_i >= len(self.steps):
            return
        step = self.steps[self.next_i]
        model = torch.nn.Module()
        model.w = torch.nn.Parameter(torch.full((3,), step + 0.25 * self.start_no))
        gen = self.next_gen
        self.next_gen += 1
        path = snapshots.step_dir(self.folder, step)
        before = snapshots.read_json(path / snapshots.COMPLETE)
        self.writer.snapshot(step, model, {"hyper_parameters": {
            "model": {}, "vocab": {}, "masking": {}}, "gen": gen})
        self.writer.wait()
        marker = snapshots.read_json(path / snapshots.COMPLETE)
        self.trained[step] = self.start_no
        if self.disk_full:
            self.no_space.add(step)
        else:
            self.no_space.discard(step)
        if marker is not None and marker != before:
            self.generations[gen] = (step, float(marker["time"]))
            self.latest[step] = float(marker["time"])
        self.next_i += 1
        if self.next_i % 2 == 0:
            self.ckpt_i = self.next_i

    def hang_and_requeue(self) -> None:
        """The training start hangs (a node that stops answering) and SLURM requeues the job:
        a new start begins while the old one still lives and may train on later
        (`hung_step`). Its weights are an abandoned trajectory's."""
        if self.writer is None or self.finished or self.hung is not None:
            return
        self.hung = (self.writer, self.next_i, self.start_no)
        self.writer = None
        self.requeue()

    def hung_step(self) -> None:
        """The hung start wakes and writes its next probe step, with its own weights."""
        if self.hung is None:
            return
        writer, i, start_no = self.hung
        if i >= len(self.steps):
            return
        model = torch.nn.Module()
        model.w = torch.nn.Parameter(torch.full((3,), self.steps[i] + 0.25 * start_no))
        writer.snapshot(self.steps[i], model, {"hyper_parameters": {
            "model": {}, "vocab": {}, "masking": {}}, "gen": -1})
        writer.wait()
        self.hung = (writer, i + 1, start_no)

    def close_hung(self, *, finished: bool) -> None:
        """The hung start reaches its end while the newer one trains: it finishes (its own last
        step) or fails, and ends; being superseded, it must write nothing of the run's state."""
        if self.hung is None:
            return
        writer = self.hung[0]
        try:
            writer.close(final_step=self.steps[-1] if finished else None)
        finally:
            self.hung = None

    def end_hung(self) -> None:
        """The hung start dies at last (the kernel lets go of its start lock)."""
        if self.hung is None:
            return
        writer = self.hung[0]
        writer._stop.set()
        if writer._heartbeat is not None:
            writer._heartbeat.join()
        writer._release()
        self.hung = None

    def kill_trainer(self, mid_write: bool) -> None:
        """kill -9 of training: its heartbeat names a pid that is gone; maybe a cut write."""
        if self.writer is None:
            return
        self.writer._stop.set()
        if self.writer._heartbeat is not None:
            self.writer._heartbeat.join()
        self.writer._release()  # filelock finds a dead process's start lease gone
        number, self.writer = self.writer.number, None
        beat = snapshots.read_json(self.folder / snapshots.TRAINING) or {}
        snapshots.write_json(self.folder / snapshots.TRAINING, {**beat, "pid": self.dead})
        if mid_write and self.next_i < len(self.steps):
            cut = self.folder / f".step_{self.steps[self.next_i]:09d}.{number}-{self.dead}.tmp"
            cut.mkdir(parents=True, exist_ok=True)
            (cut / snapshots.WEIGHTS).write_bytes(b"PK\x03\x04 half a zip")

    def finish_training(self) -> None:
        if self.finished:
            return
        self.requeue()
        while self.next_i < len(self.steps):
            self.train_step()
        self.writer.close(final_step=self.steps[-1])
        self.writer, self.finished = None, True

    # -- the workers ----------------------------------------------------------------------------

    def beat(self) -> None:
        """The heartbeat of every live, unpaused worker that holds the lease."""
        lease = self.folder / lease_module.LEASE_NAME
        token = lease_token(self.folder)
        for hand in self.hands:
            if hand.alive and not hand.paused and token is not None \
                    and token == hand.follower.lock.token:
                now = time.time_ns() + int(self.clock * 1e9)
                os.utime(lease, ns=(now, now))

    def holders(self) -> list[str]:
        """The workers that hold the run now: their lease was acquired, and the marker names
        them."""
        token = lease_token(self.folder)
        held = []
        for hand in self.hands:
            lock = hand.follower.lock
            if not hand.alive or not getattr(lock, "held", False):
                continue
            if token is not None and token == lock.token:
                held.append(f"{hand.name} ({hand.kind})")
        return held

    def run_worker(self, hand: Hand, limit: int = 400, steps: int | None = None) -> None:
        """Resume `hand` until it sleeps, ends, or is paused, or for `steps` yield points (it
        may stop in the middle of a write); a busy loop is a violation."""
        for _ in range(limit if steps is None else steps):
            if not hand.alive or hand.paused:
                return
            hand.resume()
            self.check_flags()
            if hand.at in ("sleep", "end"):
                return
        if steps is not None:
            return
        raise Violation(f"worker {hand.name} ran {limit} steps without sleeping or ending")

    def check_flags(self) -> None:
        if self.violations:
            raise Violation("; ".join(dict.fromkeys(self.violations)))

    def check(self) -> None:
        """The invariants that hold after every event (the module of the test lists them)."""
        self.check_flags()
        held = self.holders()
        if len(held) > 1:
            raise Violation(f"two holders of the run: {held}")
        rows = set(read_rows(self.run_dir))
        lost = self.seen_rows - rows
        if lost:
            raise Violation(f"the table lost rows {sorted(lost)}")
        self.seen_rows = rows
        state = snapshots.read_json(self.folder / snapshots.WORKER) or {}
        done = set((state.get("done") or {}).items())
        forgotten = {s for s, _ in self.seen_done} - {s for s, _ in done}
        if forgotten:
            raise Violation(f"worker.json forgot probed steps {sorted(forgotten)}")
        self.seen_done = done


def _performed(name: str, original: Any) -> Any:
    """`original` (``os.replace``, ``os.rename``, ``shutil.rmtree``), which first records, when
    a worker calls it on the run folder, whether that worker holds the lease at that moment."""

    def call(path: Any, *args: Any, **kwargs: Any) -> Any:
        _holds(name, Path(path))
        return original(path, *args, **kwargs)

    return functools.update_wrapper(call, original)  # its attributes too (avoids_symlink_...)


def _holds(operation: str, path: Path) -> None:
    """Only the worker the lease names renames or deletes in the run folder (the lease file
    itself aside: a waiter moves a stale one away to take it over)."""
    hand = _hand()
    if hand is None or lease_module.LEASE_NAME in path.name:
        return
    world = hand.world
    if world.run_dir not in path.parents:
        return
    token = lease_token(world.folder)
    world.performed.append((hand.name, operation, path.name))
    if token is None or token != hand.follower.lock.token:
        world.violations.append(
            f"worker {hand.name} ({hand.kind}) ran {operation} on {path.name} while the lease "
            f"names {token or 'nobody'}, not its token: two holders of the run")


def _sleep(seconds: float) -> None:
    hand = _hand()
    if hand is None:
        time.sleep(seconds)
        return
    hand.world.clock += seconds
    hand.idle = 0
    hand.park("sleep")


def _pass() -> None:
    hand = _hand()
    if hand is None:
        return
    hand.idle += 1
    if hand.idle > SPIN_LIMIT:
        hand.world.violations.append(
            f"worker {hand.name} spins: {hand.idle} passes without a write or a sleep")
        hand.kill = True
    hand.park("pass")


def _write() -> None:
    hand = _hand()
    if hand is None:
        return
    hand.idle = 0
    hand.park("write")


def _prepare(self, path: Path, ckpt: dict) -> None:
    self.spec = types.SimpleNamespace(batch_size=1, to_dict=lambda: {})
    self.recorder = FakeRecorder(self.run_dir)


def _model(ckpt: dict, device: Any) -> Any:
    return types.SimpleNamespace(model=(ckpt["state_dict"]["model.w"].clone(), ckpt["gen"]),
                                 vocab=None)


def _probe(model: Any, *args: Any, **kwargs: Any) -> Any:
    weights, gen = model
    world = World.active
    step, written = world.generations.get(gen, (None, None))
    state = snapshots.read_json(world.folder / snapshots.WORKER) or {}
    if step is not None and (state.get("done") or {}).get(str(step)) == written:
        world.violations.append(f"step {step}'s snapshot (time {written}) probed twice: "
                                "worker.json had it already")
    return types.SimpleNamespace(value=float(weights.double().sum()), warnings=[])
