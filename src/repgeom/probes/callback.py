"""`ProbeCallback`: measure the geometry of every layer while a model trains.

The callback only schedules, captures and logs: the numbers come from `measure` (which calls
`repgeom.metrics`), the table and figures from `table` and `plots`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pandas as pd
import torch
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_warn

from repgeom.models.capture import Capture
from repgeom.probes import plots, table, wandb_charts
from repgeom.probes.measure import ProbeOutput, ProbeSettings, measure
from repgeom.probes.sampling import (
    DEFAULT_ATTENTION_WINDOWS,
    DEFAULT_N_STATES,
    DEFAULT_POSITIONS_PER_WINDOW,
    ProbeSet,
    probe_set,
)

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
    itself. With `max_probes`, the list is thinned evenly (keeping the first and last step).
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
    if max_probes is not None and len(ordered) > max_probes:
        if max_probes < 2:
            raise ValueError(
                f"probe.max_probes must be >= 2 (first and last step), got {max_probes}"
            )
        keep = np.unique(np.round(np.linspace(0, len(ordered) - 1, max_probes)).astype(int))
        ordered = [ordered[i] for i in keep]
    return ordered


def gpt_captures(
    model: torch.nn.Module,
    windows: torch.Tensor,
    valid: torch.Tensor | None,
    *,
    batch_size: int,
    attention: bool,
) -> Iterator[Capture]:
    """`model.capture()` on micro-batches of `batch_size` windows, with their `valid` rows."""
    device = next(model.parameters()).device
    for start in range(0, len(windows), batch_size):
        ids = windows[start : start + batch_size].to(device)
        capture: Capture = model.capture(ids, attention=attention)
        if valid is not None:
            capture.valid = valid[start : start + batch_size]
        yield capture


def probe_gpt(
    model: torch.nn.Module,
    probes: ProbeSet,
    *,
    batch_size: int,
    settings: ProbeSettings,
) -> ProbeOutput:
    """`measure` our GPT on a probe set: eval mode, no gradients, the caller's RNG untouched.

    The states come from the sampled positions of every window (no attention materialised);
    attention and Q/K from the first `probes.attention_windows` windows, whole.
    """
    was_training = model.training
    device = next(model.parameters()).device
    model.eval()
    devices = [device] if device.type == "cuda" else []
    whole = probes.windows[: probes.attention_windows]
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            states = gpt_captures(
                model, probes.windows, probes.positions, batch_size=batch_size, attention=False
            )
            attention = gpt_captures(
                model, whole, None, batch_size=batch_size, attention=settings.attention
            )
            return measure(states, attention, settings)
    finally:
        model.train(was_training)


def wandb_scalars(frame: pd.DataFrame) -> dict[str, float]:
    """The W&B keys of one probe step: ``probe/<metric>/layer_<ii>[/head_<hh>]`` and the layer
    means ``probe/<metric>/mean`` (`table.layer_means`)."""
    scalars: dict[str, float] = {}
    for row in frame.itertuples(index=False):
        key = f"probe/{row.metric}/layer_{row.layer:02d}"
        if row.head >= 0:
            key += f"/head_{row.head:02d}"
        scalars[key] = row.value
    for row in table.layer_means(frame).itertuples(index=False):
        scalars[f"probe/{row.metric}/mean"] = row.value
    return scalars


class ProbeCallback(L.Callback):
    """Probe every layer on a fixed held-out set at scheduled steps; log curves and plots.

    Parameters
    ----------
    n_states : int
        At least this many states per layer (windows x positions per window).
    positions_per_window : int or None
        Probe a fixed random subset of this many positions in each window (chosen once from
        `seed`); None probes every position. See `repgeom.probes.sampling`.
    attention_windows : int
        Whole windows read by the attention and query/key metrics.
    batch_size : int
        Windows per forward pass; bounds the probe's memory (attention is T x T per head).
    every_n_steps, log_spaced_until, n_log_spaced, max_probes
        The schedule, see `probe_schedule`.
    plot_every_n_probes : int
        Redraw the figures every this many probes (and always at the end); 0 only at the end.
    plot_metrics : list of str or None
        The metrics to draw (each figure costs a fraction of a second); None draws every metric.
    seed : int
        Fixes the probe windows and positions (the same for a causal and a bidirectional run).
    settings : dict
        Fields of `ProbeSettings`: which metrics, estimator options.
    """

    def __init__(
        self,
        *,
        n_states: int = DEFAULT_N_STATES,
        positions_per_window: int | None = DEFAULT_POSITIONS_PER_WINDOW,
        attention_windows: int = DEFAULT_ATTENTION_WINDOWS,
        batch_size: int = 16,
        every_n_steps: int = 1000,
        log_spaced_until: int = 1000,
        n_log_spaced: int = 8,
        max_probes: int | None = 40,
        plot_every_n_probes: int = 5,
        plot_metrics: list[str] | None = None,
        seed: int = 0,
        settings: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.n_states = n_states
        self.positions_per_window = positions_per_window
        self.attention_windows = attention_windows
        self.batch_size = batch_size
        self.schedule_options = dict(
            every_n_steps=every_n_steps,
            log_spaced_until=log_spaced_until,
            n_log_spaced=n_log_spaced,
            max_probes=max_probes,
        )
        self.plot_every_n_probes = plot_every_n_probes
        self.plot_metrics = None if plot_metrics is None else list(plot_metrics)
        self.seed = seed
        self.settings = ProbeSettings(**{"seed": seed, **(settings or {})})
        self.schedule: list[int] = []
        self.done: set[int] = set()
        self.seconds = 0.0
        self.probes: ProbeSet | None = None
        self.run_dir: Path | None = None
        self._wandb_ready = False

    # -- set-up -------------------------------------------------------------------------------

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.probes = probe_set(
            trainer.datamodule,
            n_states=self.n_states,
            positions_per_window=self.positions_per_window,
            attention_windows=self.attention_windows,
            block_size=pl_module.model.config.block_size,
            seed=self.seed,
        )
        self.schedule = probe_schedule(trainer.max_steps, **self.schedule_options)
        self.run_dir = Path(trainer.default_root_dir)
        if trainer.is_global_zero:
            table.probe_dir(self.run_dir).mkdir(parents=True, exist_ok=True)
            (table.probe_dir(self.run_dir) / "probe_set.json").write_text(
                json.dumps(self.probes.describe(), indent=2)
            )

    def state_dict(self) -> dict[str, Any]:
        # "config" lets probe.py rebuild this exact probe set from a checkpoint alone.
        return {"done": sorted(self.done), "seconds": self.seconds, "config": self.probe_config()}

    def probe_config(self) -> dict[str, Any]:
        """What fixes the probe's numbers: the probe set and the settings (not the schedule)."""
        return {
            "n_states": self.n_states,
            "positions_per_window": self.positions_per_window,
            "attention_windows": self.attention_windows,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "settings": asdict(self.settings),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.done = set(state_dict.get("done", []))
        self.seconds = float(state_dict.get("seconds", 0.0))

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
        rows = [{"step": step, **row} for row in output.rows]
        frame = table.append_rows(table.probe_dir(self.run_dir), rows)
        self._log_scalars(trainer, step, table.rows_to_frame(rows))
        n_done = len(self.done)
        if self.plot_every_n_probes and n_done % self.plot_every_n_probes == 0:
            self._plot(trainer, frame, step)
        self.seconds += time.perf_counter() - start

    def run(self, model: torch.nn.Module):
        """Probe `model` on the fixed windows: eval mode, no gradients, RNG state untouched."""
        return probe_gpt(model, self.probes, batch_size=self.batch_size, settings=self.settings)

    # -- logging ------------------------------------------------------------------------------

    def _wandb(self, trainer: L.Trainer) -> list:
        runs = [lg.experiment for lg in trainer.loggers if isinstance(lg, WandbLogger)]
        if runs and not self._wandb_ready:
            for run in runs:
                run.define_metric("probe/step")
                run.define_metric("probe/*", step_metric="probe/step")
                run.config.update({"probe": self._config()}, allow_val_change=True)
            self._wandb_ready = True
        return runs

    def _config(self) -> dict[str, Any]:
        """`probe_config()` plus the schedule, for the W&B run's config."""
        return {**self.probe_config(), "schedule": self.schedule, **self.schedule_options}

    def _log_scalars(self, trainer: L.Trainer, step: int, frame: pd.DataFrame) -> None:
        runs = self._wandb(trainer)
        if not runs:
            return
        scalars = {"probe/step": step, "probe/seconds_total": self.seconds, **wandb_scalars(frame)}
        for run in runs:
            wandb_charts.define_summaries(run, scalars)  # per-layer peak ID, final anisotropy
            run.log(scalars)

    def _plot(self, trainer: L.Trainer, frame: pd.DataFrame, step: int) -> list[Path]:
        paths = plots.save_figures(frame, table.plot_dir(self.run_dir), metrics=self.plot_metrics)
        runs = self._wandb(trainer)
        if runs:
            import wandb

            images = {f"probe/plots/{p.stem}": wandb.Image(str(p)) for p in paths}
            interactive = wandb_charts.charts(frame)  # tables and charts beside the PNGs
            for run in runs:
                run.log({**images, **interactive, "probe/step": step})
        return paths

    def _finish(self, trainer: L.Trainer) -> None:
        start = time.perf_counter()
        frame = table.read_table(self.run_dir)
        self._plot(trainer, frame, int(frame["step"].max()))
        self.seconds += time.perf_counter() - start
        result = table.summary(frame)
        text = table.format_summary(result)
        print(f"Probe summary ({len(self.done)} probes, {self.seconds:.1f} s in total):\n{text}")
        for run in self._wandb(trainer):
            run.summary.update(
                {f"probe_summary/{k}": v for k, v in result.items() if v is not None}
            )
            run.summary["probe_summary/seconds_total"] = self.seconds
            run.summary.update(wandb_charts.summary(frame))
