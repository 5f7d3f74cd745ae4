"""Rank 0's half of ``probe.offload`` (docs/probing.md, "Probes off the training clock"):
`Offloading`, which `repgeom.probes.run.callback.ProbeCallback` calls from its hooks, and our
own worker process (`start_worker`, `stop_worker`)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_warn
from omegaconf import OmegaConf

from repgeom.probes.core import table
from repgeom.probes.core.spec import WorkerConf
from repgeom.probes.run.offload import follow, snapshots
from repgeom.probes.run.offload.lease import check_heartbeat
from repgeom.probes.run.offload.state import run_done

log = logging.getLogger(__name__)
WORKER_STOP_S = 30.0  # seconds a worker stopped by train.py (SIGTERM) has before SIGKILL


class Offloading:
    """Rank 0's half of offloaded probes: `mode` ``probe.offload``, `worker` ``probe.worker``."""

    def __init__(self, mode: str | None, worker: dict[str, Any] | None) -> None:
        self.mode = snapshots.check_offload(mode)
        given, known = {str(k): v for k, v in dict(worker or {}).items()}, WorkerConf().__dict__
        self.options = {**known, **given}
        if set(given) - set(known):
            raise ValueError(f"probe.worker: unknown option(s) {sorted(set(given) - set(known))}"
                             f"; known: {sorted(known)}")
        if self.mode == "worker":  # probe.py follow= checks its own follow_timeout_s
            check_heartbeat(float(self.options["heartbeat_s"]), float(self.options["timeout_s"]))
        self.run_dir: Path | None = None
        self.writer: snapshots.SnapshotWriter | None = None  # while training runs
        self.worker: subprocess.Popen | None = None  # probe.offload=worker
        self.skipped_for_space: dict[int, str] = {}  # step -> why its snapshot was not written
        # the end-of-run status could not be written: raised by `teardown`
        self.not_recorded: snapshots.RunNotRecordedError | None = None

    def setup(self, run_dir: Path) -> None:
        """A new fit of the run in `run_dir`."""
        self.run_dir = run_dir
        self.not_recorded = None

    def skipped(self) -> dict[int, str]:
        """The steps whose snapshots were skipped for lack of space, those in flight included."""
        if self.writer is None:
            return self.skipped_for_space
        self.writer.wait()
        return {**self.skipped_for_space, **self.writer.skipped}

    def start(self, trainer: L.Trainer, schedule: list[int]) -> None:
        """The snapshot folder, its heartbeat, and with ``worker`` the worker itself."""
        self.writer = snapshots.SnapshotWriter(
            self.run_dir, heartbeat_s=float(self.options["heartbeat_s"]),
            min_free_gb=float(self.options["min_free_gb"]))
        self.writer.rank = trainer.global_rank
        self.writer.progress(trainer.global_step)  # a resumed run's step, from its first beat
        wandb = next(({"project": run.project, "group": run.group or None, "id": run.id,
                       "name": run.name, "offline": bool(run.offline)}
                      for run in (logger.experiment for logger in trainer.loggers
                                  if isinstance(logger, WandbLogger))), None)
        self.writer.start({"wandb": wandb, "schedule": schedule})  # the worker's W&B run
        if self.mode == "worker":
            self.worker = start_worker(self.run_dir, self.options)
            print(f"Probe worker started (pid {self.worker.pid}, device "
                  f"{self.options['device']}, {self.options['threads']} "
                  f"thread(s)); its log: {table.probe_dir(self.run_dir) / 'worker.log'}")

    def snapshot(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int,
                 probe_meta: dict[str, Any]) -> None:
        """Hand the weights of `step` to the writer with what the worker needs; report its lag."""
        meta = {"hyper_parameters": _plain(dict(pl_module.hparams)), **probe_meta}
        datamodule = getattr(trainer, "datamodule", None)
        if datamodule is not None and hasattr(datamodule, "state_dict"):
            meta[type(datamodule).__name__] = _plain(datamodule.state_dict())
        waiting = self.writer.waiting()
        waited = self.writer.snapshot(step, pl_module.model, meta)
        lag = step - waiting[0] if waiting else 0
        if len(waiting) >= 2:
            log.warning(
                "probe worker is behind: %d snapshots waiting (steps %s), %d steps behind "
                "training; they are kept, not dropped (give the worker more cores or a device: "
                "probe.worker.threads, probe.worker.device)", len(waiting), waiting, lag)
        metrics = {"probe/offload/waiting": len(waiting), "probe/offload/lag_steps": lag,
                   "probe/offload/wait_seconds": waited}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)

    def end(self, *, final_step: int | None, stopped: bool = False) -> None:
        """Record how training ended; wait for our worker (``probe.worker.wait``), or stop it."""
        writer, self.writer = self.writer, None
        again = f"python probe.py follow={self.run_dir} goes on where it stopped"
        current = writer.is_current()
        try:
            writer.close(final_step=final_step, stopped=stopped, skipped=self.skipped_for_space)
        except snapshots.RunNotRecordedError as error:
            self.not_recorded = error
            final_step = None
            again = ("the run could not be recorded as finished (the error below says how to "
                     "finish it), and that rerun starts the worker again")
        except BaseException:
            self._stop_worker(again)  # whatever failed, no worker is left behind
            raise
        self.skipped_for_space.update(writer.skipped)
        if self.skipped_for_space:
            rank_zero_warn(f"the snapshots of steps {sorted(self.skipped_for_space)} were "
                           "skipped for lack of disk space, so those steps have no probe rows "
                           "(a step's weights are not kept once training moves on); see the "
                           "warnings of the start that skipped them")
        if not current:  # superseded: the newer start's worker probes the run
            self._stop_worker("the newer training start of this run and its worker go on")
        elif final_step is None:  # training failed or is not recorded: the worker is stopped
            self._stop_worker(again)
        elif not self.options["wait"]:
            self.worker = None  # it stops by itself after the done marker
        elif self.worker is not None:
            self._wait_for_worker(left=len(writer.waiting()))

    def teardown(self, trainer: L.Trainer, *, trained: bool) -> None:
        """The end of a fit that did not raise; a finished run, rerun, gets its status, worker."""
        if self.not_recorded is not None:
            error, self.not_recorded = self.not_recorded, None
            raise error
        if self.writer is not None:  # the training hooks did not close it
            self.end(final_step=None)
            return
        if trained or not self.mode or self.run_dir is None:
            return
        folder = snapshots.snapshot_dir(self.run_dir)
        state = (snapshots.read_json(folder / snapshots.TRAINING) or {}).get("state")
        if not (run_done(folder) and state == "finished") and (
                trainer.global_step >= trainer.max_steps and (folder / snapshots.MARKER).is_file()):
            # where an earlier start could not (a full disk at its end); only in a folder of ours
            writer = snapshots.SnapshotWriter(self.run_dir, heartbeat_s=float(
                self.options["heartbeat_s"]))
            writer.finish(trainer.global_step, self.skipped_for_space)
            print(f"This run is finished at step {trainer.global_step}; its status, missing "
                  f"until now, is written: {folder / snapshots.DONE}")
        if self.mode == "worker" and follow.work_left(self.run_dir):
            self.worker = start_worker(self.run_dir, self.options)
            print(f"This run is finished, its probing is not: probe worker started (pid "
                  f"{self.worker.pid}); its log: {table.probe_dir(self.run_dir) / 'worker.log'}")
            self._wait_for_worker(left=len(snapshots.snapshots(folder)[0]))

    def _stop_worker(self, again: str) -> None:
        """Stop our worker, if any (`WORKER_STOP_S`); `again`: how it resumes."""
        if self.worker is None:
            return
        worker, self.worker = self.worker, None
        print(f"Stopping the probe worker (pid {worker.pid}), at most "
              f"{WORKER_STOP_S:.0f} s; {again}")
        stop_worker(worker, 0.0)

    def _wait_for_worker(self, *, left: int) -> None:
        """Wait for our worker, at most ``probe.worker.wait_timeout_s``; then stop it."""
        worker, self.worker = self.worker, None
        limit = float(self.options["wait_timeout_s"])
        print(f"Waiting for the probe worker (pid {worker.pid}): {left} snapshot(s) left; at "
              f"most {limit:.0f} s (probe.worker.wait_timeout_s), then it is stopped")
        code = stop_worker(worker, limit)
        again = f"python probe.py follow={self.run_dir} goes on where it stopped"
        if code is None:
            rank_zero_warn(f"the probe worker did not finish within {limit:.0f} s "
                           f"(probe.worker.wait_timeout_s) and was stopped; {again}")
        elif code != 0:
            rank_zero_warn(f"the probe worker exited with {code}; its log: "
                           f"{table.probe_dir(self.run_dir) / 'worker.log'}. {again}")


