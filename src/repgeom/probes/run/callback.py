"""`ProbeCallback`: measure the geometry of every layer while a model trains.

The callback only schedules, captures and logs: the schedule comes from
`repgeom.probes.run.schedule.probe_schedule`, the numbers from `measure` (which calls
`repgeom.metrics`), the table and figures from `table` and `plots` (through `ProbeRecorder`), and
with ``probe.offload`` the snapshots and the worker are
`repgeom.probes.run.offload.training_side.Offloading`'s.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from repgeom.probes.core import catalogue, table
from repgeom.probes.core.prediction.lm_loss import Masking
from repgeom.probes.core.sampling import ProbeSet, probe_set
from repgeom.probes.core.spec import ProbeCallbackConf, ProbeSpec
from repgeom.probes.core.targets import probe_gpt
from repgeom.probes.report import sink
from repgeom.probes.run.offload.training_side import Offloading
from repgeom.probes.run.recorder import ProbeRecorder
from repgeom.probes.run.schedule import probe_schedule


class ProbeCallback(L.Callback):
    """Probe every layer on a fixed held-out set at scheduled steps; log curves and plots.

    Parameters
    ----------
    every_n_steps, log_spaced_until, n_log_spaced, max_probes
        The schedule, see `repgeom.probes.run.schedule.probe_schedule`.
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
        compared with the final one (`repgeom.probes.core.pairwise.similarity`).
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
        self.offloading = Offloading(offload, worker)  # probe.offload, rank 0
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
        self.probes: ProbeSet | None = None
        self.run_dir: Path | None = None
        self._wandb_ready = False
        self.recorder: ProbeRecorder | None = None
        self._phase_state: list = []
        self._trained = False  # on_train_start ran: Lightning's fit loop was not skipped

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
        self.offloading.setup(self.run_dir)
        if trainer.is_global_zero:
            table.probe_dir(self.run_dir).mkdir(parents=True, exist_ok=True)
            (table.probe_dir(self.run_dir) / "probe_set.json").write_text(
                json.dumps({"protocol": self.spec.protocol, **self.probes.describe(),
                            "twonn_convention": self.spec.settings.twonn_convention}, indent=2)
            )

    def state_dict(self) -> dict[str, Any]:
        # "spec" lets probe.py rebuild this exact probe set from a checkpoint alone.
        skipped = self.offloading.skipped()
        phases = self.recorder.state_dict() if self.recorder is not None else self._phase_state
        return {"done": sorted(self.done), "seconds": self.seconds, "spec": self.probe_config(),
                "phase_alerts": phases, "skipped_for_space": skipped}

    def probe_config(self) -> dict[str, Any]:
        """What fixes the probe's numbers: the `ProbeSpec` (not the schedule)."""
        return self.spec.to_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.done = set(state_dict.get("done", []))
        self.seconds = float(state_dict.get("seconds", 0.0))
        self.offloading.skipped_for_space = {
            int(k): str(v) for k, v in (state_dict.get("skipped_for_space") or {}).items()}
        self._phase_state = list(state_dict.get("phase_alerts", []))
        if self.recorder is not None:
            self.recorder.load_state_dict(self._phase_state)

    # -- scheduling ---------------------------------------------------------------------------

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The snapshot folder is touched only here, once training really runs: a rerun of a
        # finished run (Lightning's fit loop restores the last step and skips training, with no
        # on_train_start or on_train_end) leaves its done marker and "finished" state alone.
        self._trained = True
        if self.offloading.mode and trainer.is_global_zero and self.offloading.writer is None:
            self.offloading.start(trainer, self.schedule)
        self._maybe_probe(trainer, pl_module)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any
    ) -> None:
        # After optimizer step N (global_step == N) and before step N + 1: a snapshot taken
        # here holds exactly the weights of step N.
        writer = self.offloading.writer
        if writer is not None:  # for the heartbeat: the worker's lag, and progress
            writer.progress(trainer.global_step)
        self._maybe_probe(trainer, pl_module)

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                                outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        # No optimizer step moves during a validation run; each batch of it is progress all the
        # same, so a long one is not judged a deadlock by the worker (follow.training_alive).
        if self.offloading.writer is not None:
            self.offloading.writer.progress(trainer.global_step, busy=True)

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule,
                                 optimizer: Any) -> None:
        if self.offloading.writer is not None:  # a GPU copy in flight ends before the update
            self.offloading.writer.before_optimizer_step()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step = trainer.global_step
        if step not in self.done:
            self._probe(trainer, pl_module, step)
        if self.offloading.writer is not None:
            self.offloading.end(final_step=step)
        elif trainer.is_global_zero and self.run_dir is not None:
            self._finish(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule,
                     exception: BaseException) -> None:
        if self.offloading.writer is not None:
            # SIGTERM (a SLURM requeue or preemption, scancel): "stopped", the run may come back
            # and a worker waits for it (follow_timeout_s); any other exception: "failed", and
            # the worker stops at once. Lightning's flag too: after a SIGTERM another error may
            # come first (W&B's service, killed by the same signal, drops its connection).
            stopped = (isinstance(exception, SIGTERMException)
                       or bool(getattr(trainer, "received_sigterm", False)))
            self.offloading.end(final_step=None, stopped=stopped)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """The end of a fit that did not raise (Lightning calls it last; an exception goes
        through `on_exception`): nothing left "running", no worker left behind.

        A finished run whose status ``on_train_end`` could not write (a full disk) fails here,
        once every other callback has ended training (the last checkpoint is saved); a skipped
        fit (a finished run, rerun) may start the worker for what is left
        (`Offloading.teardown`)."""
        if stage != "fit" or not trainer.is_global_zero:
            return
        self.offloading.teardown(trainer, trained=self._trained)

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
        if self.offloading.writer is not None:
            self.offloading.snapshot(trainer, pl_module, step, {
                "callbacks": {type(self).__name__: {"spec": self.probe_config()}},
                "offload": {"plot_every_n_probes": self.plot_every_n_probes,
                            "n_probes": len(self.schedule), "plot_metrics": self.plot_metrics},
            })
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
