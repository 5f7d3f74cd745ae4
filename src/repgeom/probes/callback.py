"""`ProbeCallback`: measure the geometry of every layer while a model trains.

The callback only schedules, captures and logs: the numbers come from `measure` (which calls
`repgeom.metrics`), the table and figures from `table` and `plots`.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pandas as pd
import torch
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_warn

from repgeom.probes import aggregate, catalogue, phase_report, similarity, sink, table, wandb_charts
from repgeom.probes.sampling import ProbeSet, probe_set
from repgeom.probes.schedule import thin_steps
from repgeom.probes.spec import ProbeCallbackConf, ProbeSpec
from repgeom.probes.targets import probe_gpt

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
    **spec
        The fields of `repgeom.probes.spec.ProbeSpec` (probe set, ``metrics``, ``settings``,
        ``seed``), whose defaults are the only ones. With a pairwise metric (``linear_cka``,
        ``mutual_knn``) each probe step's states are also saved, and at the end every step is
        compared with the final one (`repgeom.probes.similarity`).
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
        **spec: Any,
    ) -> None:
        super().__init__()
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
        self.phase_watch = phase_report.PhaseWatch()  # phases per probe, one alert per turn

    # -- set-up -------------------------------------------------------------------------------

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.probes = probe_set(trainer.datamodule.validation_windows(), self.spec)
        self.schedule = probe_schedule(trainer.max_steps, **self.schedule_options)
        self.run_dir = Path(trainer.default_root_dir)
        if trainer.is_global_zero:
            table.probe_dir(self.run_dir).mkdir(parents=True, exist_ok=True)
            (table.probe_dir(self.run_dir) / "probe_set.json").write_text(
                json.dumps({"protocol": self.spec.protocol, **self.probes.describe(),
                            "twonn_convention": self.spec.settings.twonn_convention}, indent=2)
            )

    def state_dict(self) -> dict[str, Any]:
        # "spec" lets probe.py rebuild this exact probe set from a checkpoint alone.
        return {"done": sorted(self.done), "seconds": self.seconds, "spec": self.probe_config(),
                "phase_alerts": self.phase_watch.state_dict()}

    def probe_config(self) -> dict[str, Any]:
        """What fixes the probe's numbers: the `ProbeSpec` (not the schedule)."""
        return self.spec.to_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.done = set(state_dict.get("done", []))
        self.seconds = float(state_dict.get("seconds", 0.0))
        self.phase_watch.load_state_dict(state_dict.get("phase_alerts", []))

    # -- scheduling ---------------------------------------------------------------------------

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._maybe_probe(trainer, pl_module)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any
    ) -> None:
        self._maybe_probe(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step = trainer.global_step
        if step not in self.done:
            self._probe(trainer, pl_module, step)
        if trainer.is_global_zero and self.run_dir is not None:
            self._finish(trainer)

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
        output = self.run(pl_module.model)
        for message in output.warnings:
            rank_zero_warn(message)
        if self.pairs:  # kept for the comparison with the final step (`_finish`)
            similarity.save_states(
                table.probe_dir(self.run_dir), step, output.states, output.layer_names
            )
        rows = [{"step": step, **row} for row in output.rows]
        frame = sink.write_step(self.run_dir, rows)
        self._log_scalars(trainer, step, table.rows_to_frame(rows))
        self.phase_watch.update(self._wandb(trainer), frame, step)
        n_done = len(self.done)
        if self.plot_every_n_probes and n_done % self.plot_every_n_probes == 0:
            self._plot(trainer, frame, step)
        self.seconds += time.perf_counter() - start

    def run(self, model: torch.nn.Module):
        """Probe `model` on the fixed windows: eval mode, no gradients, RNG state untouched."""
        return probe_gpt(
            model,
            self.probes,
            batch_size=self.spec.batch_size,
            settings=self.settings,
            keep_states=bool(self.pairs),
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

    def _log_scalars(self, trainer: L.Trainer, step: int, frame: pd.DataFrame) -> None:
        runs = self._wandb(trainer)
        if not runs:
            return
        sink.log_scalars(runs, step, frame, {"probe/seconds_total": self.seconds})

    def _plot(self, trainer: L.Trainer, frame: pd.DataFrame, step: int) -> list[Path]:
        return sink.figures(
            self._wandb(trainer), frame, self.run_dir, step, metrics=self.plot_metrics
        )

    def _finish(self, trainer: L.Trainer) -> None:
        start = time.perf_counter()
        if self.pairs:
            self._vs_final(trainer)
        frame = table.read_table(self.run_dir)
        self._plot(trainer, frame, int(frame["step"].max()))
        end = time.perf_counter() - start  # counted in the total: the run waits for it too
        self.seconds += end
        result = aggregate.summary(frame)
        text = aggregate.format_summary(result)
        print(f"Probe summary ({len(self.done)} probes, {self.seconds:.1f} s in total, "
              f"{end:.1f} s of it the end-of-run figures):\n{text}")
        for run in self._wandb(trainer):
            run.summary.update(
                {f"probe_summary/{k}": v for k, v in result.items() if v is not None}
            )
            run.summary["probe_summary/seconds_total"] = self.seconds
            run.summary.update(wandb_charts.summary(aggregate.single_set(frame)))
        phase_report.report(frame, self.run_dir, self._wandb(trainer))

    def _vs_final(self, trainer: L.Trainer) -> None:
        """Each probe step's layers against the final step's (`similarity.vs_final_rows`)."""
        rows = similarity.vs_final_rows(
            table.probe_dir(self.run_dir),
            self.pairs,
            batch_size=self.settings.state_batch_size,
            seed=self.settings.seed,
        )
        if not rows:
            return
        sink.write_step(self.run_dir, rows)
        frame = table.rows_to_frame(rows)
        runs = self._wandb(trainer)
        for step, part in frame.groupby("step"):
            sink.log_scalars(runs, int(step), part, {})
