"""Text for probe.py: the default validation text, a user's file, and our byte windows of it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from repgeom.data import enwik8


def default_text(source: str = "sample") -> str:
    """The enwik8 validation split as text (``"sample"``: the bundled file, works offline)."""
    data, _ = enwik8.load_raw(source)
    return enwik8.split(data)[1].decode("utf-8", errors="replace")


def read_text(path: str | os.PathLike) -> str:
    """A text file, UTF-8 (undecodable bytes replaced)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"text_file={str(path)!r}: no such file ({path.resolve()})")
    return path.read_bytes().decode("utf-8", errors="replace")


def byte_windows(vocab, text: str, *, window: int) -> torch.Tensor:
    """Our checkpoints' windows of `text`: its UTF-8 bytes in the checkpoint's vocabulary,
    cut into non-overlapping windows of `window` characters, shape (N, window)."""
    ids = vocab.encode(text.encode("utf-8"))
    n = len(ids) // window
    if n == 0:
        raise ValueError(
            f"the text is {len(ids)} bytes long; one window of the model's block_size={window} "
            "characters needs at least that many; use a longer text"
        )
    return torch.from_numpy(ids[: n * window].astype(np.int64).reshape(n, window))


