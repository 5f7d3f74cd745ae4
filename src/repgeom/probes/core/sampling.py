"""The probe set: which windows and positions the probes read, and its defaults.

Razzhigaev et al. 2023 (section 2.2) shuffle the token states before cutting them into
batches "to mitigate potential correlations". Shuffling alone does not decorrelate a set that
holds every position of a few windows: neighbouring characters of one window are each other's
nearest neighbours, and TwoNN reads that chain (on the quickstart checkpoint, 16 whole windows
gave TwoNN 4.1-5.4 where 800 windows x 5 positions gave 7.3-7.6). So the state probe set takes
a few random positions from each of many windows; `benchmarks/bench_probe_protocol.py` measured
the defaults below against a 50,000-state reference (`benchmarks/README.md`).

Attention and query/key metrics need every position a query attends to: they read the first
`attention_windows` windows whole.

The training callback and ``probe.py`` both build their probe set here, so a checkpoint probed
later sees exactly the windows and positions the training probe saw.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from repgeom.data.tokens import choose_windows

DEFAULT_N_STATES = 8192
"""States per layer: two batches of 4096, so every state metric has a spread over batches."""
DEFAULT_POSITIONS_PER_WINDOW = 4
"""Random positions per window: 2,048 windows at the default size. Chosen by measurement: on
the quickstart checkpoint, TwoNN of every block within 2.4% of the reference, against 10-15%
low with 16 positions from 512 windows and 47-52% low with whole windows."""
DEFAULT_ATTENTION_WINDOWS = 16
"""Whole windows for the attention and query/key metrics."""


@dataclass(frozen=True)
class ProbeSet:
    """Windows, the sampled state positions in each, and how many windows attention reads.

    windows : (n_windows, T) int64 tensor of token ids
    positions : (n_windows, T) bool tensor, True at the positions whose states are probed
    attention_windows : int, the first this many windows are read whole by attention metrics
    attention_mask : (n_windows, T) tensor or None, the tokenizer's mask (padding is 0)
    """

    windows: torch.Tensor
    positions: torch.Tensor
    attention_windows: int
    attention_mask: torch.Tensor | None = None
    """(n_windows, T) 0/1 tensor of real tokens (Hugging Face windows); None: every token."""
    texts: str = "real"
    """``real``, or ``shuffled``: each window's tokens shuffled among its probe-able positions
    (`shuffle_tokens`), the control of Cheng et al. (ICLR 2025)."""
    characters: torch.Tensor | None = None
    """(n_windows, T) characters of the text each token covers (Hugging Face windows:
    `repgeom.models.hf.windows.window_characters`, moved with its token when shuffled), for
    ``bpc``; None: one character per token (our byte windows)."""

    @property
    def n_states(self) -> int:
        return int(self.positions.sum())

    def describe(self) -> dict[str, int]:
        """The probe set as used (after any fallback), for ``probes/probe_set.json``."""
        per_window = self.positions.sum(dim=1)
        return {
            "n_states": self.n_states,
            "n_windows": len(self.windows),
            "window": int(self.windows.shape[1]),
            "positions_per_window": int(per_window.max()),
            "attention_windows": self.attention_windows,
            "texts": self.texts,
        }


def windows_needed(n_states: int, positions_per_window: int | None, window: int) -> int:
    """How many windows give `n_states` states at `positions_per_window` (None: all) each."""
    per_window = positions_per_window or window
    if per_window > window:
        raise ValueError(
            f"probe.positions_per_window ({per_window}) exceeds the window length ({window}); "
            f"use at most {window}, or null for every position"
        )
    return math.ceil(n_states / per_window)


def fit_to_text(
    n_states: int, positions_per_window: int | None, available: int, window: int
) -> tuple[int, int | None]:
    """(windows, positions per window) for `n_states` states from a text of `available` windows.

    When the text holds fewer windows than `n_states` needs, every window is taken at more
    positions, with a warning: decorrelation is bounded by the held-out text, not by the
    sampling (a batch of 4096 states from W windows holds ~4096 / W states per window whatever
    the positions).
    """
    n_windows = windows_needed(n_states, positions_per_window, window)
    if n_windows <= available:
        return n_windows, positions_per_window
    per_window = min(math.ceil(n_states / available), window)
    warnings.warn(
        f"the text holds {available} windows of {window}, fewer than the {n_windows} that "
        f"n_states={n_states} at {positions_per_window} positions per window needs; probing "
        f"every window at {per_window} positions. Each batch of 4096 states then holds "
        f"~{4096 / available:.1f} states per window, and TwoNN reads low (about 10% on the "
        "bundled sample's 811 windows, benchmarks/README.md 'Probe protocol'); the full enwik8 "
        "(data=enwik8) has 19,531 validation windows",
        stacklevel=3,
    )
    return available, per_window


TEXTS = ("real", "shuffled")
"""`ProbeSpec.texts`' values: the text as it is, or each window's tokens shuffled."""


def shuffle_tokens(windows: torch.Tensor, candidates: torch.Tensor, seed: int) -> torch.Tensor:
    """Each window's tokens at its `candidates` positions (every position of our byte windows;
    a Hugging Face window's real, non-special tokens) in a random order from `seed`, the other
    positions (padding, BOS/CLS/SEP) left in place: the same tokens and positions without their
    order, the shuffled-text control of Cheng et al. (ICLR 2025, "Emergence of a
    high-dimensional abstraction phase in language transformers", section 4).

    The order comes from a random stream of its own (``numpy.random.default_rng([seed, 1])``),
    not the one `choose_positions` draws the positions from.
    """
    rng = np.random.default_rng([int(seed), 1])
    out = windows.clone()
    candidates = candidates.bool().cpu()
    for row in range(len(windows)):
        index = candidates[row].nonzero().squeeze(1)
        order = torch.from_numpy(rng.permutation(len(index)))
        out[row, index] = windows[row, index[order]]
    return out


def choose_positions(
    candidates: torch.Tensor, positions_per_window: int | None, seed: int
) -> torch.Tensor:
    """`positions_per_window` random positions among each window's `candidates`, from `seed`.

    Parameters
    ----------
    candidates : (n_windows, T) bool tensor
        Positions that may be probed (False for padding or left-out special tokens).
    positions_per_window : int or None
        None keeps every candidate; a window with fewer candidates keeps them all.
    seed : int

    Returns
    -------
    (n_windows, T) bool tensor
    """
    candidates = candidates.bool().cpu()
    if positions_per_window is None:
        return candidates.clone()
    if positions_per_window < 1:
        raise ValueError(
            f"probe.positions_per_window must be a positive integer or null, "
            f"got {positions_per_window}"
        )
    generator = torch.Generator().manual_seed(seed)
    # A random key per position, candidates first: the k smallest keys are k random candidates.
    keys = torch.rand(candidates.shape, generator=generator).masked_fill(~candidates, 2.0)
    k = min(positions_per_window, candidates.shape[1])
    chosen = torch.zeros_like(candidates)
    chosen.scatter_(1, keys.topk(k, dim=1, largest=False).indices, True)
    return chosen & candidates


@dataclass(frozen=True)
class WindowPool:
    """The windows a probe set is drawn from, whatever their source.

    count : how many windows there are
    usable : positions per window that may be probed (`fit_to_text`'s window)
    take : sorted window indices -> (windows (n, T) int64, candidates (n, T) bool, attention
        mask (n, T) or None): the chosen windows, the positions that may be probed in each
        (False for padding or left-out special tokens) and the tokenizer's mask
    special_ids : the tokenizer's special ids (BOS, CLS, SEP, ...), which ``texts=shuffled``
        leaves in place also where they may be probed (``include_special``)
    """

    count: int
    usable: int
    take: Callable[[np.ndarray], tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]
    special_ids: tuple[int, ...] = ()
    characters: torch.Tensor | None = None
    """(count, T) characters each token of every window covers (`ProbeSet.characters`)."""

    @classmethod
    def of_windows(cls, windows: torch.Tensor) -> WindowPool:
        """Every position of every window may be probed (our byte windows)."""
        return cls(len(windows), windows.shape[1], lambda chosen: (
            windows[torch.from_numpy(chosen)], torch.ones((len(chosen), windows.shape[1]),
                                                          dtype=torch.bool), None))


def draw(pool: WindowPool, spec: Any) -> ProbeSet:
    """The probe set of every source (the training probe's validation windows, a text file, an
    HF tokenizer's windows): ``ceil(n_states / positions_per_window)`` windows drawn from
    ``spec.seed`` (`choose_windows`: spread over the whole text), `positions_per_window` random
    positions among each one's candidates (`choose_positions`), and the first
    ``attention_windows`` of them whole for attention. `spec` is a `ProbeSpec`; its
    ``texts="shuffled"`` shuffles each window's ordinary tokens (`shuffle_tokens`: not the
    pool's `WindowPool.special_ids`, probed or not), the same windows and positions.

    A pool with fewer windows than needed gives every window at more positions (`fit_to_text`);
    one that still falls short of ``n_states`` warns.
    """
    wanted, per_window = fit_to_text(
        spec.n_states, spec.positions_per_window, pool.count, pool.usable
    )
    chosen = choose_windows(pool.count, wanted, spec.seed)
    windows, candidates, mask = pool.take(chosen)
    characters = None if pool.characters is None else pool.characters[torch.from_numpy(chosen)]
    positions = choose_positions(candidates, per_window, spec.seed)
    texts = getattr(spec, "texts", TEXTS[0])
    if texts == "shuffled":  # the ordinary tokens only: padding and special tokens stay
        ordinary = candidates & ~torch.isin(windows, torch.tensor(pool.special_ids,
                                                                  dtype=windows.dtype))
        windows = shuffle_tokens(windows, ordinary, spec.seed)
        if characters is not None:  # the same order (the same stream): with their tokens
            characters = shuffle_tokens(characters, ordinary, spec.seed)
    probes = ProbeSet(windows, positions, min(spec.attention_windows, len(windows)), mask, texts,
                      characters)
    if probes.n_states < spec.n_states:
        warnings.warn(
            f"the text gives {probes.n_states} states per layer, fewer than "
            f"n_states={spec.n_states}; probing all of them",
            stacklevel=2,
        )
    return probes


def probe_set(validation: Any, spec: Any) -> ProbeSet:
    """The fixed probe set of a run's validation split (`draw` on its aligned windows of
    ``block_size``, a `repgeom.data.tokens.ValidationWindows`: the same windows for a causal
    and a bidirectional run)."""
    block_size = validation.block_size
    return draw(WindowPool(validation.n_probe_windows, block_size, lambda chosen: (
        validation.slot_windows(chosen),
        torch.ones((len(chosen), block_size), dtype=torch.bool), None)), spec)
