"""Models as analysis subjects: one interface for Hugging Face models and our checkpoints.

An analysis needs, for one text, the states of every layer at the text's own tokens. Both
kinds of model give them in the probe's layer convention (`repgeom.models.capture.Capture`):
layer 0 is the embedding output, layer i the residual stream after block i (before any final
norm), and, for models that have one, a last layer ``final_norm``. Layer names follow
`repgeom.probes.table`: ``embedding``, ``block_<i>``, ``final_norm``.

Special tokens (CLS, SEP, BOS, ...) are left out, as in the probes (`hf_capture`'s ``valid``).

This module reads models only through `repgeom.models.hf` (loading, capture) and
`repgeom.models.checkpoints.load_gpt`; it does not touch the probe pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "Subject",
    "AttentionInputs",
    "HFSubject",
    "CheckpointSubject",
    "load_subject",
]


class Subject:
    """Interface: ``name``, ``layer_names`` and ``states(text)``."""

    name: str
    layer_names: list[str]

    def states(self, text: str) -> list[torch.Tensor]:
        """Per layer, the (T, C) float32 CPU states of the text's tokens (specials excluded)."""
        raise NotImplementedError

    def tokens(self, text: str) -> list[str]:
        """The T tokens `states` returns a row for, as strings (for figure labels)."""
        raise NotImplementedError

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
    max_tokens : int
        Texts are cut to this many tokens (special tokens included).
    """

    def __init__(self, name_or_folder, *, tokenizer=None, max_tokens: int = 512) -> None:
        from repgeom.models.hf import load_hf_model

        self.hf = load_hf_model(name_or_folder, tokenizer=tokenizer)
        self.name = str(name_or_folder)
        self.max_tokens = int(max_tokens)
        cap = self._capture("a b")
        self.layer_names = cap.layer_names()

    def _encode(self, text: str) -> dict:
        limit = min(self.max_tokens, getattr(self.hf.model.config, "max_position_embeddings",
                                             self.max_tokens))
        return self.hf.tokenizer(text, return_tensors="pt", truncation=True, max_length=limit)

    @torch.no_grad()
    def _capture(self, text: str):
        from repgeom.models.hf import hf_capture

        enc = self._encode(text)
        if enc["input_ids"].shape[1] == 0:
            raise ValueError(f"{self.name}: the tokenizer gives no token for {text[:40]!r}")
        return hf_capture(self.hf, enc["input_ids"], enc["attention_mask"], attention=False)

    def states(self, text: str) -> list[torch.Tensor]:
        out = self._capture(text).text_states()
        if out[0].shape[0] == 0:
            raise ValueError(f"{self.name}: {text[:40]!r} has no token besides special tokens")
        return out

    @torch.no_grad()
    def queries_keys(self, text: str) -> AttentionInputs:
        from repgeom.models.hf import hf_capture

        if not self.hf.has_qk:
            raise ValueError(
                f"{self.name}: repgeom cannot read the queries and keys of model family "
                f"{self.hf.family!r} (repgeom.models.hf lists the families it hooks); use a model "
                "of a supported family"
            )
        enc = self._encode(text)
        if enc["input_ids"].shape[1] == 0:
            raise ValueError(f"{self.name}: the tokenizer gives no token for {text[:40]!r}")
        cap = hf_capture(self.hf, enc["input_ids"], enc["attention_mask"], attention=False,
                         include_special=True)
        return AttentionInputs([q[0].float().cpu() for q in cap.queries],
                               [k[0].float().cpu() for k in cap.keys], cap.causal)

    def tokens(self, text: str) -> list[str]:
        ids = self._encode(text)["input_ids"][0].tolist()
        from repgeom.models.hf import special_token_ids

        special = set(special_token_ids(self.hf.tokenizer))
        return self.hf.tokenizer.convert_ids_to_tokens([i for i in ids if i not in special])


class CheckpointSubject(Subject):
    """One of our character-level checkpoints (`repgeom.models.checkpoints.load_gpt`), or a
    loaded `CharLM`.

    Text is UTF-8 encoded and cut into the model's ``block_size`` bytes; every byte is a token.
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
        self.lm = lm
        self.lm.model.eval()
        block = self.lm.model.config.block_size
        self.max_tokens = block if max_tokens is None else min(int(max_tokens), block)
        cap = self.lm.model.capture(torch.zeros(1, 1, dtype=torch.long), attention=False)
        self.layer_names = cap.layer_names()

    def _ids(self, text: str) -> torch.Tensor:
        ids = np.asarray(self.lm.vocab.encode(text.encode("utf-8")), dtype=np.int64)
        if ids.size == 0:
            raise ValueError("the text is empty")
        return torch.from_numpy(ids[: self.max_tokens])[None]

    @torch.no_grad()
    def states(self, text: str) -> list[torch.Tensor]:
        return self.lm.model.capture(self._ids(text), attention=False).text_states()

    @torch.no_grad()
    def queries_keys(self, text: str) -> AttentionInputs:
        cap = self.lm.model.capture(self._ids(text), attention=False)
        return AttentionInputs([q[0].float().cpu() for q in cap.queries],
                               [k[0].float().cpu() for k in cap.keys], cap.causal)

    def tokens(self, text: str) -> list[str]:
        ids = self._ids(text)[0].tolist()
        return [self.lm.vocab.decode([i]).decode("utf-8", "replace") for i in ids]


def load_subject(*, hf=None, ckpt=None, tokenizer=None, max_tokens: int | None = None,
                 name: str | None = None) -> Subject:
    """`HFSubject` for ``hf=`` (hub name or folder), `CheckpointSubject` for ``ckpt=``;
    ``name`` replaces the label (default: what was passed)."""
    if (hf is None) == (ckpt is None):
        raise ValueError("give exactly one of hf=<name or folder> and ckpt=<checkpoint file>")
    if hf is not None:
        subject = HFSubject(hf, tokenizer=tokenizer,
                            max_tokens=512 if max_tokens is None else max_tokens)
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
