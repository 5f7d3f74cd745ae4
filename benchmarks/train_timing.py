"""The one definition of training tokens/s that every benchmark line uses (issue 34).

tokens/s = the tokens of the timed optimizer steps / the seconds between a device sync just
before the first timed step and one just after the last. The first `warmup` steps (compilation,
the allocator, cuDNN's choices) are not timed. A step's tokens are its windows x block_size
(the inputs, `repgeom.models.lightning_module.token_count`), over all ranks. Two syncs per
measurement, none per step, so the timing does not slow what it times.
"""

from __future__ import annotations

import time

import lightning as L
import torch

from repgeom.models.lightning_module import token_count


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU, whose work is already done)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepTimer(L.Callback):
    """Times a Lightning run's steps after `warmup` by the definition above (rank 0's clock)."""

    def __init__(self, warmup: int = 3) -> None:
        self.warmup = warmup
        self.tokens = 0
        self.steps = 0
        self.seconds: float | None = None
        self._start: float | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.warmup:
            sync(pl_module.device)
            self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._start is not None:
            self.tokens += token_count(batch) * trainer.world_size
            self.steps += 1
            if 0 < trainer.max_steps <= trainer.global_step:  # the last step: stop the clock
                self._stop(pl_module)  # here, not after Lightning's end-of-fit work

    def on_train_end(self, trainer, pl_module) -> None:
        if self._start is None:
            raise RuntimeError(f"StepTimer: the run had no step after its {self.warmup} warm-up "
                               "steps; give it more steps (trainer.max_steps)")
        if self.seconds is None:  # a run that ended before max_steps
            self._stop(pl_module)

    def _stop(self, pl_module) -> None:
        sync(pl_module.device)
        self.seconds = time.perf_counter() - self._start

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def ms_per_step(self) -> float:
        return 1000 * self.seconds / self.steps
