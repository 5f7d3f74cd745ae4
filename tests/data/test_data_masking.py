"""BERT-style masking: 15% chosen, of those 80% [MASK] / 10% random / 10% kept."""

from __future__ import annotations

import math

import pytest
import torch

from repgeom.data.masking import IGNORE_INDEX, mlm_mask

VOCAB = 202  # the sample's vocabulary size: 200 bytes + [MASK] + [UNK]
MASK_ID, UNK_ID = 200, 201
SPECIAL = (MASK_ID, UNK_ID)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _skip_without(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")


@pytest.mark.parametrize("device", DEVICES)
def test_mlm_statistics(device: str) -> None:
    _skip_without(device)
    g = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, MASK_ID, (256, 1024), generator=g, device=device)  # no specials
    inputs, labels = mlm_mask(ids, mask_id=MASK_ID, vocab_size=VOCAB, special_ids=SPECIAL,
                              generator=g)  # fmt: skip
    n = ids.numel()
    chosen = labels != IGNORE_INDEX
    k = int(chosen.sum())

    # Binomial standard errors: sqrt(p(1-p)/n). With n = 262,144 positions, the chosen fraction
    # has se = 0.0007; with k ~ 39,000 chosen, the 80/10/10 fractions have se = 0.0020/0.0015.
    # Every tolerance below is 5 se: a correct implementation fails with probability < 1e-6
    # (and the generator is seeded anyway), a wrong rate (e.g. 0.12 or 0.2) fails surely.
    def tol(p: float, m: int) -> float:
        return 5 * math.sqrt(p * (1 - p) / m)

    assert abs(k / n - 0.15) < tol(0.15, n)
    masked = chosen & (inputs == MASK_ID)
    changed = chosen & (inputs != MASK_ID) & (inputs != ids)
    kept = chosen & (inputs == ids)
    # A random replacement equals the original with probability 1/200 and then looks "kept".
    p_rand = 0.1 * (1 - 1 / MASK_ID)
    p_kept = 0.1 + 0.1 / MASK_ID
    assert abs(int(masked.sum()) / k - 0.8) < tol(0.8, k)
    assert abs(int(changed.sum()) / k - p_rand) < tol(p_rand, k)
    assert abs(int(kept.sum()) / k - p_kept) < tol(p_kept, k)
    # labels: the original id where chosen, -100 elsewhere; unchosen inputs untouched
    assert torch.equal(labels[chosen], ids[chosen])
    assert bool((labels[~chosen] == IGNORE_INDEX).all())
    assert torch.equal(inputs[~chosen], ids[~chosen])
    # random replacements are never special symbols, and cover the non-special range
    replaced = inputs[changed]
    assert not bool(torch.isin(replaced, torch.tensor(SPECIAL, device=device)).any())
    assert int(replaced.min()) >= 0 and int(replaced.max()) < MASK_ID
    assert inputs.device == ids.device and inputs.dtype == torch.long


def test_special_positions_are_never_chosen() -> None:
    g = torch.Generator().manual_seed(1)
    ids = torch.full((64, 512), UNK_ID)
    ids[:, ::2] = 5
    inputs, labels = mlm_mask(ids, mask_id=MASK_ID, vocab_size=VOCAB, special_ids=SPECIAL,
                              generator=g)  # fmt: skip
    assert bool((labels[:, 1::2] == IGNORE_INDEX).all())
    assert torch.equal(inputs[:, 1::2], ids[:, 1::2])
    assert bool((labels[:, ::2] != IGNORE_INDEX).any())


def test_same_generator_seed_same_corruption() -> None:
    ids = torch.randint(0, MASK_ID, (8, 256), generator=torch.Generator().manual_seed(0))

    def run(seed: int):
        g = torch.Generator().manual_seed(seed)
        return mlm_mask(ids, mask_id=MASK_ID, vocab_size=VOCAB, special_ids=SPECIAL, generator=g)

    a, b, c = run(3), run(3), run(4)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mask_prob": 1.5}, "mask_prob"),
        ({"replace_prob": 0.95, "random_prob": 0.1}, "sum to at most 1"),
        ({"mask_id": VOCAB}, "mask_id"),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    args = {"mask_id": MASK_ID, "vocab_size": VOCAB, **kwargs}
    with pytest.raises(ValueError, match=match):
        mlm_mask(torch.zeros(2, 3, dtype=torch.long), **args)
