"""`ProbeCallback`: measure the geometry of every layer while a model trains.

The callback only schedules, captures and logs: the numbers come from `measure` (which calls
`repgeom.metrics`), the table and figures from `table` and `plots`.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from repgeom.probes.core import catalogue, table
from repgeom.probes.core.lm_loss import Masking
from repgeom.probes.core.sampling import ProbeSet, probe_set
from repgeom.probes.core.spec import ProbeCallbackConf, ProbeSpec, WorkerConf
from repgeom.probes.core.targets import probe_gpt
from repgeom.probes.report import sink
from repgeom.probes.run.offload import follow, snapshots
from repgeom.probes.run.recorder import ProbeRecorder
from repgeom.probes.run.schedule import thin_steps

log = logging.getLogger(__name__)


def probe_schedule(
    max_steps: int,
    *,
    every_n_steps: int,
    log_spaced_until: int,
    n_log_spaced: int,
    max_probes: int | None = None,
) -> list[int]:
    """The training steps at which to probe: 0, log-spaced early, evenly spaced later, the end.

    Early training moves fast, so `n_log_spaced` steps are spread geometrically over
    [1, log_spaced_until]; after that every `every_n_steps`-th step is probed, and `max_steps`
    itself. With `max_probes`, the list is thinned by `schedule.thin_steps` (the first and last
    step kept, log-spaced early and even later), the rule ``probe.py max_revisions=`` uses.
    """
    if max_steps < 1:
        raise ValueError(f"trainer.max_steps must be set (> 0) to schedule probes, got {max_steps}")
    if every_n_steps < 1:
        raise ValueError(f"probe.every_n_steps must be >= 1, got {every_n_steps}")
    steps = {0, max_steps}
    until = min(log_spaced_until, max_steps)
    if until >= 1 and n_log_spaced > 0:
        steps |= {int(s) for s in np.unique(np.round(np.geomspace(1, until, n_log_spaced)))}
    steps |= set(range(every_n_steps, max_steps + 1, every_n_steps))
    ordered = sorted(steps)
    return thin_steps(ordered, max_probes, option="probe.max_probes")


class ProbeCallback(L.Callback):
    """Probe every layer on a fixed held-out set at scheduled steps; log curves and plots.

    Parameters
    ----------
    every_n_steps, log_spaced_until, n_log_spaced, max_probes
        The schedule, see `probe_schedule`.
    plot_every_n_probes : int
        Redraw the figures every this many probes (and always at the end); 0 only at the end.
    plot_metrics : list of str or None
        The metrics to draw (each figure costs a fraction of a second); None draws every metric.
        The user's metrics and the pairwise maps are always drawn.
    offload : {None, "snapshots", "worker"}
        None probes in the training process. ``snapshots``: at each probe step the weights are
        copied and written to ``<run>/probes/snapshots/`` in the background
        (`repgeom.probes.run.offload.snapshots`) for a worker, ``probe.py follow=<run>``
        (`repgeom.probes.run.offload.follow`), and training goes on; ``worker``: the same, and
        this process starts that worker itself on this node (``probe.worker``: threads,
        device, cpus).
    worker : dict
        The worker's options (`repgeom.probes.core.spec.WorkerConf`).
    **spec
        The fields of `repgeom.probes.core.spec.ProbeSpec` (probe set, ``metrics``, ``settings``,
        ``seed``), whose defaults are the only ones. With a pairwise metric (``linear_cka``,
        ``mutual_knn``) each probe step's states are also saved, and at the end every step is
        compared with the final one (`repgeom.probes.core.similarity`).
    """

    def __init__(
        self,
        *,
        every_n_steps: int = ProbeCallbackConf.every_n_steps,
        log_spaced_until: int = ProbeCallbackConf.log_spaced_until,
        n_log_spaced: int = ProbeCallbackConf.n_log_spaced,
        max_probes: int | None = ProbeCallbackConf.max_probes,
        plot_every_n_probes: int = ProbeCallbackConf.plot_every_n_probes,
        plot_metrics: list[str] | None = None,
        offload: str | None = ProbeCallbackConf.offload,
        worker: dict[str, Any] | None = None,
        **spec: Any,
    ) -> None:
        super().__init__()
        self.offload = snapshots.check_offload(offload)
        given = {str(k): v for k, v in dict(worker or {}).items()}
        unknown = set(given) - set(WorkerConf().__dict__)
        self.worker_options = {**WorkerConf().__dict__, **given}
        if unknown:
            raise ValueError(f"probe.worker: unknown option(s) {sorted(unknown)}; known: "
                             f"{sorted(WorkerConf().__dict__)}")
        if self.offload == "worker":  # probe.py follow= checks its own follow_timeout_s
            follow.check_heartbeat(float(self.worker_options["heartbeat_s"]),
                                   float(self.worker_options["timeout_s"]))
        self.spec = ProbeSpec(**spec)
        self.schedule_options = dict(
            every_n_steps=every_n_steps,
            log_spaced_until=log_spaced_until,
            n_log_spaced=n_log_spaced,
            max_probes=max_probes,
        )
        self.plot_every_n_probes = plot_every_n_probes
        self.plot_metrics = None if plot_metrics is None else list(plot_metrics)
        self.settings = self.spec.probe_settings()
        selection = catalogue.select(self.settings)
        self.pairs = selection.pairs
        if self.plot_metrics is not None:  # the user's metrics and the similarity maps: always
            extra = [m.name for m in selection.states if m.user] + [m.name for m in self.pairs]
            self.plot_metrics += [m for m in extra if m not in self.plot_metrics]
        self.schedule: list[int] = []
        self.done: set[int] = set()
        self.seconds = 0.0
        self.skipped_for_space: dict[int, str] = {}  # step -> why its snapshot was not written
        self.probes: ProbeSet | None = None
        self.run_dir: Path | None = None
        self._wandb_ready = False
        self.recorder: ProbeRecorder | None = None
        self._phase_state: list = []
        self.writer: snapshots.SnapshotWriter | None = None  # probe.offload, rank 0
        self.worker: subprocess.Popen | None = None  # probe.offload=worker, rank 0
        self._trained = False  # on_train_start ran: Lightning's fit loop was not skipped
        # the end-of-run status could not be written: raised by teardown, the last hook
        self._not_recorded: snapshots.RunNotRecordedError | None = None

    # -- set-up -------------------------------------------------------------------------------

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.probes = probe_set(trainer.datamodule.validation_windows(), self.spec)
        self.schedule = probe_schedule(trainer.max_steps, **self.schedule_options)
        self.run_dir = Path(trainer.default_root_dir)
        self.recorder = ProbeRecorder(self.run_dir, self.spec,
                                      plot_every_n_probes=self.plot_every_n_probes,
                                      plot_metrics=self.plot_metrics,
                                      n_probes=len(self.schedule))
        self.recorder.load_state_dict(self._phase_state)
        self._trained = False
        self._not_recorded = None
        if trainer.is_global_zero:
            table.probe_dir(self.run_dir).mkdir(parents=True, exist_ok=True)
            (table.probe_dir(self.run_dir) / "probe_set.json").write_text(
                json.dumps({"protocol": self.spec.protocol, **self.probes.describe(),
                            "twonn_convention": self.spec.settings.twonn_convention}, indent=2)
            )

    def state_dict(self) -> dict[str, Any]:
        # "spec" lets probe.py rebuild this exact probe set from a checkpoint alone.
        skipped = self.skipped_for_space
        if self.writer is not None:  # "done" in a checkpoint means the snapshot is on disk
            self.writer.wait()  # or was skipped for lack of space: a gap a resume keeps naming
            skipped = {**skipped, **self.writer.skipped}
        phases = self.recorder.state_dict() if self.recorder is not None else self._phase_state
        return {"done": sorted(self.done), "seconds": self.seconds, "spec": self.probe_config(),
                "phase_alerts": phases, "skipped_for_space": skipped}

    def probe_config(self) -> dict[str, Any]:
        """What fixes the probe's numbers: the `ProbeSpec` (not the schedule)."""
        return self.spec.to_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.done = set(state_dict.get("done", []))
        self.seconds = float(state_dict.get("seconds", 0.0))
        self.skipped_for_space = {int(k): str(v) for k, v in
                                  (state_dict.get("skipped_for_space") or {}).items()}
        self._phase_state = list(state_dict.get("phase_alerts", []))
        if self.recorder is not None:
            self.recorder.load_state_dict(self._phase_state)

    # -- scheduling ---------------------------------------------------------------------------

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The snapshot folder is touched only here, once training really runs: a rerun of a
        # finished run (Lightning's fit loop restores the last step and skips training, with no
        # on_train_start or on_train_end) leaves its done marker and "finished" state alone.
        self._trained = True
        if self.offload and trainer.is_global_zero and self.writer is None:
            self._start_offload(trainer)
        self._maybe_probe(trainer, pl_module)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any
    ) -> None:
        # After optimizer step N (global_step == N) and before step N + 1: a snapshot taken
        # here holds exactly the weights of step N.
        if self.writer is not None:  # for the heartbeat: the worker's lag, and progress
            self.writer.progress(trainer.global_step)
        self._maybe_probe(trainer, pl_module)

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                                outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        # No optimizer step moves during a validation run; each batch of it is progress all the
        # same, so a long one is not judged a deadlock by the worker (follow.training_alive).
        if self.writer is not None:
            self.writer.progress(trainer.global_step, busy=True)

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule,
                                 optimizer: Any) -> None:
        if self.writer is not None:  # a GPU copy still in flight finishes before the update
            self.writer.before_optimizer_step()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step = trainer.global_step
        if step not in self.done:
            self._probe(trainer, pl_module, step)
        if self.writer is not None:
            self._end_offload(trainer, final_step=step)
        elif trainer.is_global_zero and self.run_dir is not None:
            self._finish(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule,
                     exception: BaseException) -> None:
        if self.writer is not None:
            # SIGTERM (a SLURM requeue or preemption, scancel): "stopped", the run may come back
            # and a worker waits for it (follow_timeout_s); any other exception: "failed", and
            # the worker stops at once. Lightning's flag too: after a SIGTERM another error may
            # come first (W&B's service, killed by the same signal, drops its connection).
            stopped = (isinstance(exception, SIGTERMException)
                       or bool(getattr(trainer, "received_sigterm", False)))
            self._end_offload(trainer, final_step=None, stopped=stopped)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """The end of a fit that did not raise (Lightning calls it last; an exception goes
        through `on_exception`): nothing left "running", no worker left behind.

        A finished run whose status ``on_train_end`` could not write (a full disk) fails here,
        with `snapshots.RunNotRecordedError`, once every other callback has ended training (the
        last checkpoint is saved). A skipped fit (a finished run, rerun) writes that status if
        an earlier start could not, then starts the worker only when the run's probing is
        unfinished (its worker was stopped or killed before its end-of-run work was done), and
        waits for it."""
        if stage != "fit" or not trainer.is_global_zero:
            return
        if self._not_recorded is not None:
            error, self._not_recorded = self._not_recorded, None
            raise error
        if self.writer is not None:  # on_train_end and on_exception did not close it
            self._end_offload(trainer, final_step=None)
            return
        if self._trained or not self.offload or self.run_dir is None:
            return
        self._record_finished_run(trainer)
        if self.offload == "worker" and follow.work_left(self.run_dir):
            self.worker = follow.start_worker(self.run_dir, self.worker_options)
            print(f"This run is finished, its probing is not: probe worker started (pid "
                  f"{self.worker.pid}); its log: {table.probe_dir(self.run_dir) / 'worker.log'}")
            folder = snapshots.snapshot_dir(self.run_dir)
            self._wait_for_worker(left=len(snapshots.snapshots(folder)[0]))

    def _record_finished_run(self, trainer: L.Trainer) -> None:
        """A finished run, rerun: write its ``done.json`` and ``finished`` state where an earlier
        start could not (a full disk at its end); only in a snapshot folder of ours."""
        folder = snapshots.snapshot_dir(self.run_dir)
        state = (snapshots.read_json(folder / snapshots.TRAINING) or {}).get("state")
        recorded = (folder / snapshots.DONE).is_file() and state == "finished"
        if recorded or trainer.global_step < trainer.max_steps or not (
                folder / snapshots.MARKER).is_file():
            return
        writer = snapshots.SnapshotWriter(self.run_dir, heartbeat_s=float(
            self.worker_options["heartbeat_s"]))
        writer.finish(trainer.global_step, self.skipped_for_space)
        print(f"This run is finished at step {trainer.global_step}; its status, missing until "
              f"now, is written: {folder / snapshots.DONE}")

    def _maybe_probe(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step = trainer.global_step
        if step in self.schedule and step not in self.done:
            self._probe(trainer, pl_module, step)

    # -- probing ------------------------------------------------------------------------------

    def _probe(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> None:
        """Every rank marks the step done; only rank 0 computes and logs (no collectives)."""
        self.done.add(step)
        if not trainer.is_global_zero:
            return
        start = time.perf_counter()
        if self.writer is not None:
            self._snapshot(trainer, pl_module, step)
            self.seconds += time.perf_counter() - start
            return
        masking = None if pl_module.model.config.causal else Masking.of(
            pl_module.vocab, pl_module.hparams.masking)
        output = self.run(pl_module.model, masking)
        for message in output.warnings:
            rank_zero_warn(message)
        self.recorder.record(step, output, self._wandb(trainer), n_done=len(self.done),
                             seconds=self.seconds)
        self.seconds += time.perf_counter() - start

    def run(self, model: torch.nn.Module, masking: Masking | None = None):
        """Probe `model` on the fixed windows: eval mode, no gradients, RNG state untouched
        (an encoder's loss rows need its validation `masking`)."""
        return probe_gpt(
            model,
            self.probes,
            batch_size=self.spec.batch_size,
            settings=self.settings,
            keep_states=bool(self.pairs),
            masking=masking,
        )

    # -- logging ------------------------------------------------------------------------------

    def _wandb(self, trainer: L.Trainer) -> list:
        runs = [lg.experiment for lg in trainer.loggers if isinstance(lg, WandbLogger)]
        if runs and not self._wandb_ready:
            for run in runs:
                sink.prepare_wandb_run(run, {"probe": self._config()})
            self._wandb_ready = True
        return runs

    def _config(self) -> dict[str, Any]:
        """`probe_config()` plus the schedule, for the W&B run's config."""
        return {**self.probe_config(), "schedule": self.schedule, **self.schedule_options}

    def _finish(self, trainer: L.Trainer) -> None:
        # the end-of-run figures count in the total: the run waits for them too
        self.seconds += self.recorder.finish(self._wandb(trainer), n_done=len(self.done),
                                             seconds=self.seconds)

    # -- off the clock (probe.offload) --------------------------------------------------------

    def _start_offload(self, trainer: L.Trainer) -> None:
        """Rank 0: the snapshot folder, its heartbeat, and with ``worker`` the worker itself."""
        self.writer = snapshots.SnapshotWriter(
            self.run_dir, heartbeat_s=float(self.worker_options["heartbeat_s"]),
            min_free_gb=float(self.worker_options["min_free_gb"]))
        self.writer.rank = trainer.global_rank
        self.writer.progress(trainer.global_step)  # a resumed run's step, from its first beat
        self.writer.start({"wandb": self._wandb_info(trainer), "schedule": self.schedule})
        if self.offload == "worker":
            self.worker = follow.start_worker(self.run_dir, self.worker_options)
            print(f"Probe worker started (pid {self.worker.pid}, device "
                  f"{self.worker_options['device']}, {self.worker_options['threads']} "
                  f"thread(s)); its log: {table.probe_dir(self.run_dir) / 'worker.log'}")

    def _wandb_info(self, trainer: L.Trainer) -> dict[str, Any] | None:
        """The training run's W&B run (project, group, id, name), for the worker's own run."""
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                run = logger.experiment
                return {"project": run.project, "group": run.group or None, "id": run.id,
                        "name": run.name, "offline": bool(logger._offline)}
        return None

    def _snapshot(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> None:
        """Hand the weights of `step` to the writer; report a worker that falls behind."""
        meta = {
            "hyper_parameters": _plain(dict(pl_module.hparams)),
            "callbacks": {type(self).__name__: {"spec": self.probe_config()}},
            "offload": {"plot_every_n_probes": self.plot_every_n_probes,
                        "n_probes": len(self.schedule),
                        "plot_metrics": self.plot_metrics},
        }
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

    def _end_offload(self, trainer: L.Trainer, *, final_step: int | None,
                     stopped: bool = False) -> None:
        """Write the done marker (or mark the run failed) and, for a worker of our own with
        ``probe.worker.wait``, wait for it to probe what is left (at most
        ``probe.worker.wait_timeout_s``). After a failure, or when the done marker cannot be
        written (kept for `teardown` to raise), our worker is stopped instead."""
        writer, self.writer = self.writer, None
        again = f"python probe.py follow={self.run_dir} goes on where it stopped"
        try:
            writer.close(final_step=final_step, stopped=stopped, skipped=self.skipped_for_space)
        except snapshots.RunNotRecordedError as error:
            self._not_recorded = error
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
        if self.worker is None:
            return
        if final_step is None:  # training failed or is not recorded: the worker is stopped
            self._stop_worker(again)
            return
        if not self.worker_options["wait"]:
            self.worker = None
            return  # it stops by itself after the done marker
        self._wait_for_worker(left=len(writer.waiting()))

    def _stop_worker(self, again: str) -> None:
        """Stop our worker, if any, within `follow.WORKER_STOP_S`; `again` says how it resumes."""
        if self.worker is None:
            return
        worker, self.worker = self.worker, None
        print(f"Stopping the probe worker (pid {worker.pid}), at most "
              f"{follow.WORKER_STOP_S:.0f} s; {again}")
        follow.stop_worker(worker, 0.0)

    def _wait_for_worker(self, *, left: int) -> None:
        """Wait for our worker, at most ``probe.worker.wait_timeout_s``; then stop it."""
        worker, self.worker = self.worker, None
        limit = float(self.worker_options["wait_timeout_s"])
        print(f"Waiting for the probe worker (pid {worker.pid}): {left} snapshot(s) left; at "
              f"most {limit:.0f} s (probe.worker.wait_timeout_s), then it is stopped")
        code = follow.stop_worker(worker, limit)
        again = f"python probe.py follow={self.run_dir} goes on where it stopped"
        if code is None:
            rank_zero_warn(f"the probe worker did not finish within {limit:.0f} s "
                           f"(probe.worker.wait_timeout_s) and was stopped; {again}")
        elif code != 0:
            rank_zero_warn(f"the probe worker exited with {code}; its log: "
                           f"{table.probe_dir(self.run_dir) / 'worker.log'}. {again}")


def _plain(value: Any) -> Any:
    """Containers of plain values only (a snapshot is read with ``weights_only=True``)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, Path):
        return str(value)
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(value):
            return _plain(OmegaConf.to_container(value, resolve=True))
    except ImportError:
        pass
    return str(value)
