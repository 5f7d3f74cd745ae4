"""Text to windows of a Hugging Face tokenizer's ids, and which ids are special."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from repgeom.models.hf.loading import HFModel

DEFAULT_WINDOW = 256
"""Tokens per window of a Hugging Face model (at most its positions) unless a caller says:
the probe's windows (``window=``) and one text's (`repgeom.models.text_states`)."""


def default_window(hf: HFModel, default: int = DEFAULT_WINDOW) -> int:
    """`default`, or the model's positions (``max_position_embeddings``) where fewer."""
    positions = getattr(hf.model.config, "max_position_embeddings", None)
    return min(default, positions) if positions else default


def sliding_window(hf: HFModel) -> int | None:
    """The window W of `hf`'s sliding-window attention layers (a query sees keys t - j < W),
    or None when no layer slides.

    Layers slide where ``config.layer_types`` says ``"sliding_attention"`` (Gemma 2/3, OLMo-3,
    Qwen2 with ``use_sliding_window``, which transformers writes into its ``layer_types``), or,
    without ``layer_types``, on every layer when ``config.sliding_window`` is set (Mistral).
    """
    config = hf.model.config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return None
    types = getattr(config, "layer_types", None)
    return int(window) if types is None or "sliding_attention" in types else None


def sliding_window_warning(hf: HFModel, window: int) -> str | None:
    """Why attention metrics on windows of `window` tokens are wrong for `hf`, or None.

    On a sliding layer a query attends to its last W keys only, but attention entropy's
    normalisation, the min/median probability and qk_alignment's score statistics count every
    earlier key of the window: with `window` > W they count keys the model never sees.
    """
    slide = sliding_window(hf)
    if slide is None or window <= slide:
        return None
    return (
        f"window={window} is longer than {hf.name}'s sliding window (config.sliding_window="
        f"{slide}) on its sliding-attention layers: attention entropy, min/median probability and "
        f"qk_alignment's score statistics on those layers count keys outside the sliding window "
        f"and are wrong there; give window<={slide} for attention metrics"
    )


