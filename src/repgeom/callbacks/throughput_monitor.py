"""The throughput monitor: Lightning's public `Throughput` fed at the steps the loggers write.

It logs what Lightning's `lightning.pytorch.callbacks.ThroughputMonitor` logs, under the same
keys (``train/device/items_per_sec``, ``train/device/flops_per_sec``, ``train/device/mfu``,
``train/lengths``, ...: `lightning.fabric.utilities.throughput.Throughput.compute`), with the
same meaning: rolling averages over the last `window_size` updates of the items (tokens, by
`length_fn`), samples, batches and FLOPs per second of training; time spent in validation is
not training time. It is its own callback on `Throughput`'s public methods, where Lightning's
would need its private ones overridden, for one difference:

Lightning's monitor calls `torch.cuda.synchronize()` after every training batch, so that its
clock reads finished work; that stalls the host once a step, and the next step's kernels are
queued only after the GPU has drained. Sync-free (`recipe.sync_free_logging`; conf/recipe/: on
CUDA by default), this monitor counts every batch but synchronizes and reads the clock only at
the steps the loggers write (trainer.log_every_n_steps): the tokens between two such steps over
the seconds between them, which is the same quantity measured over longer intervals; its
rolling window (`window_size`, in updates) is divided by the logging interval, so that it still
spans the same number of steps, and each update carries the FLOPs of every batch it covers.

On an H100, H200 or GH200 its MFU (``device/mfu``) reads the dense bf16 peak of
`repgeom.peak_flops`, not Lightning's table (which lacks a plain "NVIDIA H200" and holds the
with-sparsity figure of the H100 NVL); other devices keep Lightning's `get_available_flops`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.throughput import Throughput, get_available_flops
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities import rank_zero_only

from repgeom.models.recipe import logs_this_step, switch_on
from repgeom.peak_flops import hopper_variant, peak_flops

COMPUTE_DTYPES = {
    "64-true": torch.float64, "32-true": torch.float32,
    "16-true": torch.float16, "16-mixed": torch.float16,
    "bf16-true": torch.bfloat16, "bf16-mixed": torch.bfloat16,
}
"""`trainer.precision` -> the dtype the matmuls run in (Lightning's `_plugin_to_compute_dtype`
for these plugins); another precision has no peak to divide by, so no MFU."""


def sync_free(trainer: L.Trainer, pl_module: L.LightningModule) -> bool:
    """Whether the module's `sync_free_logging` switch is on for the device the run trains on."""
    value = pl_module.hparams.get("sync_free_logging", False)
    return switch_on(value, trainer.strategy.root_device)


def available_flops(trainer: L.Trainer) -> float | None:
    """One device's peak FLOP/s at the run's precision: repgeom's dense figure on a Hopper GPU,
    else Lightning's; None where neither knows the device or the precision."""
    dtype = COMPUTE_DTYPES.get(str(trainer.precision))
    if dtype is None:
        return None
    device = trainer.strategy.root_device
    if device.type == "cuda" and hopper_variant(torch.cuda.get_device_name(device)):
        return peak_flops(torch.cuda.get_device_name(device), dtype)
    return get_available_flops(device, dtype)