def _plain(value: Any) -> Any:
    """Containers of plain values only (a snapshot is read with ``weights_only=True``)."""
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)  # a Path, or anything else


def start_worker(run_dir: Path, options: dict[str, Any]) -> subprocess.Popen:
    """Start a worker process for `run_dir` on this node (``probe.worker``'s `options`)."""
    threads = int(options.get("threads") or 1)
    check_heartbeat(float(options.get("heartbeat_s") or 10.0),
                    float(options.get("timeout_s") or 600.0))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    cpus = options.get("cpus")
    affinity = None if cpus is None else {int(c) for c in cpus}
    if affinity is not None and not hasattr(os, "sched_setaffinity"):
        raise ValueError("probe.worker.cpus needs Linux (os.sched_setaffinity); leave it null")
    log_path = table.probe_dir(run_dir) / "worker.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "repgeom.cli.probe", f"follow={run_dir}",  # probe.py
               f"device={options.get('device') or 'cpu'}",
               f"follow_timeout_s={float(options.get('timeout_s') or 600.0)}",
               f"keep_snapshots={str(bool(options.get('keep_snapshots'))).lower()}",
               f"hydra.run.dir={table.probe_dir(run_dir) / 'worker'}"]
    with open(log_path, "ab") as log:
        # start_new_session, not preexec_fn (unsafe once threads run); its own session keeps a
        # Ctrl-C for train.py from it: it stops on the failed state or its start's lease
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    if affinity is not None:  # before its interpreter has started any thread of its own
        os.sched_setaffinity(process.pid, affinity)
    return process


def stop_worker(process: subprocess.Popen, limit_s: float) -> int | None:
    """Wait `limit_s` for `process`, SIGTERM, `WORKER_STOP_S`, SIGKILL; its exit code or None."""
    try:
        return process.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        pass
    process.terminate()
    try:
        process.wait(timeout=WORKER_STOP_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    return None
