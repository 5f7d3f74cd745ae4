"""BERT's masked-symbol corruption (Devlin et al. 2019, section 3.1), for byte-level inputs."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

IGNORE_INDEX = -100  # torch.nn.functional.cross_entropy's default ignore_index


@lru_cache(maxsize=64)
def _constants(
    vocab_size: int, special_ids: tuple[int, ...], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The special ids and the ids a random replacement may take, on `device`, made once per
    (vocabulary, device): built on the CPU and copied over once, so that a training step on a
    GPU issues no pageable host-to-device copy and no `nonzero` (each a host sync)."""
    special = torch.tensor(special_ids, dtype=torch.long)
    keep = torch.ones(vocab_size, dtype=torch.bool)
    keep[special] = False
    allowed = keep.nonzero().squeeze(1)  # (n_allowed,) ids a random replacement may take
    if allowed.numel() == 0:
        raise ValueError("every symbol is special: nothing to draw random replacements from")
    return special.to(device), allowed.to(device)


def mlm_mask(
    ids: torch.Tensor,
    *,
    mask_id: int,
    vocab_size: int,
    special_ids: Sequence[int] = (),
    mask_prob: float = 0.15,
    replace_prob: float = 0.8,
    random_prob: float = 0.1,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Corrupt ``ids`` for the masked-symbol objective.

    Each position is chosen independently with probability ``mask_prob``; a chosen position
    becomes ``mask_id`` with probability ``replace_prob``, a uniformly random non-special symbol
    with probability ``random_prob``, and is kept otherwise. Positions holding a special symbol
    (e.g. ``[UNK]``) are never chosen.

    Parameters
    ----------
    ids : LongTensor, any shape, e.g. (B, T)
        Token ids in ``[0, vocab_size)``; any device.
    mask_id, vocab_size : int
    special_ids : sequence of int
        Ids never used as random replacements and never chosen (must include ``mask_id``'s
        symbol if it is to be excluded; `Vocab.special_ids` does).
    generator : torch.Generator, optional
        On ``ids.device``; None uses torch's global generator.

    Returns
    -------
    inputs : LongTensor, same shape as ``ids``
        The corrupted ids.
    labels : LongTensor, same shape
        The original id at chosen positions, -100 (``cross_entropy``'s ignore_index) elsewhere.

    Examples
    --------
    >>> ids = torch.randint(0, 10, (4, 64))
    >>> inputs, labels = mlm_mask(ids, mask_id=10, vocab_size=12, special_ids=(10, 11))
    >>> bool(((labels == -100) | (labels == ids)).all())
    True
    """
    if not 0.0 <= mask_prob <= 1.0:
        raise ValueError(f"mask_prob must lie in [0, 1], got {mask_prob}")
    if replace_prob < 0 or random_prob < 0 or replace_prob + random_prob > 1.0:
        raise ValueError(
            f"replace_prob={replace_prob} and random_prob={random_prob} must be >= 0 "
            "and sum to at most 1"
        )
    if not 0 <= mask_id < vocab_size:
        raise ValueError(f"mask_id={mask_id} must lie in [0, vocab_size={vocab_size})")
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"ids must be an integer tensor, got dtype {ids.dtype}")
    ids = ids.long()
    device = ids.device
    special, allowed = _constants(int(vocab_size), tuple(sorted(set(special_ids))), device)

    chosen = torch.rand(ids.shape, generator=generator, device=device) < mask_prob
    if special.numel():
        chosen &= ~torch.isin(ids, special)
    action = torch.rand(ids.shape, generator=generator, device=device)
    to_mask = chosen & (action < replace_prob)
    to_random = chosen & (action >= replace_prob) & (action < replace_prob + random_prob)
    random_ids = allowed[
        torch.randint(allowed.numel(), ids.shape, generator=generator, device=device)
    ]

    inputs = torch.where(to_mask, torch.full_like(ids, mask_id), ids)
    inputs = torch.where(to_random, random_ids, inputs)
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE_INDEX))
    return inputs, labels
