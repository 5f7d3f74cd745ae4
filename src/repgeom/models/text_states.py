"""One text's states at every layer, for either kind of model: the one reader of compare mode
(`repgeom.probes.run.compare`) and the analyses (`repgeom.analyses.subjects`).

Layers follow the probe's rule (`repgeom.models.capture.Capture.layers`): the embedding, each
block, the final norm where the model has one. A text longer than one window is cut into
consecutive windows, never truncated: each window is run on its own (its context starts at the
window's first token) and the windows' states are joined in text order, so every token of the
text has one row. Special tokens are left out unless asked for (``include_special``).

The window: our checkpoints use their ``block_size``; a Hugging Face model
`repgeom.models.hf.windows.DEFAULT_WINDOW` tokens (special tokens included) or its positions
where fewer; ``window=`` sets another, at most that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from repgeom.models.hf.loading import HFModel

__all__ = ["TextStates", "read_text_states", "text_window_ids"]


@dataclass(frozen=True)
class TextStates:
    """states : per layer, a (T, C) float32 CPU tensor, one row per token of the text.
    tokens : the T tokens, as strings. layer_names : ``embedding``, ``block_<i>``, ...
    n_windows : how many windows the text was cut into (1 when it fits)."""

    states: list[torch.Tensor]
    tokens: list[str]
    layer_names: list[str]
    n_windows: int


def _window_size(model: Any, window: int | None) -> int:
    if isinstance(model, HFModel):
        from repgeom.models.hf.windows import default_window

        longest = default_window(model)
        if window is None:
            return longest
        positions = getattr(model.model.config, "max_position_embeddings", None)
        longest = positions or window
    else:
        longest = model.model.config.block_size
        if window is None:
            return longest
    if not isinstance(window, int) or not 1 <= window <= longest:
        raise ValueError(f"window must be an integer from 1 to {longest}, got {window!r}")
    return window


def text_window_ids(model: Any, text: str, *, window: int | None = None) -> list[torch.Tensor]:
    """The (1, T) id tensors of `text`'s windows (module docstring), special tokens included.

    `model` is an `HFModel` or one of our loaded checkpoints (``.model`` a `GPT`, ``.vocab``).
    """
    size = _window_size(model, window)
    if isinstance(model, HFModel):
        from repgeom.models.hf.windows import text_windows

        rows = text_windows(model, text, window=size)
        if not rows[0]:
            raise ValueError(f"{model.name}: the tokenizer gives no token for {text[:40]!r}")
        return [torch.tensor([row]) for row in rows]
    ids = np.asarray(model.vocab.encode(text.encode("utf-8")), dtype=np.int64)
    if ids.size == 0:
        raise ValueError("the text is empty")
    ids = torch.from_numpy(ids)
    return [ids[i : i + size][None] for i in range(0, len(ids), size)]


@torch.no_grad()
def read_text_states(
    model: Any, text: str, *, window: int | None = None, include_special: bool = False
) -> TextStates:
    """`text`'s states at every layer (module docstring: windows, layers, special tokens).

    Parameters
    ----------
    model : HFModel or a loaded checkpoint (``.model`` a `GPT`, ``.vocab`` its `Vocab`)
    text : str
    window : int, optional
        Tokens per window; None: the model's default (module docstring).
    include_special : bool
        Keep the special tokens (CLS, SEP, BOS, ...) a Hugging Face tokenizer adds.

    Raises
    ------
    ValueError
        An empty text, a bad `window`, or no token left besides special tokens.
    """
    states, tokens, names = None, [], []
    windows = text_window_ids(model, text, window=window)
    for ids in windows:
        if isinstance(model, HFModel):
            from repgeom.models.hf import hf_capture

            capture = hf_capture(model, ids, torch.ones_like(ids), attention=False,
                                 include_special=include_special)
            keep = capture.valid[0].cpu()
            tokens += model.tokenizer.convert_ids_to_tokens(ids[0][keep].tolist())
        else:
            device = next(model.model.parameters()).device
            capture = model.model.eval().capture(ids.to(device), attention=False)
            tokens += [model.vocab.decode([i]).decode("utf-8", errors="replace")
                       for i in ids[0].tolist()]
        layers = capture.text_states()
        states = layers if states is None else [torch.cat(p) for p in zip(states, layers,
                                                                           strict=True)]
        names = capture.layer_names()
    if states[0].shape[0] == 0:
        raise ValueError(f"the text {text[:40]!r} has no tokens left after removing special "
                         "tokens")
    return TextStates(states, tokens, names, len(windows))
