"""enwik8 as a LightningDataModule: cached token ids, random training windows, fixed eval windows.

Every window holds ``block_size + 1`` token ids: a next-character model reads ``w[:-1]`` and
predicts ``w[1:]``; a masked-character model takes ``w[:block_size]``. The same windows serve
both objectives.

Data position and resumption
----------------------------
Training window ``k`` (the k-th sample of the whole run, counted over all ranks) starts at an
offset that is a pure function of ``(seed, k)`` (`RandomWindows`). At the start of each epoch
the sampler reads ``trainer.global_step`` and continues at
``k = global_step * batch_size * accumulate_grad_batches * world_size``, so a resumed run sees
exactly the windows an uninterrupted run would have seen. Under DDP rank ``r`` of ``W`` takes
``k = start + i * W + r`` (an interleaved, disjoint share); the sampler is a `DistributedSampler`
so Lightning does not inject its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from repgeom.data.enwik8 import DataError
from repgeom.data.tokens import (
    TokenCache,
    ValidationWindows,
    check_validation_length,
    choose_windows,
)
from repgeom.data.vocab import Vocab

_M64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finalizer (Steele et al. 2014): a bijective, well-mixed hash of 64-bit ints."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


class _MemmapPickle:
    """Reopen np.memmap token arrays by path in DataLoader workers instead of copying them."""

    tokens: np.ndarray

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        t = self.tokens
        if isinstance(t, np.memmap) and t.filename is not None:
            state["tokens"] = ("memmap", t.filename, t.offset, t.shape, t.dtype.str)
        return state

    def __setstate__(self, state: dict) -> None:
        t = state["tokens"]
        if isinstance(t, tuple) and t and t[0] == "memmap":
            _, filename, offset, shape, dtype = t
            state["tokens"] = np.memmap(filename, dtype=dtype, mode="r", offset=offset, shape=shape)
        self.__dict__.update(state)


class RandomWindows(_MemmapPickle, Dataset):
    """Windows of ``window`` tokens at pseudo-random offsets; item i is a pure function of
    ``(seed, start + i)``.

    The offset of item i is ``splitmix64(splitmix64(seed) ^ (start + i)) % (len(tokens) - window
    + 1)``: no state, so any item can be fetched in any order, by any worker, after a restart
    (the modulo bias is below 1e-10 for enwik8's length).

    Parameters
    ----------
    tokens : np.ndarray, shape (N,), integer dtype (often a read-only memmap)
    window : int
        Tokens per item (``block_size + 1``).
    seed : int
    start : int
        Index of item 0 in the seed's stream.
    length : int
        Number of items (``__len__``).

    Items are LongTensors of shape (window,).
    """

    def __init__(
        self, tokens: np.ndarray, window: int, *, seed: int, start: int = 0, length: int
    ) -> None:
        if window < 1 or window > len(tokens):
            raise ValueError(f"window={window} must lie in [1, len(tokens)={len(tokens)}]")
        if start < 0 or length < 0:
            raise ValueError(f"start={start} and length={length} must be >= 0")
        self.tokens = tokens
        self.window = window
        self.seed = seed
        self.start = start
        self.length = length
        self._n_offsets = len(tokens) - window + 1
        self._seed_hash = _mix64(seed & _M64)

    def __len__(self) -> int:
        return self.length

    def offset(self, i: int) -> int:
        """Start of item ``i`` in ``tokens``."""
        return _mix64(self._seed_hash ^ ((self.start + i) & _M64)) % self._n_offsets

    def __getitem__(self, i: int) -> torch.Tensor:
        if not 0 <= i < self.length:
            raise IndexError(f"index {i} out of range for {self.length} items")
        o = self.offset(i)
        return torch.from_numpy(self.tokens[o : o + self.window].astype(np.int64))


class ContiguousWindows(_MemmapPickle, Dataset):
    """Fixed windows of ``window`` tokens starting every ``window - 1`` tokens, in order.

    Consecutive windows share one token (the last target of one is the first input of the
    next), so every token after the first is predicted exactly once: the usual non-overlapping
    evaluation. ``max_windows`` keeps that many windows evenly spaced over the split.
    """

    def __init__(self, tokens: np.ndarray, window: int, *, max_windows: int | None = None) -> None:
        if window < 2 or window > len(tokens):
            raise ValueError(f"window={window} must lie in [2, len(tokens)={len(tokens)}]")
        self.tokens = tokens
        self.window = window
        stride = window - 1
        n = (len(tokens) - 1) // stride
        starts = np.arange(n, dtype=np.int64) * stride
        if max_windows is not None:
            if max_windows < 1:
                raise ValueError(f"max_windows must be >= 1 or None, got {max_windows}")
            if max_windows < n:
                starts = starts[np.linspace(0, n - 1, max_windows).round().astype(np.int64)]
        self.starts = starts

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> torch.Tensor:
        o = int(self.starts[i])
        return torch.from_numpy(self.tokens[o : o + self.window].astype(np.int64))


class _StreamSampler(DistributedSampler):
    """Yields ``start + i * world_size + rank`` for i < length, ``start`` read at each epoch.

    A DistributedSampler subclass only so that Lightning keeps it instead of injecting its own
    (see `_DataConnector._requires_distributed_sampler`); it calls no torch.distributed function.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        start_fn: Callable[[], int],
        length: int,
        world_size: int = 1,
        rank: int = 0,
    ) -> None:
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=False)
        self.start_fn = start_fn
        self.length = length

    def __iter__(self) -> Iterator[int]:
        start, w, r = self.start_fn(), self.num_replicas, self.rank
        return iter(range(start + r, start + r + self.length * w, w))

    def __len__(self) -> int:
        return self.length


