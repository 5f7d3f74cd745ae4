"""Byte-level vocabulary: the byte values seen in the train split, then the special symbols.

Ids ``0 .. n_bytes-1`` are the byte values in increasing order; the specials follow:
``[MASK]`` (``mask_id``, used by the masked-character objective) and ``[UNK]`` (``unk_id``,
what `encode` gives a byte that never occurs in the train split). Both are always present, so a
causal and a bidirectional model on the same data have identical embedding tables and parameter
counts. Full enwik8 has 205 distinct bytes in its train split, so 207 symbols.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

MASK = "[MASK]"
UNK = "[UNK]"
SPECIALS = (MASK, UNK)


class Vocab:
    """Map bytes to token ids and back.

    Parameters
    ----------
    byte_values : iterable of int
        The byte values (0..255) the vocabulary holds; stored sorted and deduplicated.

    Examples
    --------
    >>> v = Vocab.from_bytes(b"abca")
    >>> v.size, v.mask_id, v.unk_id
    (5, 3, 4)
    >>> v.encode(b"cab!").tolist()
    [2, 0, 1, 4]
    >>> v.decode(v.encode(b"cab"))
    b'cab'
    """

    specials = SPECIALS

    def __init__(self, byte_values: Iterable[int]) -> None:
        values = sorted({int(b) for b in byte_values})
        if any(not 0 <= b <= 255 for b in values):
            raise ValueError(f"byte_values must lie in 0..255, got {values}")
        self.byte_values: tuple[int, ...] = tuple(values)
        n = len(values)
        self.mask_id = n
        self.unk_id = n + 1
        self.size = n + len(SPECIALS)
        self.dtype = np.dtype(np.uint8 if self.size <= 256 else np.uint16)
        self._encode_lut = np.full(256, self.unk_id, dtype=self.dtype)
        self._encode_lut[list(values)] = np.arange(n, dtype=self.dtype)
        self._decode = [bytes([b]) for b in values] + [s.encode() for s in SPECIALS]

    @classmethod
    def from_bytes(cls, data: bytes | np.ndarray) -> Vocab:
        """The vocabulary of the byte values occurring in ``data`` (the train split)."""
        arr = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data
        return cls(np.flatnonzero(np.bincount(arr, minlength=256)).tolist())

    @property
    def special_ids(self) -> tuple[int, ...]:
        """Ids of ``[MASK]`` and ``[UNK]``: never picked as random MLM replacements."""
        return (self.mask_id, self.unk_id)

    def __len__(self) -> int:
        return self.size

    def encode(self, data: bytes) -> np.ndarray:
        """Token ids of ``data``, shape (len(data),), dtype `self.dtype` (uint8 up to 256 symbols).

        Bytes absent from the vocabulary map to ``unk_id``.
        """
        return self._encode_lut[np.frombuffer(data, dtype=np.uint8)]

    def decode(self, ids: Sequence[int] | np.ndarray) -> bytes:
        """Bytes of ``ids``; a special symbol decodes to its name (e.g. ``b"[MASK]"``)."""
        ids = np.asarray(ids).reshape(-1).tolist()
        try:
            return b"".join(self._decode[i] for i in ids)
        except IndexError:
            bad = [i for i in ids if not 0 <= i < self.size]
            raise ValueError(f"ids out of range 0..{self.size - 1}: {bad[:10]}") from None

    def to_dict(self) -> dict:
        """Plain data (saved in checkpoints); `from_dict` rebuilds the same vocabulary."""
        return {"byte_values": list(self.byte_values), "specials": list(SPECIALS)}

    @classmethod
    def from_dict(cls, d: dict) -> Vocab:
        if list(d.get("specials", [])) != list(SPECIALS):
            raise ValueError(
                f"vocab specials {d.get('specials')} differ from this version's {list(SPECIALS)}"
            )
        return cls(d["byte_values"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(self.byte_values)

    def __repr__(self) -> str:
        return f"Vocab(size={self.size}, n_bytes={len(self.byte_values)}, specials={SPECIALS})"
