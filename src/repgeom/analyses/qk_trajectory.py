"""Queries and keys of chosen heads at every checkpoint of a run, on the training probe's
whole windows: what `repgeom.analyses.qk_projection` projects (Godey et al. 2024, section 5).

Per head it keeps the Gram sums ``Q^T Q`` and ``K^T K`` over steps (float64), each step's mean
query and key over every token, and the rows of `points` drawn tokens (the same positions at
every step).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from repgeom.probes.core.spec import ProbeSpec

BATCH_SIZE = ProbeSpec.batch_size
"""Windows per forward pass."""
DEFAULT_POINTS = 256
"""Tokens per step drawn and written (the means use every token)."""


@dataclass
class _HeadStates:
    """What one head keeps across steps: Gram sums (float64), means, and the drawn rows."""

    gram_q: np.ndarray
    gram_k: np.ndarray
    means_q: list[np.ndarray] = field(default_factory=list)
    means_k: list[np.ndarray] = field(default_factory=list)
    queries: list[np.ndarray] = field(default_factory=list)
    keys: list[np.ndarray] = field(default_factory=list)


@dataclass
class QKTrajectory:
    """Queries and keys of the chosen heads at every checkpoint of a run.

    steps : the checkpoints' global steps, in order; tokens : (n_drawn,) index of each drawn
    token in the flattened (window, position) grid; n_tokens : tokens per step; heads :
    {(layer, head): its states}; shape : the model's (n_layer, n_head).
    """

    steps: list[int]
    tokens: np.ndarray
    n_tokens: int
    heads: dict[tuple[int, int], _HeadStates]
    shape: tuple[int, int]


def qk_trajectory(
    run_dir: str | os.PathLike,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    windows: int | None = None,
    points: int | None = DEFAULT_POINTS,
    seed: int = 0,
    device: str | torch.device | None = "auto",
) -> QKTrajectory:
    """Capture the queries and keys of `layers` x `heads` at every checkpoint of a run.

    Parameters
    ----------
    run_dir : a train.py run folder (``<run>/checkpoints/*.ckpt``, `find_checkpoints`)
    layers : blocks, counted from 1 (the probe table's ``layer``); None: all
    heads : heads, counted from 0; None: all
    windows : whole windows of the probe set; None: the training probe's ``attention_windows``
    points : tokens per step kept for drawing (the same at every step); None: all
    seed : which tokens are drawn
    device : where the forward passes run; ``"auto"``: CUDA when available

    Raises
    ------
    FileNotFoundError
        No such folder, or no checkpoint in it.
    ValueError
        A layer or head the model does not have; windows or points below 1.
    """
    from repgeom.models.checkpoints import find_checkpoints, load_gpt, resolve_device
    from repgeom.probes.core.targets import gpt_captures

    for name, value in (("windows", windows), ("points", points)):
        if value is not None and (isinstance(value, bool) or int(value) < 1):
            raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    found = find_checkpoints(run_dir)
    device = resolve_device(device) if isinstance(device, str | None) else device
    out: QKTrajectory | None = None
    ids = None
    for step, path in found:
        module = load_gpt(path, device)
        config = module.model.config
        if out is None:
            layers = _check_indices(layers, "layer", 1, config.n_layer, "blocks")
            heads = _check_indices(heads, "head", 0, config.n_head - 1, "heads")
            ids = _probe_windows(path, module.vocab, config.block_size, windows)
            n_tokens = ids.numel()
            drawn = np.arange(n_tokens) if points is None or points >= n_tokens else np.sort(
                np.random.default_rng(seed).choice(n_tokens, size=points, replace=False))
            D = config.n_embd // config.n_head
            out = QKTrajectory([], drawn, n_tokens, {
                (layer, head): _HeadStates(np.zeros((D, D)), np.zeros((D, D)))
                for layer in layers for head in heads}, (config.n_layer, config.n_head))
        elif (config.n_layer, config.n_head) != out.shape:
            raise ValueError(f"{path}: the model's shape differs from the run's first checkpoint")
        parts: dict[tuple[int, int], tuple[list, list]] = {key: ([], []) for key in out.heads}
        for capture in gpt_captures(module.model.eval(), ids, None, batch_size=BATCH_SIZE,
                                    attention=False):
            for (layer, head), (qs, ks) in parts.items():
                qs.append(_head_rows(capture.queries[layer - 1], head))
                ks.append(_head_rows(capture.keys[layer - 1], head))
        for key, states in out.heads.items():
            q, k = (np.concatenate(rows) for rows in parts[key])
            states.gram_q += q.T @ q
            states.gram_k += k.T @ k
            states.means_q.append(q.mean(axis=0))
            states.means_k.append(k.mean(axis=0))
            states.queries.append(q[out.tokens])
            states.keys.append(k[out.tokens])
        out.steps.append(step)
        del module, parts
    return out


def _head_rows(x: torch.Tensor, head: int) -> np.ndarray:
    """(B, H, T, D) -> (B * T, D) float64 rows of one head, window by window."""
    return x[:, head].reshape(-1, x.shape[-1]).double().cpu().numpy()


def _check_indices(values: Sequence[int] | None, name: str, low: int, high: int, what: str
                   ) -> list[int]:
    if values is None:
        return list(range(low, high + 1))
    values = [int(v) for v in values]
    bad = [v for v in values if not low <= v <= high]
    if bad or not values:
        raise ValueError(
            f"{name}={bad or values} is out of range: this run's model has {high - low + 1} "
            f"{what}, so {name} must be in {low}..{high}"
        )
    return list(dict.fromkeys(values))


def _probe_windows(path: Path, vocab, block_size: int, windows: int | None) -> torch.Tensor:
    """The first `windows` windows (default: the training probe's ``attention_windows``) of the
    training probe's probe set, rebuilt as ``probe.py ckpt=`` does (`CheckpointTarget`)."""
    from repgeom.models.checkpoints import read_checkpoint
    from repgeom.probes.core.spec import ProbeRequest
    from repgeom.probes.core.targets import checkpoint_probe_set, checkpoint_spec

    ckpt = read_checkpoint(path)
    spec, _ = checkpoint_spec(ProbeRequest(attention_windows=windows), path, ckpt)
    probes = checkpoint_probe_set(path, ckpt, vocab, block_size, spec)
    return probes.windows[: probes.attention_windows]
