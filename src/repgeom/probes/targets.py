"""What the probe reads a model through: captures of our GPT on a probe set.

`probe_gpt` is the one function that runs our GPT on a probe set and measures it, for the
training callback and for probe.py's checkpoints alike.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from repgeom.models.capture import Capture
from repgeom.probes.measure import ProbeOutput, ProbeSettings, measure
from repgeom.probes.sampling import ProbeSet


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
    keep_states: bool = False,
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
            return measure(states, attention, settings, keep_states=keep_states)
    finally:
        model.train(was_training)