class ThroughputMonitor(L.Callback):
    """Logs `Throughput`'s metrics of training and validation (see the module docstring).

    `batch_size_fn(batch)` counts the samples of a batch, `length_fn(batch)` its items (tokens);
    the module's `flops_per_batch` (None until known) its FLOPs.
    """

    def __init__(self, batch_size_fn: Callable[[Any], int],
                 length_fn: Callable[[Any], int] | None = None, window_size: int = 100,
                 separator: str = "/") -> None:
        super().__init__()
        self.batch_size_fn, self.length_fn = batch_size_fn, length_fn
        self.window_size, self.separator = window_size, separator
        self.available_flops: float | None = None
        self.throughputs: dict[RunningStage, Throughput] = {}
        self._totals: dict[RunningStage, dict[str, int]] = {}  # batches, samples, lengths
        self._pending: dict[RunningStage, int] = {}  # batches since the stage's last update
        self._t0: dict[RunningStage, float] = {}
        self._elapsed: dict[RunningStage, float] = {}  # the clock at the stage's last update
        self._step = 0  # trainer.global_step when the training batch began
        self._validated = 0  # validation batches seen (the step their metrics are logged at)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.available_flops = available_flops(trainer)
        window = self.window_size
        if sync_free(trainer, pl_module):  # one update per logging step: a window as many steps
            window = max(2, window // max(1, trainer.log_every_n_steps))
        stages = [trainer.state.stage]
        if stage == TrainerFn.FITTING and trainer.enable_validation:
            stages.append(RunningStage.VALIDATING)
        for running in stages:
            self.throughputs[running] = Throughput(
                available_flops=self.available_flops, world_size=trainer.world_size,
                window_size=window, separator=self.separator)

    def _start(self, trainer: L.Trainer, stage: RunningStage) -> None:
        if trainer.state.fn == TrainerFn.FITTING or stage not in self._totals:
            self.throughputs[stage].reset()
            self._totals[stage] = {"batches": 0, "samples": 0, "lengths": 0}
            self._pending[stage] = 0
            self._elapsed[stage] = 0.0
        self._t0[stage] = time.perf_counter()

    def _clock(self, trainer: L.Trainer, stage: RunningStage) -> float:
        """Seconds of the stage so far, once the device has finished its queued work."""
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - self._t0[stage]

    @torch.inference_mode()  # in case `length_fn` or `batch_size_fn` computes grads
    def _count(self, stage: RunningStage, batch: Any) -> None:
        totals = self._totals[stage]
        totals["batches"] += 1
        totals["samples"] += self.batch_size_fn(batch)
        if self.length_fn is not None:
            totals["lengths"] += self.length_fn(batch)
        self._pending[stage] += 1

    def _update(self, trainer: L.Trainer, pl_module: L.LightningModule,
                stage: RunningStage) -> dict[str, float]:
        """One `Throughput.update` covering the batches counted since the last one; its
        metrics, keyed ``<stage>/<name>``."""
        elapsed = self._elapsed[stage] = self._clock(trainer, stage)
        totals = self._totals[stage]
        per_batch = getattr(pl_module, "flops_per_batch", None)
        throughput = self.throughputs[stage]
        # `flops` is the FLOPs since the last update: those of every batch it covers
        throughput.update(
            time=elapsed, batches=totals["batches"], samples=totals["samples"],
            lengths=None if self.length_fn is None else totals["lengths"],
            flops=None if per_batch is None else per_batch * self._pending[stage])
        self._pending[stage] = 0
        return {f"{stage.value}{self.separator}{k}": v for k, v in throughput.compute().items()}

    @rank_zero_only
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start(trainer, RunningStage.TRAINING)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        self._step = trainer.global_step

    @rank_zero_only
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        stage = RunningStage.TRAINING
        self._count(stage, batch)
        logs = logs_this_step(trainer, self._step)
        if sync_free(trainer, pl_module) and not logs:
            return  # no clock read: the next logging step's update covers this batch
        metrics = self._update(trainer, pl_module, stage)
        if logs and trainer.global_step > self._step:  # the batch that stepped the optimizer
            # logged with the step's other metrics, at the step the loggers write them; float64,
            # as the values are (`self.log` would round a number to float32)
            exact = {k: torch.tensor(v, dtype=torch.float64) for k, v in metrics.items()}
            pl_module.log_dict(exact, on_step=True, on_epoch=False)

    @rank_zero_only
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        if trainer.state.fn == TrainerFn.FITTING and RunningStage.TRAINING in self._t0:
            # training's clock stops here (sync-free, its last update may lie steps back)
            self._elapsed[RunningStage.TRAINING] = self._clock(trainer, RunningStage.TRAINING)
        self._start(trainer, RunningStage.VALIDATING)

    @rank_zero_only
    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                                outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        if trainer.sanity_checking:
            return
        stage = RunningStage.VALIDATING
        self._count(stage, batch)
        self._validated += 1
        metrics = self._update(trainer, pl_module, stage)
        every = trainer.log_every_n_steps
        if every > 0 and ((batch_idx + 1) % every == 0 or trainer.should_stop):
            for logger in trainer.loggers:  # at the validation batch's count, as Lightning's
                logger.log_metrics(metrics, step=self._validated)

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        train, val = RunningStage.TRAINING, RunningStage.VALIDATING
        if train not in self._t0:
            return
        # Lightning's rule: the time from training's last clock read to the last validation
        # batch is not training time
        stopped = self._t0[train] + self._elapsed[train]
        self._t0[train] += (self._t0[val] - stopped) + self._elapsed[val]
