"""enwik8's token cache and its validation windows, without Lightning.

`TokenCache` fetches and checks the raw data (`repgeom.data.enwik8`), tokenizes it once into
``<cache_dir>/tokens/<key>/{train,valid,test}.npy`` and opens the splits as memmaps. The
Lightning `Enwik8DataModule` serves training windows from it; the probes read the validation
split's aligned windows through `ValidationWindows` (`repgeom.probes.core.sampling.probe_set`), so
probing a checkpoint does not load Lightning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from repgeom.data import enwik8
from repgeom.data.clean import strip_markup
from repgeom.data.enwik8 import DataError
from repgeom.data.vocab import SPECIALS, Vocab

log = logging.getLogger(__name__)

CACHE_FORMAT = 1  # bump when the cache layout or the tokenization changes
SPLITS = ("train", "valid", "test")
PROBE_SEED_SALT = 0x70726F6265  # b"probe": the probe's draw differs from any other use of seed


def choose_windows(n_available: int, n_wanted: int, seed: int) -> np.ndarray:
    """Sorted indices of ``min(n_wanted, n_available)`` of `n_available` windows, from `seed`.

    The probe set's draw (`Enwik8DataModule.probe_windows`, and probe.py on any text): spread
    over the whole text rather than its first article; every window when fewer are available.
    """
    rng = np.random.default_rng([seed, PROBE_SEED_SALT])
    return np.sort(rng.choice(n_available, size=min(n_wanted, n_available), replace=False))
def build_token_cache(data: bytes, *, clean: bool, dest: Path, meta: dict) -> Vocab:
    """Split, optionally clean, tokenize and write ``dest/{train,valid,test}.npy`` + meta.json.

    Written into a temporary folder next to ``dest`` and moved into place at the end, so an
    interrupted build leaves no cache that looks complete.
    """
    parts = enwik8.split(data)
    if clean:
        parts = tuple(strip_markup(p) for p in parts)
    vocab = Vocab.from_bytes(parts[0])
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        splits = {}
        for name, part in zip(SPLITS, parts, strict=True):
            f = tmp / f"{name}.npy"
            np.save(f, vocab.encode(part))
            splits[name] = {
                "file": f.name,
                "tokens": len(part),
                "bytes": f.stat().st_size,
                "sha256": enwik8.sha256_file(f),
            }
        meta = {**meta, "vocab": vocab.to_dict(), "splits": splits}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("token cache written to %s (vocab size %d)", dest, vocab.size)
    return vocab


def check_token_cache(dest: Path, *, full: bool = True) -> str | None:
    """None if the cache in ``dest`` is complete, else what is wrong with it.

    ``full`` also checks every file's sha256 (about 0.1 s per 100 MB); otherwise only sizes.
    """
    meta_file = dest / "meta.json"
    if not meta_file.is_file():
        return f"{meta_file} is missing"
    try:
        meta = json.loads(meta_file.read_text())
        splits = meta["splits"]
        for name in SPLITS:
            s = splits[name]
            f = dest / s["file"]
            if not f.is_file():
                return f"{f} is missing"
            if f.stat().st_size != s["bytes"]:
                return f"{f} has {f.stat().st_size:,} bytes, expected {s['bytes']:,} (truncated?)"
            if full and enwik8.sha256_file(f) != s["sha256"]:
                return f"{f} has the wrong sha256 (corrupt)"
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        return f"{meta_file} is unreadable ({type(e).__name__}: {e})"
    return None


class TokenCache:
    """The token cache of one data configuration (`Enwik8DataModule`'s first five parameters).

    ``prepare()`` builds or repairs it (reading the raw data only when needed); ``open()`` maps
    its splits and returns them with the vocabulary.
    """

    def __init__(self, source: str = "sample", path: str | None = None,
                 cache_dir: str | os.PathLike | None = None, clean: bool = False,
                 verify: bool = True) -> None:
        if source not in enwik8.SOURCES:
            raise ValueError(f"source must be one of {enwik8.SOURCES}, got {source!r}")
        if path is not None:
            enwik8.check_path(path)
        self.source = source
        self.path = path
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else enwik8.default_cache_dir()
        self.clean = bool(clean)
        self.verify = bool(verify)
        self._raw_sha256: str | None = None  # set by prepare when verify=False

    def _cache_key(self, raw_sha256: str) -> str:
        key = {
            "format": CACHE_FORMAT,
            "source": self.source,
            "raw_sha256": raw_sha256,
            "clean": self.clean,
            "specials": list(SPECIALS),
        }
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        return f"{self.source}-{'clean' if self.clean else 'raw'}-{digest}"

    def _load_raw(self) -> tuple[bytes, str]:
        return enwik8.load_raw(
            self.source, path=self.path, cache_dir=self.cache_dir, verify=self.verify
        )

    def _expected_sha256(self) -> str | None:
        return enwik8.SPECS[self.source].sha256 if self.verify else self._raw_sha256

    def _path_is_published(self) -> bool:
        """True without ``path``, or when it is a published file of the source (size, sha256)."""
        return self.path is None or enwik8.is_published_file(self.path, self.source)

    def cache_path(self) -> Path:
        """The folder of this configuration's token cache (raw data read only if verify=False)."""
        sha = self._expected_sha256()
        if sha is None:
            _, sha = self._load_raw()
            self._raw_sha256 = sha
        return self.cache_dir / "tokens" / self._cache_key(sha)

    def prepare(self) -> None:
        """Fetch and check the raw data, then tokenize it into the cache, once.

        A cache that is already complete (sizes and sha256 of every file) is left alone and the
        raw data is not even read, unless ``path`` is given and is not byte for byte a published
        file (`enwik8.is_published_file`): then it is read and checked first, so a bad file fails
        as on a first run whatever the cache holds. An incomplete or corrupt cache is rebuilt.
        """
        sha = self._expected_sha256()
        if sha is not None and self._path_is_published():
            dest = self.cache_dir / "tokens" / self._cache_key(sha)
            problem = check_token_cache(dest)
            if problem is None:
                return
            if dest.exists():
                log.warning("token cache %s is incomplete (%s); rebuilding it", dest, problem)
        data, sha = self._load_raw()
        self._raw_sha256 = sha
        dest = self.cache_dir / "tokens" / self._cache_key(sha)
        if check_token_cache(dest) is None:
            return
        meta = {"format": CACHE_FORMAT, "source": self.source, "raw_sha256": sha,
                "clean": self.clean}  # fmt: skip
        build_token_cache(data, clean=self.clean, dest=dest, meta=meta)

    def open(self) -> tuple[Vocab, dict[str, np.ndarray]]:
        """The vocabulary and the cached splits as read-only memmaps (after `prepare`)."""
        dest = self.cache_path()
        problem = check_token_cache(dest, full=False)
        if problem is not None:
            raise DataError(
                f"token cache {dest} is not usable: {problem}. Call prepare_data() first (the "
                "Trainer does), which builds or repairs it."
            )
        meta = json.loads((dest / "meta.json").read_text())
        tokens = {}
        for name in SPLITS:
            f = dest / meta["splits"][name]["file"]
            try:
                tokens[name] = np.load(f, mmap_mode="r")
            except ValueError as e:
                raise DataError(f"token cache file {f} is corrupt ({e}); delete {dest}.") from e
        return Vocab.from_dict(meta["vocab"]), tokens


def check_validation_length(valid: np.ndarray, block_size: int) -> None:
    """Refuse a validation split shorter than one window of ``block_size + 1`` tokens."""
    if len(valid) < block_size + 1:
        raise DataError(
            f"the validation split has {len(valid):,} tokens, fewer than one "
            f"window of block_size + 1 = {block_size + 1}"
        )


@dataclass(frozen=True)
class ValidationWindows:
    """The validation split cut into aligned probe windows ``[j * block_size, (j + 1) *
    block_size)``: what a probe set is drawn from (`repgeom.probes.core.sampling.probe_set`)."""

    tokens: np.ndarray
    block_size: int
    vocab: Vocab

    @classmethod
    def of_cache(cls, cache: TokenCache, block_size: int) -> ValidationWindows:
        """Prepare and open `cache`; its validation split in windows of `block_size`."""
        cache.prepare()
        vocab, tokens = cache.open()
        check_validation_length(tokens["valid"], block_size)
        return cls(tokens["valid"], int(block_size), vocab)

    @property
    def n_probe_windows(self) -> int:
        """How many distinct probe windows the split holds."""
        return len(self.tokens) // self.block_size

    def slot_windows(self, slots: np.ndarray) -> torch.Tensor:
        """The windows at aligned `slots`, shape (len(slots), block_size), int64."""
        idx = np.asarray(slots)[:, None] * self.block_size + np.arange(self.block_size)[None, :]
        return torch.from_numpy(self.tokens[idx].astype(np.int64))
