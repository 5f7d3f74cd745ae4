"""A callback that stops (SIGSTOP) the training process at a known point, so that a test kills it
there, not wherever a race with the clock put it: at the first step >= `step` at which the
checkpoint `checkpoint` exists. Added to a train.py command by overrides (`overrides`)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import lightning as L


class StopAtStep(L.Callback):
    def __init__(self, step: int, checkpoint: str) -> None:
        self.step, self.checkpoint = int(step), Path(checkpoint)

    def on_train_batch_end(self, trainer, *args, **kwargs) -> None:
        if trainer.global_step >= self.step and self.checkpoint.is_file():
            os.kill(os.getpid(), signal.SIGSTOP)  # the test kills it now (SIGKILL)


def overrides(step: int) -> list[str]:
    """train.py overrides that add `StopAtStep` (its module on the PYTHONPATH: `pythonpath`)."""
    return ["+callbacks.stop_at._target_=offload_stop.StopAtStep",
            f"+callbacks.stop_at.step={step}",
            "+callbacks.stop_at.checkpoint=${output_dir}/checkpoints/last.ckpt"]


def pythonpath() -> str:
    """This folder first on the PYTHONPATH, then what this process has."""
    return os.pathsep.join(p for p in (str(Path(__file__).parent),
                                       os.environ.get("PYTHONPATH")) if p)


def stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (state T in /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "tT"
    except (OSError, IndexError):
        return False
