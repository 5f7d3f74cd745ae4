"""The training side (rank 0) of ``probe.offload``: `SnapshotWriter` writes each probe step's
weights as ``<run>/probes/snapshots/step_<N>/`` in the background, whole or not at all, and
``training.json``; docs/probing.md ("Probes off the training clock") states the guarantees."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from repgeom.probes.run.offload import layout, lease, starts

log = logging.getLogger(__name__)


def __getattr__(name: str) -> Any:
    """The layout's names (`repgeom.probes.run.offload.layout`) as ``snapshots.<name>`` too."""
    return getattr(layout, name)

OFFLOAD_MODES = ("snapshots", "worker")
"""``probe.offload``'s values besides null (in-process): write snapshots; also start a worker."""


def check_offload(value: str | None) -> str | None:
    """``probe.offload`` checked: null, ``snapshots`` or ``worker``; a ValueError names it."""
    if value is not None and value not in OFFLOAD_MODES:
        raise ValueError(f"probe.offload must be null (probe in the training process) or one "
                         f"of {', '.join(OFFLOAD_MODES)}, got {value!r}")
    return value


def _free_bytes(folder: Path) -> int | None:
    """Free bytes on `folder`'s file system; None when it cannot be asked."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


class RunNotRecordedError(RuntimeError):
    """Training finished, but ``done.json`` or ``training.json`` could not be written."""


class SnapshotWriter:
    """Writes the snapshots and ``training.json`` of `run_dir` (rank 0 only; see the module)."""

    def __init__(self, run_dir: Path, *, heartbeat_s: float, min_free_gb: float = 1.0) -> None:
        if heartbeat_s <= 0:
            raise ValueError(f"probe.worker.heartbeat_s must be > 0, got {heartbeat_s}")
        if min_free_gb < 0:
            raise ValueError(f"probe.worker.min_free_gb must be >= 0 GB, got {min_free_gb}")
        self.min_free_bytes = int(min_free_gb * 1e9)
        self.skipped: dict[int, str] = {}  # step -> why its snapshot was not written
        self.folder = layout.snapshot_dir(run_dir)
        self.heartbeat_s = heartbeat_s
        self.step = 0  # the training step, for the heartbeat (`progress`)
        self.step_time = time.time()  # when training reached `step`: the worker judges progress
        self.rank = 0  # the writing process's global rank, in each completion marker
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot")
        self._pending: Future | None = None
        self._buffers: dict[str, torch.Tensor] | None = None
        self._event: Any = None  # the CUDA event of a copy the next optimizer step waits for
        self._stream: Any = None
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self.start_id = uuid.uuid4().hex  # names this training start in each snapshot's marker
        self.number = -1  # this start's place among the run's starts (`starts.claim`, in start())
        self._lease: Any = None  # held while this start lives (`lease.start_gone` asks it)
        self._said_superseded = False

    def start(self, run_info: dict[str, Any]) -> None:
        """Claim this start, sweep what ended starts left, write ``run.json``, start beating."""
        self.folder.mkdir(parents=True, exist_ok=True)
        marker = self.folder / layout.MARKER
        if not marker.is_file():
            marker.write_text("Made by repgeom (probe.offload): snapshots of the weights for a "
                              "probe worker; deleted once probed.\n")
        self._release()
        self.number = starts.claim(self.folder)
        self._lease = lease.hold_start(self.folder, self.number)
        for _, path in layout.snapshots(self.folder)[1]:
            writer = layout.writer_of(path)
            if writer is None or (writer < self.number and starts.gone(self.folder, writer, path)):
                layout.remove_snapshot(path)  # a write cut by a kill: rewritten when its step comes
        for path in layout.leftovers(self.folder, min_age_s=layout.SETTLED_S):
            layout.remove_snapshot(path)  # probed, and its worker killed while deleting it
        (self.folder / layout.DONE).unlink(missing_ok=True)
        layout.write_json(self.folder / layout.RUN, run_info)
        self._stop.clear()
        self._beat("running")
        self._heartbeat = threading.Thread(target=self._beat_loop, name="snapshot-heartbeat",
                                           daemon=True)
        self._heartbeat.start()

    def progress(self, step: int, *, busy: bool = False) -> None:
        """Training is at `step` (`busy`: still there but working, which counts as progress too)."""
        if step != self.step or busy:
            self.step, self.step_time = int(step), time.time()

    def is_current(self) -> bool:
        """Whether this start is still the run's newest: the fence of every shared write."""
        return self.number < 0 or starts.newest(self.folder) <= self.number

    def _beat(self, state: str) -> None:
        """``training.json`` in `state`, unless a newer start has begun (it writes its own)."""
        if not self.is_current():
            self._say_superseded()
            return
        layout.write_json(self.folder / layout.TRAINING, {
            "pid": os.getpid(), "step": int(self.step), "step_time": self.step_time,
            "time": time.time(), "state": state, "heartbeat_s": self.heartbeat_s,
            "number": self._number()})

    def _number(self) -> int:
        """This start's number; a writer that claimed none writes for the newest start. A start
        that claimed one writes its own, never a newer start's: one superseded between its
        fence check and its write is then still told apart (`state.read_done`)."""
        return self.number if self.number >= 0 else max(starts.newest(self.folder), 0)

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_s) and self.is_current():
            try:
                self._beat("running")
            except OSError:  # a full or vanished disk: the worker will see no heartbeat
                pass

    def close(self, *, final_step: int | None, stopped: bool = False,
              skipped: dict[int, str] | None = None) -> None:
        """Wait for the last write, stop beating, record how this start ended (`finish` raises)."""
        failed = False
        try:
            self.wait()
        except Exception:
            failed = True
            raise
        finally:
            self._stop.set()
            if self._heartbeat is not None:
                self._heartbeat.join()
                self._heartbeat = None
            self._pool.shutdown(wait=True)
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot")
            try:
                if final_step is None or failed:
                    if self.number >= 0:  # without a number (its start failed before its
                        # claim, or never began) it would speak for the newest start, another's
                        self._try_beat("stopped" if stopped and not failed else "failed")
                else:
                    self.finish(final_step, skipped)
            finally:
                self._release()  # after its last word: this start has ended

    def _release(self) -> None:
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    def finish(self, final_step: int, skipped: dict[int, str] | None = None) -> None:
        """Record the run finished at `final_step`, else `RunNotRecordedError` ("Full disk")."""
        self.progress(final_step)
        if not self.is_current():  # a superseded start's end is not the run's
            self._say_superseded()
            return
        path = self.folder / layout.DONE
        try:
            gaps = {**(skipped or {}), **self.skipped}
            layout.write_json(path, {
                "step": int(final_step), "time": time.time(), "number": self._number(),
                "skipped_for_space": {str(k): v for k, v in sorted(gaps.items())}})
            path = self.folder / layout.TRAINING
            self._beat("finished")
        except OSError as error:
            self._try_beat("stopped")
            free = _free_bytes(path.parent)
            fix = ("free some space on that disk (or raise the quota)"
                   if error.errno in (errno.ENOSPC, errno.EDQUOT) else "make that folder writable")
            raise RunNotRecordedError(
                f"training finished at step {final_step} and its checkpoints are saved, but the "
                f"run could not be recorded as finished: writing {path.name} in {path.parent} "
                f"failed ({error.strerror or error}; "
                f"{'unknown' if free is None else f'{free / 1e9:.2f} GB'} free there). To finish "
                f"it, {fix}, then run the same train.py command again: it resumes the finished "
                f"run without training and writes {path.name}; then its probe worker "
                "(probe.offload=worker), or python probe.py follow=<the run folder>, probes what "
                "is left") from error

    def _try_beat(self, state: str) -> None:
        """`_beat`, where a full disk only logs: the caller has a more important error."""
        try:
            self._beat(state)
        except OSError as error:
            log.warning("could not mark %s %r (%s)", self.folder / layout.TRAINING, state,
                        error.strerror or error)

    def waiting(self) -> list[int]:
        """Steps of the complete snapshots no worker has probed yet (still on disk)."""
        return [step for step, _ in layout.snapshots(self.folder)[0]]

    def wait(self) -> float:
        """Block until the snapshot being written is on disk; the seconds waited."""
        if self._pending is None:
            return 0.0
        started = time.perf_counter()
        try:
            self._pending.result()
        finally:
            self._pending = None
        return time.perf_counter() - started

    def snapshot(self, step: int, model: torch.nn.Module, meta: dict[str, Any]) -> float:
        """Copy `model`'s weights now, write them with `meta` in the background; seconds waited."""
        waited = self.wait()
        weights, event = self._copy(model.state_dict())
        self._pending = self._pool.submit(self._write, step, weights, event, meta)
        return waited

    def _copy(self, state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], Any]:
        tensors = {k: v.detach() for k, v in state.items()}
        cuda = [t for t in tensors.values() if t.is_cuda]
        if self._buffers is None or self._buffers.keys() != tensors.keys():
            pin = bool(cuda) and torch.cuda.is_available()
            self._buffers = {k: torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
                             for k, t in tensors.items()}
        if not cuda:  # CPU training: a plain copy, here, before the next optimizer step
            for key, tensor in tensors.items():
                self._buffers[key].copy_(tensor)
            return self._buffers, None
        device = cuda[0].device
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=device)
        self._stream.wait_stream(torch.cuda.current_stream(device))  # after step N's update
        with torch.cuda.stream(self._stream):
            for key, tensor in tensors.items():
                self._buffers[key].copy_(tensor, non_blocking=True)
        event = torch.cuda.Event()
        event.record(self._stream)
        self._event = (event, device)
        return self._buffers, event

    def before_optimizer_step(self) -> None:
        """Make the coming optimizer step wait (on the GPU) for a copy still in flight."""
        if self._event is not None:
            event, device = self._event
            torch.cuda.current_stream(device).wait_event(event)
            self._event = None

    def _write(self, step: int, weights: dict[str, torch.Tensor], event: Any,
               meta: dict[str, Any]) -> None:
        if event is not None:
            event.synchronize()  # the side-stream copy into the pinned buffers is done
        folder = layout.step_dir(self.folder, step)
        marker = layout.read_json(folder / layout.COMPLETE)
        if self._superseded(step) or starts.keeps(marker, self.number, self.start_id):
            return  # a newer start writes the run's snapshots; ours stays immutable
        needed = sum(t.nbytes for t in weights.values())
        free = _free_bytes(self.folder)
        if free is not None and needed + self.min_free_bytes > free:
            self._skip(step, f"{needed / 1e9:.2f} GB needed plus probe.worker.min_free_gb="
                             f"{self.min_free_bytes / 1e9:g} GB kept free")
            return
        # a random id, not the pid: two starts of one run (a requeue on another node, two
        # containers) may share a pid, and one must never write into or remove the other's
        tmp = self.folder / f".{folder.name}.{self.number}-{uuid.uuid4().hex[:16]}{layout.WRITING}"
        try:
            tmp.mkdir(parents=True)  # new: a write cut by a kill is removed by the next start
            path = tmp / layout.WEIGHTS
            with open(path, "wb") as handle:
                torch.save({**meta, "global_step": int(step),
                            "state_dict": {f"model.{k}": v for k, v in weights.items()}}, handle)
                handle.flush()
                os.fsync(handle.fileno())
            layout.write_json(tmp / layout.COMPLETE, {
                "step": int(step), "time": time.time(), "rank": int(self.rank),
                "pid": os.getpid(), "start": self.start_id, "number": self.number,
                "bytes": path.stat().st_size})
            if not starts.install(tmp, folder, number=self.number, start_id=self.start_id,
                                  superseded=lambda: self._superseded(step)):
                shutil.rmtree(tmp, ignore_errors=True)  # kept: ours, or a newer start's is there
        except Exception as error:
            shutil.rmtree(tmp, ignore_errors=True)  # nothing half-written stays, whatever failed
            # torch.save's zip writer turns ENOSPC into a RuntimeError ("unexpected pos") whose
            # __context__ is the OSError: the whole chain is searched
            full, seen = error, set()
            while full is not None and id(full) not in seen and not (
                    isinstance(full, OSError) and full.errno in (errno.ENOSPC, errno.EDQUOT)):
                seen.add(id(full))
                full = full.__cause__ or full.__context__
            if full is None or id(full) in seen:
                raise
            self._skip(step, f"{full.strerror or full} while writing")

    def _superseded(self, step: int) -> bool:
        """Whether a newer start has begun: this one writes nothing more ("Overlapping starts")."""
        if self.is_current():
            return False
        self._say_superseded()
        return True

    def _say_superseded(self) -> None:
        if not self._said_superseded:
            self._said_superseded = True
            log.warning("a newer training start of this run has begun (start %d here): this "
                        "start writes nothing more into %s (no snapshot, heartbeat or end of "
                        "run)", self.number, self.folder)

    def _skip(self, step: int, why: str) -> None:
        """Warn that `step`'s snapshot (and so its probe) is skipped; training goes on."""
        free = _free_bytes(self.folder)
        where = "unknown" if free is None else f"{free / 1e9:.2f} GB"
        self.skipped[step] = why
        log.warning(
            "disk full: the snapshot of step %d is skipped, so that step is not probed (%s; "
            "%s free in %s); training goes on. Free some space, or write the run to a larger "
            "disk", step, why, where, self.folder)
