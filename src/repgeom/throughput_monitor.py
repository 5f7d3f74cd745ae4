"""Lightning's `ThroughputMonitor` without a host sync per step when `recipe.sync_free_logging`.

Lightning's monitor calls `torch.cuda.synchronize()` after every training batch, so that its
clock reads finished work; that stalls the host once a step, and the next step's kernels are
queued only after the GPU has drained. Sync-free (conf/recipe/: on CUDA by default), this
monitor counts every batch but synchronizes and reads the clock only at the steps the loggers
write (trainer.log_every_n_steps): the tokens between two such steps over the seconds between
them, which is the same quantity measured over longer intervals; its rolling window
(`window_size`, in updates) is divided by the logging interval, so that it still spans the same
number of steps. Off (the CPU, `recipe=off`), it is Lightning's monitor unchanged.

On an H100, H200 or GH200 its MFU (``device/mfu``) reads the dense bf16 peak of
`repgeom.peak_flops`, not Lightning's table (which lacks a plain "NVIDIA H200" and holds the
with-sparsity figure of the H100 NVL); other devices keep Lightning's figure.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ThroughputMonitor as _LightningThroughputMonitor
from lightning.pytorch.callbacks.throughput_monitor import _plugin_to_compute_dtype
from lightning.pytorch.utilities import rank_zero_only

from repgeom.models.recipe import switch_on
from repgeom.peak_flops import hopper_variant, peak_flops


def sync_free(trainer: L.Trainer, pl_module: L.LightningModule) -> bool:
    """Whether the module's `sync_free_logging` switch is on for the device the run trains on."""
    value = pl_module.hparams.get("sync_free_logging", False)
    return switch_on(value, trainer.strategy.root_device)


class ThroughputMonitor(_LightningThroughputMonitor):
    """`lightning.pytorch.callbacks.ThroughputMonitor`, synchronizing only at logging steps when
    the module's `sync_free_logging` is on (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._skipped: dict[Any, int] = {}  # batches counted since the stage's last update

    def _start(self, trainer: L.Trainer) -> None:
        super()._start(trainer)
        self._skipped[trainer.state.stage] = 0

    def _update(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                iter_num: int) -> None:
        # Lightning's Throughput sums each update's `flops` as the FLOPs since the last update;
        # it is given one batch's, so an update that covers skipped batches carries theirs too.
        super()._update(trainer, pl_module, batch, iter_num)
        skipped = self._skipped.get(trainer.state.stage, 0)
        self._skipped[trainer.state.stage] = 0
        flops = self._throughputs[trainer.state.stage]._flops
        if skipped and flops:
            flops[-1] *= skipped + 1

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if sync_free(trainer, pl_module):  # one update per logging step: a window as many steps
            every = max(1, trainer.log_every_n_steps)
            window = self.kwargs.get("window_size", 100)
            self.kwargs = {**self.kwargs, "window_size": max(2, window // every)}
        super().setup(trainer, pl_module, stage)
        device = trainer.strategy.root_device
        if device.type == "cuda" and hopper_variant(torch.cuda.get_device_name(device)):
            dtype = _plugin_to_compute_dtype(trainer.precision_plugin)
            self.available_flops = peak_flops(torch.cuda.get_device_name(device), dtype)
            for throughput in self._throughputs.values():
                throughput.available_flops = self.available_flops

    @rank_zero_only
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
        *args: Any,
    ) -> None:
        if not sync_free(trainer, pl_module) or trainer._logger_connector.should_update_logs:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, *args)
            return
        # Count the batch without reading the clock: the next logging step's update covers it.
        stage = trainer.state.stage
        if self.length_fn is not None:
            self._lengths[stage] += self.length_fn(batch)
        self._samples[stage] += self.batch_size_fn(batch)
        self._batches[stage] += 1
        self._skipped[stage] = self._skipped.get(stage, 0) + 1
