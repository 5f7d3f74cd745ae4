"""`mlm_mask` without a host sync per call (issue 41): its constants (the special ids and the ids
a random replacement may take) are made once per vocabulary and device, and the masks are the
ones the implementation before the change drew, bit for bit."""

from __future__ import annotations

import pytest
import torch

from repgeom.data.masking import IGNORE_INDEX, _constants, mlm_mask


def _mlm_mask_before(ids, *, mask_id, vocab_size, special_ids=(), mask_prob=0.15,
                     replace_prob=0.8, random_prob=0.1, generator=None):
    """`mlm_mask` as it was before issue 41 (its constants built on `ids.device` every call)."""
    ids = ids.long()
    device = ids.device
    special = torch.tensor(sorted(set(special_ids)), dtype=torch.long, device=device)
    keep = torch.ones(vocab_size, dtype=torch.bool, device=device)
    keep[special] = False
    allowed = keep.nonzero().squeeze(1)
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


@pytest.mark.parametrize(("vocab", "special", "probs"), [
    (202, (200, 201), (0.15, 0.8, 0.1)),   # the sample's vocabulary: [MASK], [UNK]
    (207, (205, 206, 3), (0.3, 0.5, 0.3)),  # enwik8's, one special inside the range
    (50, (), (0.5, 0.0, 1.0)),             # no special, every chosen position random
])
def test_the_masks_are_those_of_the_implementation_before(vocab, special, probs) -> None:
    mask_prob, replace_prob, random_prob = probs
    ids = torch.randint(0, vocab, (8, 257), generator=torch.Generator().manual_seed(1))
    for seed in range(3):
        kwargs = dict(mask_id=vocab - 2 if special else 0, vocab_size=vocab,
                      special_ids=special, mask_prob=mask_prob, replace_prob=replace_prob,
                      random_prob=random_prob)
        want = _mlm_mask_before(ids, generator=torch.Generator().manual_seed(seed), **kwargs)
        got = mlm_mask(ids, generator=torch.Generator().manual_seed(seed), **kwargs)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)


def test_a_call_after_the_first_makes_no_constant_and_calls_no_nonzero(monkeypatch) -> None:
    # On CUDA each of these is a host sync: torch.tensor(list, device=cuda) a pageable copy,
    # nonzero() a read of the count. After the first call for a vocabulary and device, none.
    ids = torch.randint(0, 100, (4, 64), generator=torch.Generator().manual_seed(0))
    args = dict(mask_id=98, vocab_size=100, special_ids=(98, 99))
    first = mlm_mask(ids, generator=torch.Generator().manual_seed(0), **args)

    def refuse(*a, **k):
        raise AssertionError("a host sync on a GPU: made per call")

    monkeypatch.setattr(torch, "tensor", refuse)
    monkeypatch.setattr(torch.Tensor, "nonzero", refuse)
    monkeypatch.setattr(torch, "nonzero", refuse)
    again = mlm_mask(ids, generator=torch.Generator().manual_seed(0), **args)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


def test_the_constants_are_made_once_per_vocabulary_and_device() -> None:
    a = _constants(100, (98, 99), torch.device("cpu"))
    assert _constants(100, (98, 99), torch.device("cpu")) is a
    assert _constants(101, (98, 99), torch.device("cpu")) is not a
    special, allowed = a
    assert special.tolist() == [98, 99] and allowed.tolist() == list(range(98))
    with pytest.raises(ValueError, match="every symbol is special"):
        mlm_mask(torch.zeros(2, 3, dtype=torch.long), mask_id=0, vocab_size=2,
                 special_ids=(0, 1))


def test_on_cuda_the_mask_makes_no_host_sync() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: the CPU tests above check the same by construction")
    ids = torch.randint(0, 200, (16, 512), device="cuda")
    args = dict(mask_id=200, vocab_size=202, special_ids=(200, 201))
    mlm_mask(ids, generator=torch.Generator("cuda").manual_seed(0), **args)  # the constants
    generator = torch.Generator("cuda").manual_seed(1)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        mlm_mask(ids, generator=generator, **args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
