"""Where a training run's wall time goes: probes, checkpoint writes, validation, the rest.

A callback for train.py (issue 41, item 4), added from the command line:

    PYTHONPATH=benchmarks python train.py model=gpt_small data=sample trainer.max_steps=2000 \\
        +callbacks.wall_shares._target_=wall_shares.WallShares

At the end of the fit it prints one line (and appends it to `results`, if given): the fit's wall
seconds and the share of each part. Probes: the seconds spent inside the probe callback's hooks
(`repgeom.probes.run.callback.ProbeCallback`; offloaded, that is the snapshot's cost to training,
not the worker's probe). Checkpoints: the seconds inside `trainer.save_checkpoint`. Validation:
the seconds from the validation loop's start to its end, less the probe and checkpoint seconds
spent inside it. The rest is training (steps, logging, data). Host clocks only, no device sync:
work still queued on the GPU at a boundary is counted where it finishes.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import lightning as L

PROBE_HOOKS = ("on_train_start", "on_train_batch_end", "on_validation_batch_end",
               "on_before_optimizer_step", "on_train_end")


class WallShares(L.Callback):
    """Times probes, checkpoint writes and validation within a fit (see the module docstring)."""

    def __init__(self, results: str | None = None, label: str = "",
                 probe_types: tuple[type, ...] | None = None) -> None:
        self.results = Path(results) if results else None
        self.probe_types = probe_types  # None: repgeom's ProbeCallback
        self.label = label
        self.seconds = {"probes": 0.0, "checkpoints": 0.0, "validation": 0.0}
        self._fit_start: float | None = None
        self._validation_start: float | None = None
        self._inside = 0.0  # probe and checkpoint seconds inside the current validation
        self.line: str | None = None

    def _timed(self, part: str, method):
        @functools.wraps(method)
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent = time.perf_counter() - started
                self.seconds[part] += spent
                if self._validation_start is not None:
                    self._inside += spent
        return timed

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        from repgeom.probes.run.callback import ProbeCallback

        trainer.save_checkpoint = self._timed("checkpoints", trainer.save_checkpoint)
        for callback in trainer.callbacks:
            if isinstance(callback, self.probe_types or (ProbeCallback,)):
                for hook in PROBE_HOOKS:
                    setattr(callback, hook, self._timed("probes", getattr(callback, hook)))

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fit_start = time.perf_counter()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self._validation_start, self._inside = time.perf_counter(), 0.0

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._validation_start is None:
            return
        spent = time.perf_counter() - self._validation_start - self._inside
        self.seconds["validation"] += spent
        self._validation_start = None

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        total = time.perf_counter() - self._fit_start
        rest = total - sum(self.seconds.values())
        parts = "; ".join(f"{name} {s:.1f} s ({100 * s / total:.1f}%)" for name, s in
                          [*self.seconds.items(), ("training and the rest", rest)])
        self.line = (f"whole run{f' ({self.label})' if self.label else ''}: "
                     f"{trainer.global_step} steps in {total:.1f} s; {parts}")
        print(self.line, flush=True)
        if self.results is not None:
            with open(self.results, "a", encoding="utf-8") as f:
                f.write(self.line + "\n")
