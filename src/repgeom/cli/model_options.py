"""``hf=``, ``ckpt=``, ``tokenizer=``, ``max_tokens=``, ``name=``: which model an analysis reads
(the options every analysis of `repgeom.analyses` shares)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

__all__ = ["ModelOptions", "TextTableOptions", "subject_of"]


@dataclass
class ModelOptions:
    hf: str | None = None
    """Hugging Face hub name or folder (save_pretrained)."""
    ckpt: str | None = None
    """A repgeom checkpoint (.ckpt)."""
    tokenizer: str | None = None
    """Tokenizer name or folder, for hf folders without one."""
    max_tokens: int | None = None
    """Cut each text to this many tokens."""
    name: str | None = None
    """Model label in tables and figures (default: hf/ckpt)."""


@dataclass
class TextTableOptions(ModelOptions):
    """The model, and a CSV of texts it reads with the folder its results go to (``csv=``,
    ``text=``, ``out=``)."""

    csv: str = MISSING
    """A CSV of texts (the ``text`` column) and their label columns."""
    text: str = "text"
    """The column that holds the texts."""
    out: str = MISSING
    """Output folder."""


def subject_of(cfg: Any):
    """The `repgeom.analyses.subjects.Subject` that `cfg`'s model options name."""
    from repgeom.analyses.subjects import load_subject

    return load_subject(hf=cfg.hf, ckpt=cfg.ckpt, tokenizer=cfg.tokenizer,
                        max_tokens=cfg.max_tokens, name=cfg.name)