class _ResumableLoader(DataLoader):
    """A DataLoader whose position needs no saved state: the sampler derives it from
    ``trainer.global_step``. Declaring state_dict/load_state_dict tells Lightning that a
    mid-epoch resume is exact (otherwise it warns that the loader is not resumable)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        pass


class Enwik8DataModule(L.LightningDataModule):
    """enwik8 (or the bundled sample) as token windows for next- or masked-character training.

    Parameters
    ----------
    source : {"enwik8", "sample"}
        The full file (downloaded or ``path``) or the bundled 4.15 MB sample.
    path : str, optional
        A local copy (zip, gzip or raw) instead of downloading / the bundled sample.
    cache_dir : str, optional
        Downloads and token caches; default ``$REPGEOM_DATA`` or ``<project>/data/cache``.
    clean : bool
        Strip markup (`repgeom.data.clean`) before tokenizing; off for the standard benchmark.
    verify : bool
        Refuse files whose sha256/size differ from the published ones (default). False only
        warns, for users who knowingly train on another file.
    block_size : int
        Model context; windows hold ``block_size + 1`` tokens.
    batch_size, num_workers : int
        Per-rank DataLoader settings (train, validation and test).
    seed : int
        Seeds the training windows (and nothing else here).
    val_windows : int, optional
        Use at most this many validation/test windows, evenly spaced; None uses all.
    pin_memory : bool
        Page-locked batches, so that the copy to a GPU runs asynchronously (`recipe.pin_memory`);
        None pins them when CUDA is available.
    """

    def __init__(
        self,
        source: str = "sample",
        path: str | None = None,
        cache_dir: str | None = None,
        clean: bool = False,
        verify: bool = True,
        block_size: int = 256,
        batch_size: int = 32,
        num_workers: int = 0,
        seed: int = 0,
        val_windows: int | None = None,
        pin_memory: bool | None = None,
    ) -> None:
        super().__init__()
        self.cache = TokenCache(source, path, cache_dir, clean, verify)
        for name, value in (("block_size", block_size), ("batch_size", batch_size)):
            if int(value) < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if val_windows is not None and val_windows < 1:
            raise ValueError(f"val_windows must be >= 1 or None, got {val_windows}")
        self.block_size = int(block_size)
        self.batch_size = int(batch_size)
        self.num_workers = int(num_workers)
        self.seed = int(seed)
        self.val_windows = val_windows
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else bool(pin_memory)
        self.vocab: Vocab | None = None
        self.tokens: dict[str, np.ndarray] = {}
        self._loaded_vocab: Vocab | None = None

    # ---- cache -----------------------------------------------------------------------------
    @property
    def source(self) -> str:
        return self.cache.source

    @property
    def clean(self) -> bool:
        return self.cache.clean

    def cache_path(self) -> Path:
        """The folder of this configuration's token cache (`TokenCache.cache_path`)."""
        return self.cache.cache_path()

    def prepare_data(self) -> None:
        """Fetch and check the raw data, then tokenize it into the cache, once
        (`TokenCache.prepare`: a bad ``path`` fails as on a first run whatever the cache holds)."""
        self.cache.prepare()

    def setup(self, stage: str | None = None) -> None:
        """Open the cached splits as read-only memmaps and set ``self.vocab``."""
        if self.tokens:
            return
        vocab, tokens = self.cache.open()
        self._check_vocab(vocab, self._loaded_vocab)
        check_validation_length(tokens["valid"], self.block_size)
        self.vocab, self.tokens = vocab, tokens

    # ---- loaders ---------------------------------------------------------------------------
    def _need_setup(self) -> None:
        if not self.tokens:
            raise RuntimeError("call prepare_data() and setup() first")

    def train_dataloader(self) -> DataLoader:
        self._need_setup()
        trainer = self.trainer
        world = trainer.world_size if trainer is not None else 1
        rank = trainer.global_rank if trainer is not None else 0
        accum = trainer.accumulate_grad_batches if trainer is not None else 1
        per_step = self.batch_size * accum  # samples per optimizer step on one rank

        def start_fn() -> int:
            step = trainer.global_step if trainer is not None else 0
            return step * per_step * world

        if trainer is not None and trainer.max_steps > 0:
            length = trainer.max_steps * per_step  # the whole run is one epoch
        else:  # one epoch ~ one pass over the train split's tokens
            n_windows = len(self.tokens["train"]) // self.block_size
            length = max(1, n_windows // (world * per_step)) * per_step
        dataset = RandomWindows(
            self.tokens["train"], self.block_size + 1, seed=self.seed, length=1 << 62
        )
        sampler = _StreamSampler(
            dataset, start_fn=start_fn, length=length, world_size=world, rank=rank
        )
        return _ResumableLoader(dataset, sampler=sampler, **self._loader_kwargs())

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("valid")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def _eval_loader(self, split: str) -> DataLoader:
        self._need_setup()
        dataset = ContiguousWindows(
            self.tokens[split], self.block_size + 1, max_windows=self.val_windows
        )
        return DataLoader(dataset, shuffle=False, **self._loader_kwargs())

    def _loader_kwargs(self) -> dict:
        return {
            "batch_size": self.batch_size,
            "num_workers": self.num_workers,
            "persistent_workers": self.num_workers > 0,
            "pin_memory": self.pin_memory,
        }

    def validation_windows(self) -> ValidationWindows:
        """The validation split as aligned probe windows
        (`repgeom.probes.core.sampling.probe_set`)."""
        self._need_setup()
        return ValidationWindows(self.tokens["valid"], self.block_size, self.vocab)

    def probe_windows(self, n_windows: int, *, seed: int) -> torch.Tensor:
        """``n_windows`` fixed windows of the validation split, shape (n_windows, block_size).

        Chosen from ``seed`` (and ``block_size``) only: distinct aligned slots
        ``[j * block_size, (j + 1) * block_size)`` drawn without replacement, in increasing
        order (`choose_windows`). Runs of either masking with the same seed probe the same text.
        """
        windows = self.validation_windows()
        n_slots = windows.n_probe_windows
        if not 1 <= n_windows <= n_slots:
            raise ValueError(
                f"n_windows must lie in [1, {n_slots}] (validation slots), got {n_windows}"
            )
        return windows.slot_windows(choose_windows(n_slots, n_windows, seed))

    # ---- checkpoint state ------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The vocabulary (and where the data came from), saved in every Lightning checkpoint."""
        return {
            "vocab": self.vocab.to_dict() if self.vocab is not None else None,
            "source": self.source,
            "clean": self.clean,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the vocabulary; refuse a checkpoint whose vocabulary differs from the data's."""
        d = state_dict.get("vocab")
        loaded = Vocab.from_dict(d) if d is not None else None
        self._check_vocab(self.vocab, loaded)
        self._loaded_vocab = loaded
        if self.vocab is None:
            self.vocab = loaded

    @staticmethod
    def _check_vocab(data_vocab: Vocab | None, ckpt_vocab: Vocab | None) -> None:
        if data_vocab is not None and ckpt_vocab is not None and data_vocab != ckpt_vocab:
            raise DataError(
                f"the checkpoint's vocabulary ({ckpt_vocab}) differs from the data's "
                f"({data_vocab}): it was trained on other data or another data.clean setting."
            )