def tokenize_windows(
    hf: HFModel, text: str, *, window: int, n_windows: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut `text` into fixed, non-overlapping windows of `window` tokens.

    The text is tokenized once, without special tokens, and cut into chunks; each window then
    gets the special tokens the tokenizer adds to a single sequence (CLS ... SEP for BERT, BOS
    first for Llama, none for GPT-2), so every row is `window` tokens long in all.

    Parameters
    ----------
    hf : HFModel
    text : str
    window : int
        Tokens per row, special tokens included.
    n_windows : int, optional
        Number of windows, from the start of the text; None takes every full window.

    Returns
    -------
    input_ids : (N, window) int64 tensor
    attention_mask : (N, window) int64 tensor of ones (windows are never padded)

    Raises
    ------
    ValueError
        `window` too small for the special tokens or longer than the model's positions, or the
        text too short for one window (or for `n_windows`).
    """
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    if n_windows is not None and (not isinstance(n_windows, int) or n_windows < 1):
        raise ValueError(f"n_windows must be a positive integer or None, got {n_windows!r}")
    max_positions = getattr(hf.model.config, "max_position_embeddings", None)
    if max_positions is not None and window > max_positions:
        raise ValueError(f"window={window} is longer than {hf.name}'s {max_positions} positions")
    tok = hf.tokenizer
    prefix, suffix = _special_template(tok, text)
    n_special = len(prefix) + len(suffix)
    content = window - n_special
    if content < 1:
        raise ValueError(
            f"window={window} leaves no room for text after the {n_special} special tokens "
            f"{tok.convert_ids_to_tokens(prefix + suffix)} that {hf.name} adds"
        )
    ids = tok(text, add_special_tokens=False, verbose=False)["input_ids"]
    available = len(ids) // content
    if available == 0:
        raise ValueError(
            f"the text is {len(ids)} tokens long ({len(text)} characters); one window of "
            f"{window} tokens needs {content} text tokens"
            + (f" plus {n_special} special tokens" if n_special else "")
            + "; use a longer text or a smaller window"
        )
    if n_windows is not None and n_windows > available:
        raise ValueError(
            f"n_windows={n_windows} but the text ({len(ids)} tokens) holds only {available} "
            f"windows of {window} tokens"
        )
    n = available if n_windows is None else n_windows
    rows = [prefix + ids[i * content : (i + 1) * content] + suffix for i in range(n)]
    input_ids = torch.tensor(rows, dtype=torch.long)  # (N, window)
    return input_ids, torch.ones_like(input_ids)


def window_characters(hf: HFModel, text: str, *, window: int) -> torch.Tensor | None:
    """The characters of `text` each token of `tokenize_windows`' windows covers, counted as
    UTF-8 bytes (the character of enwik8's bits per character, and of our byte-level models:
    one token, one byte), (N, window) float64, 0 at the special tokens; None where the tokenizer
    gives no offset mapping (a slow, Python tokenizer).

    Read from the tokenizer's offset mapping: a token covers the text from its start up to the
    next token's start (the last one to its end), so the counts partition the text (a space
    that a byte-level token's offsets leave out goes to the token before it); tokens that share
    one span (the byte tokens of one multi-byte character) share its bytes equally, which is
    exact for byte tokens. Decoding each token alone instead is biased: a byte of a multi-byte
    character decodes to a replacement character, a word piece keeps its ``##``, a
    SentencePiece word loses its space.
    """
    tok = hf.tokenizer
    if not getattr(tok, "is_fast", False):
        return None
    encoded = tok(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    offsets = np.asarray(encoded["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    if len(offsets) == 0:
        return None
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    width = 1 + (points >= 0x80) + (points >= 0x800) + (points >= 0x10000)  # UTF-8 bytes
    before = np.concatenate([[0], np.cumsum(width)])  # bytes before each character
    starts = np.maximum.accumulate(offsets[:, 0])
    first = np.flatnonzero(np.r_[True, starts[1:] != starts[:-1]])  # one run per span
    count = np.diff(np.r_[first, len(starts)])
    span_end = np.r_[starts[first[1:]], max(int(offsets[-1, 1]), int(starts[-1]))]
    span_bytes = before[span_end] - before[starts[first]]
    per_token = torch.from_numpy(np.repeat(span_bytes / count, count))
    prefix, suffix = _special_template(tok, text)
    content = window - len(prefix) - len(suffix)
    n = len(per_token) // content
    body = per_token[: n * content].reshape(n, content)
    return torch.cat([torch.zeros(n, len(prefix), dtype=torch.float64), body,
                      torch.zeros(n, len(suffix), dtype=torch.float64)], dim=1)


def text_windows(hf: HFModel, text: str, *, window: int) -> list[list[int]]:
    """All of `text` as consecutive windows of at most `window` ids, special tokens included.

    A text that fits is one window, encoded as the tokenizer encodes it alone. A longer one is
    tokenized once without special tokens and cut into chunks of ``window - n_special`` tokens,
    each wrapped in the special tokens of a single sequence (as `tokenize_windows`); the last
    window is shorter. No token is dropped.
    """
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    tok = hf.tokenizer
    whole = tok(text)["input_ids"]
    if len(whole) <= window:
        return [whole]
    prefix, suffix = _special_template(tok, text)
    content = window - len(prefix) - len(suffix)
    if content < 1:
        raise ValueError(f"window={window} leaves no room for text after the special tokens "
                         f"{tok.convert_ids_to_tokens(prefix + suffix)} that {hf.name} adds")
    ids = tok(text, add_special_tokens=False, verbose=False)["input_ids"]
    return [prefix + ids[i : i + content] + suffix for i in range(0, len(ids), content)]


def _special_template(tok: Any, text: str) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after one sequence, found by encoding a sample.

    Works for every tokenizer backend (fast, sentencepiece, python), unlike
    ``build_inputs_with_special_tokens`` which fast tokenizers no longer have in transformers 5.
    """
    sample = text[:32] or "a"
    bare = tok(sample, add_special_tokens=False, verbose=False)["input_ids"]
    full = tok(sample, add_special_tokens=True, verbose=False)["input_ids"]
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return full[:start], full[start + len(bare) :]
    raise RuntimeError(
        "cannot tell which special tokens the tokenizer adds: the text encoded with special "
        f"tokens ({full}) does not contain it encoded without ({bare})"
    )


def special_token_ids(tokenizer: Any) -> list[int]:
    """Ids of BOS, EOS, CLS, SEP and PAD (not UNK or MASK, which stand for real text)."""
    ids = {
        getattr(tokenizer, f"{name}_token_id", None) for name in ("bos", "eos", "cls", "sep", "pad")
    }
    ids.discard(None)
    ids.discard(getattr(tokenizer, "unk_token_id", None))  # some models pad with UNK
    return sorted(ids)
