"""The training progress bar: Lightning's rich bar plus the throughput monitor's tokens/s.

`ThroughputMonitor` (conf/callbacks/default.yaml) counts tokens through `length_fn` and logs
them per second as ``train/items_per_sec`` (all devices; only when there are several) and
``train/device/items_per_sec``; this bar only shows that number (it measures nothing itself),
next to the train loss and the latest validation bpc that the module logs with
``prog_bar=True``. Reading the loss is a host sync, so with ``recipe.sync_free_logging`` (CUDA)
the bar is redrawn only at the steps the loggers write (trainer.log_every_n_steps).
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar

from repgeom.callbacks.throughput_monitor import sync_free
from repgeom.models.recipe import logs_this_step

THROUGHPUT_KEYS = ("train/items_per_sec", "train/device/items_per_sec")
"""ThroughputMonitor's keys for items (tokens, via `length_fn`) per second: all devices, then
this device (the same number on one device, where the first is not logged)."""


class TokensProgressBar(RichProgressBar):
    """`RichProgressBar` showing ``tokens/s`` once the throughput monitor has a value."""

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)  # the logger's version number tells a user nothing here
        logged = trainer.logged_metrics
        tokens_per_s = next((logged[k] for k in THROUGHPUT_KEYS if k in logged), None)
        if tokens_per_s is not None:
            metrics["tokens/s"] = f"{float(tokens_per_s):,.0f}"
        if "train/loss" not in metrics and "train/loss" in logged:  # sync-free: not a prog_bar
            metrics["train/loss"] = f"{float(logged['train/loss']):.3f}"  # metric (read here)
        return metrics

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        self._step = trainer.global_step  # the step this batch's metrics are logged at
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:
        if sync_free(trainer, pl_module) and not logs_this_step(trainer, self._step):
            return  # the loss stays on the GPU until a logging step reads it
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def _get_train_description(self, current_epoch: int) -> str:
        """Lightning's "Epoch e/{max_epochs - 1}" reads "Epoch 0/-2" in a run bounded by
        ``max_steps`` (``max_epochs = -1``; ours are one epoch of ``max_steps`` steps, see the
        datamodule): such a run's bar reads "Training"."""
        trainer = self.trainer
        if trainer.max_epochs is not None and trainer.max_epochs < 0 and trainer.max_steps > 0:
            return f"{'Training':{len(self.validation_description)}}"
        return super()._get_train_description(current_epoch)
