"""The GPU speed recipe's switches (conf/recipe/): each is true, false or "auto".

"auto" means on for a run on CUDA and off elsewhere, so that a CPU run keeps its numbers
exactly; `switch_on` reads a switch against the device the run trains on, and `check_recipe`
refuses a value that is none of the three, by name, before any data is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

SWITCHES = ("compile", "tf32", "fused_adamw", "sync_free_logging", "pin_memory", "pad_vocab")
"""The recipe's on/off parts; `finite_check_every_n_steps` is a step count or "auto"."""
VOCAB_MULTIPLE = 64
"""recipe.pad_vocab pads the embedding/output rows to a multiple of this (`GPTConfig`)."""


class RecipeError(ValueError):
    """A recipe option is out of range; the message names it and what it may be."""


def switch_on(value: bool | str, device: torch.device | str) -> bool:
    """Whether a switch is on for a run on `device`: True/False as given, "auto" on CUDA only."""
    if isinstance(value, str):
        if value != "auto":
            raise RecipeError(f"a recipe switch is true, false or 'auto', got {value!r}")
        return torch.device(device).type == "cuda"
    return bool(value)


def finite_check_interval(value: int | str, device: torch.device | str, log_every: int) -> int:
    """Steps between two host reads of the loss's finiteness: `value`, or for "auto" 1 on the CPU
    and `log_every` (trainer.log_every_n_steps, at least 1) on CUDA."""
    if value == "auto":
        return max(1, int(log_every)) if torch.device(device).type == "cuda" else 1
    return int(value)


def logs_this_step(trainer: Any, step: int) -> bool:
    """Whether the loggers write the metrics of the training batch that began at optimizer step
    `step` (`trainer.global_step` when the batch started).

    Lightning's rule (`LoggerConnector.should_update_logs`): every `log_every_n_steps`-th step,
    and the last one when the trainer stops; its step counter is kept equal to `global_step` at
    each batch's start (`CharLM.on_train_batch_start`), so the rule reads public attributes.
    """
    every = trainer.log_every_n_steps
    return every > 0 and ((step + 1) % every == 0 or bool(trainer.should_stop))


def vocab_multiple(recipe: Mapping[str, Any] | None, device: torch.device | str) -> int:
    """`model.vocab_multiple` for a run on `device`: VOCAB_MULTIPLE where recipe.pad_vocab is
    on (by default: on CUDA), else 1 (no padding: the CPU's numbers stay as they were)."""
    return VOCAB_MULTIPLE if switch_on((recipe or {}).get("pad_vocab", False), device) else 1


def set_tf32_matmul(on: bool) -> None:
    """float32 matmuls on CUDA on TF32 tensor cores (`on`) or in full IEEE float32, process-wide.

    torch 2.9 added ``torch.backends.cuda.matmul.fp32_precision`` ("tf32"/"ieee") and deprecated
    ``allow_tf32``; before 2.9 setting ``fp32_precision`` raises ``AttributeError: Unknown
    attribute`` (the backend object refuses names it does not know), so an older torch gets
    ``allow_tf32``, the same switch under its earlier name.
    """
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9
        matmul.fp32_precision = "tf32" if on else "ieee"
    else:
        matmul.allow_tf32 = bool(on)


def check_recipe(recipe: Mapping[str, Any] | None) -> None:
    """Raise `RecipeError` naming the first recipe option that is out of range."""
    recipe = recipe or {}
    for name in SWITCHES:
        value = recipe.get(name, "auto")
        if not (isinstance(value, bool) or value == "auto"):
            raise RecipeError(
                f"recipe.{name} must be true, false or auto (on for CUDA only), got {value!r}"
            )
    every = recipe.get("finite_check_every_n_steps", "auto")
    if every != "auto" and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise RecipeError(
            "recipe.finite_check_every_n_steps must be a positive number of steps or auto "
            f"(every step on the CPU, every trainer.log_every_n_steps on CUDA), got {every!r}"
        )
