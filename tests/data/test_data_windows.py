"""Training windows (random, stateless, resumable, sharded) and evaluation windows."""

from __future__ import annotations

import pickle
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from repgeom.data.datamodule import ContiguousWindows, RandomWindows, _StreamSampler

TOKENS = np.arange(10_000, dtype=np.int64) % 251  # distinct windows at distinct offsets


def _items(ds) -> list[torch.Tensor]:
    return [ds[i] for i in range(len(ds))]


def test_same_seed_same_windows_other_seed_other_windows() -> None:
    a = _items(RandomWindows(TOKENS, 33, seed=0, length=50))
    b = _items(RandomWindows(TOKENS, 33, seed=0, length=50))
    c = _items(RandomWindows(TOKENS, 33, seed=1, length=50))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert sum(torch.equal(x, y) for x, y in zip(a, c, strict=True)) <= 1


def test_items_are_windows_of_the_tokens() -> None:
    ds = RandomWindows(TOKENS, 33, seed=5, length=200)
    offsets = [ds.offset(i) for i in range(200)]
    assert min(offsets) >= 0 and max(offsets) <= len(TOKENS) - 33
    assert len(set(offsets)) > 190  # spread over ~10k offsets, few collisions
    for i in (0, 17, 199):
        assert ds[i].dtype == torch.long and ds[i].shape == (33,)
        assert np.array_equal(ds[i].numpy(), TOKENS[offsets[i] : offsets[i] + 33])


@pytest.mark.parametrize("k", [1, 7, 40])
def test_start_offset_continues_the_stream(k: int) -> None:
    full = _items(RandomWindows(TOKENS, 33, seed=3, start=0, length=50))
    tail = _items(RandomWindows(TOKENS, 33, seed=3, start=k, length=50 - k))
    assert all(torch.equal(x, y) for x, y in zip(full[k:], tail, strict=True))


def test_ddp_shares_are_disjoint_and_cover_the_stream() -> None:
    ds = RandomWindows(TOKENS, 33, seed=0, length=1 << 62)
    world, length, start = 4, 25, 1000
    shares = [
        list(_StreamSampler(ds, start_fn=lambda: start, length=length, world_size=world, rank=r))
        for r in range(world)
    ]
    assert all(len(s) == length for s in shares)
    assert set().union(*map(set, shares)) == set(range(start, start + world * length))
    assert sum(map(len, shares)) == world * length  # hence pairwise disjoint
    assert shares[2][:3] == [start + 2, start + 6, start + 10]  # start + i * world + rank


def test_batch_of_32_is_fast() -> None:
    tokens = np.zeros(5_000_000, dtype=np.uint8)
    ds = RandomWindows(tokens, 257, seed=0, length=1 << 30)
    loader = torch.utils.data.DataLoader(ds, batch_size=32)
    it = iter(loader)
    next(it)
    t = time.perf_counter()
    for _ in range(50):
        next(it)
    per_batch = (time.perf_counter() - t) / 50
    # ~0.3 ms on one idle core; 5 ms leaves room for a loaded shared CI machine.
    assert per_batch < 5e-3, f"{per_batch * 1e3:.2f} ms per batch of 32"


def test_memmap_is_reopened_not_copied_when_pickled(tmp_path) -> None:
    np.save(tmp_path / "t.npy", np.zeros(1_000_000, dtype=np.uint8))
    tokens = np.load(tmp_path / "t.npy", mmap_mode="r")
    ds = RandomWindows(tokens, 65, seed=0, length=10)
    blob = pickle.dumps(ds)
    assert len(blob) < 10_000  # a path, not a megabyte of tokens (DataLoader workers)
    ds2 = pickle.loads(blob)
    assert isinstance(ds2.tokens, np.memmap) and torch.equal(ds2[3], ds[3])


def test_contiguous_windows_predict_every_token_once() -> None:
    tokens = np.arange(1000, dtype=np.int64)
    ds = ContiguousWindows(tokens, 33)
    assert len(ds) == (1000 - 1) // 32
    targets = torch.cat([ds[i][1:] for i in range(len(ds))])
    assert torch.equal(targets, torch.arange(1, 1 + 32 * len(ds)))  # no gap, no overlap
    capped = ContiguousWindows(tokens, 33, max_windows=4)
    assert len(capped) == 4 and capped.starts[0] == 0 and capped.starts[-1] == ds.starts[-1]


def _fake_trainer(**kw) -> SimpleNamespace:
    base = dict(global_step=0, accumulate_grad_batches=1, world_size=1, global_rank=0, max_steps=-1)
    return SimpleNamespace(**{**base, **kw})


def test_train_loader_resumes_at_the_data_position(make_dm) -> None:
    dm = make_dm(batch_size=4)
    dm.trainer = _fake_trainer(accumulate_grad_batches=2, max_steps=10)
    first = list(dm.train_dataloader())
    assert len(first) == 10 * 2  # max_steps * accumulate_grad_batches batches, one epoch
    dm.trainer = _fake_trainer(accumulate_grad_batches=2, max_steps=10, global_step=3)
    resumed = iter(dm.train_dataloader())
    for expected in first[3 * 2 : 3 * 2 + 5]:
        assert torch.equal(next(resumed), expected)


def test_train_loader_ddp_ranks_interleave_the_single_stream(make_dm) -> None:
    dm = make_dm(batch_size=4)
    dm.trainer = _fake_trainer(max_steps=6)
    single = torch.cat(list(dm.train_dataloader()))[:24]  # (24, block_size + 1)
    ranks = []
    for r in range(2):
        dm.trainer = _fake_trainer(max_steps=6, world_size=2, global_rank=r)
        loader = dm.train_dataloader()
        assert isinstance(loader.sampler, torch.utils.data.DistributedSampler)  # Lightning keeps it
        ranks.append(torch.cat(list(loader))[:12])
    assert torch.equal(ranks[0], single[0::2]) and torch.equal(ranks[1], single[1::2])


def test_train_loader_without_trainer_is_one_pass(make_dm) -> None:
    dm = make_dm(batch_size=8, block_size=32)
    loader = dm.train_dataloader()
    assert len(loader.sampler) == len(dm.tokens["train"]) // 32 // 8 * 8
    batch = next(iter(loader))
    assert batch.shape == (8, 33) and batch.dtype == torch.long
