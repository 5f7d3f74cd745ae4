"""Models as analysis subjects: one interface for Hugging Face models and our checkpoints.

An analysis needs, for one text, the states of every layer at the text's own tokens. Both
kinds of model give them in the probe's layer convention (`repgeom.models.capture.Capture`):
layer 0 is the embedding output, layer i the residual stream after block i (before any final
norm), and, for models that have one, a last layer ``final_norm``. Layer names follow
`repgeom.probes.core.table`: ``embedding``, ``block_<i>``, ``final_norm``.

Special tokens (CLS, SEP, BOS, ...) are left out, as in the probes (`hf_capture`'s ``valid``).

This module reads models only through `repgeom.models.hf` (loading, capture) and
`repgeom.models.checkpoints.load_gpt`; it does not touch the probe pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "Subject",
    "AttentionInputs",
    "HFSubject",
    "CheckpointSubject",
    "load_subject",
]


class Subject:
    """Interface: ``name``, ``layer_names`` and ``states(text)``.

    `HFSubject` and `CheckpointSubject` read texts with the one reader,
    `repgeom.models.text_states.read_text_states`, through ``model`` (the loaded model) and
    ``max_tokens`` (tokens per window, None for the reader's default).
    """

    name: str
    layer_names: list[str]
    model: Any = None
    max_tokens: int | None = None

    def _read(self, text: str):
        from repgeom.models.text_states import read_text_states

        return read_text_states(self.model, text, window=self.max_tokens)

    def _one_window(self, text: str) -> torch.Tensor:
        """The (1, T) ids of `text`, which must fit one window (attention is per window)."""
        from repgeom.models.text_states import text_window_ids

        windows = text_window_ids(self.model, text, window=self.max_tokens)
        if len(windows) > 1:
            raise ValueError(
                f"{self.name}: {text[:40]!r}... is longer than one window "
                f"({windows[0].shape[1]} tokens); the queries and keys of one attention need one "
                "window: shorten the text or raise max_tokens"
            )
        return windows[0]

    def states(self, text: str) -> list[torch.Tensor]:
        """Per layer, the (T, C) float32 CPU states of the text's tokens (specials excluded);
        a text longer than one window is read window by window (`repgeom.models.text_states`)."""
        return self._read(text).states

    def tokens(self, text: str) -> list[str]:
        """The T tokens `states` returns a row for, as strings (for figure labels)."""
        return self._read(text).tokens

    def queries_keys(self, text: str) -> AttentionInputs:
        """Per block, the queries and keys the model multiplies on `text`, special tokens
        included (its softmax attends to them too)."""
        raise NotImplementedError


@dataclass(frozen=True)
class AttentionInputs:
    """What the attention of each block reads on one text.

    queries, keys : one (H, T, D) float tensor per block, as they enter
        ``softmax(Q K^T / sqrt(D) + mask)`` (`repgeom.models.capture.Capture`), on CPU.
    causal : whether query t attends only to keys j <= t.
    """

    queries: list[torch.Tensor]
    keys: list[torch.Tensor]
    causal: bool


class HFSubject(Subject):
    """A Hugging Face model, loaded with `repgeom.models.hf.load_hf_model`.

    Parameters
    ----------
    name_or_folder : str or path
    tokenizer : str, path or tokenizer, optional
        Override for folders without a tokenizer
        (`repgeom.models.hf.load_tokenizer_or_explain`).
    max_tokens : int, optional
        Tokens per window (special tokens included); None: the reader's default
        (`repgeom.models.text_states`). A longer text is read in several windows.
    """

    def __init__(self, name_or_folder, *, tokenizer=None, max_tokens: int | None = None) -> None:
        from repgeom.models.hf import load_hf_model

        self.model = load_hf_model(name_or_folder, tokenizer=tokenizer)
        self.name = str(name_or_folder)
        self.max_tokens = max_tokens
        self.layer_names = self._read("a b").layer_names

    @property
    def hf(self):
        return self.model

    @torch.no_grad()
    def queries_keys(self, text: str) -> AttentionInputs:
        from repgeom.models.hf import hf_capture

        if not self.hf.has_qk:
            raise ValueError(
                f"{self.name}: repgeom cannot read the queries and keys of model family "
                f"{self.hf.family!r} (repgeom.models.hf lists the families it hooks); use a model "
                "of a supported family"
            )
        ids = self._one_window(text)
        cap = hf_capture(self.hf, ids, torch.ones_like(ids), attention=False,
                         include_special=True)
        return AttentionInputs([q[0].float().cpu() for q in cap.queries],
                               [k[0].float().cpu() for k in cap.keys], cap.causal)


class CheckpointSubject(Subject):
    """One of our character-level checkpoints (`repgeom.models.checkpoints.load_gpt`), or a
    loaded `CharLM`.

    Text is UTF-8 encoded, every byte a token, read in windows of the model's ``block_size``
    bytes (or `max_tokens`, at most that).
    """

    def __init__(self, ckpt, *, max_tokens: int | None = None) -> None:
        from repgeom.models.checkpoints import load_gpt

        if hasattr(ckpt, "model") and hasattr(ckpt, "vocab"):  # a CharLM or a loaded checkpoint
            lm, self.name = ckpt, type(ckpt).__name__
        else:
            if not Path(ckpt).is_file():
                raise FileNotFoundError(f"ckpt={ckpt}: no such checkpoint file")
            lm = load_gpt(ckpt)
            self.name = str(ckpt)
        self.model = self.lm = lm
        self.lm.model.eval()
        block = self.lm.model.config.block_size
        self.max_tokens = None if max_tokens is None else min(int(max_tokens), block)
        cap = self.lm.model.capture(torch.zeros(1, 1, dtype=torch.long), attention=False)
        self.layer_names = cap.layer_names()

    @torch.no_grad()
    def queries_keys(self, text: str) -> AttentionInputs:
        cap = self.lm.model.capture(self._one_window(text), attention=False)
        return AttentionInputs([q[0].float().cpu() for q in cap.queries],
                               [k[0].float().cpu() for k in cap.keys], cap.causal)


def load_subject(*, hf=None, ckpt=None, tokenizer=None, max_tokens: int | None = None,
                 name: str | None = None) -> Subject:
    """`HFSubject` for ``hf=`` (hub name or folder), `CheckpointSubject` for ``ckpt=``;
    ``name`` replaces the label (default: what was passed)."""
    if (hf is None) == (ckpt is None):
        raise ValueError("give exactly one of hf=<name or folder> and ckpt=<checkpoint file>")
    if hf is not None:
        subject = HFSubject(hf, tokenizer=tokenizer, max_tokens=max_tokens)
    elif tokenizer is not None:
        raise ValueError("tokenizer= is for hf= models; a checkpoint carries its own vocabulary")
    else:
        subject = CheckpointSubject(ckpt, max_tokens=max_tokens)
    if name:
        subject.name = name
    return subject


def pool(states: torch.Tensor, how: str = "mean") -> torch.Tensor:
    """(T, C) -> (C,): the mean over tokens (the posts' pooling) or the last token's state."""
    if how == "mean":
        return states.mean(0)
    if how == "last":
        return states[-1]
    raise ValueError(f"pooling must be 'mean' or 'last', got {how!r}")
