"""Enwik8DataModule: the token cache, probe windows, checkpoint state, and a real Trainer."""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch

from repgeom.data import enwik8
from repgeom.data import tokens as dm_module
from repgeom.data.datamodule import Enwik8DataModule
from repgeom.data.enwik8 import DataError
from repgeom.data.vocab import Vocab


@pytest.fixture
def build_calls(monkeypatch) -> list[Path]:
    """Count the tokenizations (calls of build_token_cache)."""
    calls: list[Path] = []
    real = dm_module.build_token_cache

    def spy(data, *, clean, dest, meta):
        calls.append(dest)
        return real(data, clean=clean, dest=dest, meta=meta)

    monkeypatch.setattr(dm_module, "build_token_cache", spy)
    return calls


def test_sample_splits_and_vocab(make_dm) -> None:
    dm = make_dm()
    sizes = enwik8.split_sizes(enwik8.SAMPLE_SIZE)
    assert tuple(len(dm.tokens[s]) for s in ("train", "valid", "test")) == sizes
    raw, _ = enwik8.load_raw("sample")
    train = enwik8.split(raw)[0]
    assert dm.vocab == Vocab.from_bytes(train)
    assert dm.vocab.decode(np.asarray(dm.tokens["train"][:5000])) == train[:5000]
    assert dm.tokens["train"].dtype == np.uint8 and not dm.tokens["train"].flags.writeable


def test_second_prepare_data_does_not_retokenize(tmp_path: Path, build_calls) -> None:
    Enwik8DataModule(source="sample", cache_dir=str(tmp_path)).prepare_data()
    assert len(build_calls) == 1
    files = sorted((tmp_path / "tokens").rglob("*"))
    mtimes = [f.stat().st_mtime_ns for f in files]
    Enwik8DataModule(source="sample", cache_dir=str(tmp_path), batch_size=3).prepare_data()
    assert len(build_calls) == 1
    assert [f.stat().st_mtime_ns for f in sorted((tmp_path / "tokens").rglob("*"))] == mtimes
    assert [p.name for p in (tmp_path / "tokens").iterdir()] == [build_calls[0].name]  # no temp


def test_clean_gets_its_own_cache(tmp_path: Path, build_calls) -> None:
    raw = Enwik8DataModule(source="sample", cache_dir=str(tmp_path))
    clean = Enwik8DataModule(source="sample", cache_dir=str(tmp_path), clean=True)
    for dm in (raw, clean):
        dm.prepare_data()
        dm.setup()
    assert len(build_calls) == 2 and raw.cache_path() != clean.cache_path()
    assert len(clean.tokens["train"]) < 0.9 * len(raw.tokens["train"])
    assert clean.vocab.size <= raw.vocab.size


@pytest.mark.parametrize("damage", ["flip", "truncate", "meta"])
def test_damaged_cache_is_refused_then_rebuilt(tmp_path: Path, build_calls, damage: str) -> None:
    dm = Enwik8DataModule(source="sample", cache_dir=str(tmp_path))
    dm.prepare_data()
    dest = dm.cache_path()
    f = dest / "train.npy"
    if damage == "flip":  # same size, one byte changed: only the sha256 notices
        b = bytearray(f.read_bytes())
        b[-1] ^= 0xFF
        f.write_bytes(bytes(b))
    elif damage == "truncate":
        f.write_bytes(f.read_bytes()[:1000])
        with pytest.raises(DataError, match="truncated") as e:
            Enwik8DataModule(source="sample", cache_dir=str(tmp_path)).setup()
        assert "prepare_data" in str(e.value)
    else:
        (dest / "meta.json").write_text("{")
    fresh = Enwik8DataModule(source="sample", cache_dir=str(tmp_path))
    fresh.prepare_data()
    assert len(build_calls) == 2
    fresh.setup()
    assert len(fresh.tokens["train"]) == enwik8.split_sizes(enwik8.SAMPLE_SIZE)[0]


def test_failed_build_leaves_no_cache(tmp_path: Path, monkeypatch) -> None:
    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(dm_module.np, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        Enwik8DataModule(source="sample", cache_dir=str(tmp_path)).prepare_data()
    assert list((tmp_path / "tokens").iterdir()) == []


def test_setup_without_prepare_data_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="prepare_data"):
        Enwik8DataModule(source="sample", cache_dir=str(tmp_path)).setup()


def test_local_copy_of_another_file(tmp_path: Path) -> None:
    raw, _ = enwik8.load_raw("sample")
    other = tmp_path / "mine.txt"
    other.write_bytes(raw[:300_000])
    kw = dict(source="enwik8", path=str(other), cache_dir=str(tmp_path / "c"), block_size=32)
    with pytest.raises(DataError, match="data.verify=false"):
        Enwik8DataModule(**kw).prepare_data()
    assert not (tmp_path / "c" / "tokens").exists()
    dm = Enwik8DataModule(**kw, verify=False)
    dm.prepare_data()
    dm2 = Enwik8DataModule(**kw, verify=False)  # another process: finds the cache by content
    dm2.setup()
    assert len(dm2.tokens["train"]) == 270_000
    assert dm2.cache_path().name.startswith("enwik8-raw-")


def _bad_sample_file(kind: str, folder: Path) -> Path:
    """An empty file, NUL bytes in place of the text (the right size), or a truncated gzip."""
    bad = folder / f"{kind}.gz"
    if kind == "empty":
        bad.write_bytes(b"")
    elif kind == "nul_bytes":
        bad = folder / "nul.txt"
        bad.write_bytes(bytes(enwik8.SAMPLE_SIZE))
    else:
        bad.write_bytes(enwik8.SAMPLE_PATH.read_bytes()[: enwik8.SAMPLE_GZ_SIZE // 2])
    return bad


@pytest.mark.parametrize("kind", ["empty", "nul_bytes", "truncated_gzip"])
def test_bad_data_path_is_refused_also_when_a_cache_exists(
    sample_cache: Path, tmp_path: Path, build_calls, kind: str
) -> None:
    """The cache of the expected bytes never stands in for a given file: a bad data.path fails
    with the same DataError with the sample's token cache present as on a first run."""
    bad = _bad_sample_file(kind, tmp_path)
    kw = dict(source="sample", path=str(bad), block_size=32)
    with pytest.raises(DataError) as first_run:
        Enwik8DataModule(**kw, cache_dir=str(tmp_path / "empty_cache")).prepare_data()
    assert Enwik8DataModule(source="sample", cache_dir=str(sample_cache)).cache_path().is_dir()
    with pytest.raises(DataError) as with_cache:
        Enwik8DataModule(**kw, cache_dir=str(sample_cache)).prepare_data()
    assert str(with_cache.value) == str(first_run.value)
    assert str(bad) in str(first_run.value) and build_calls == []


def test_published_copies_use_the_cache_without_reading_it(
    sample_cache: Path, tmp_path: Path, build_calls, monkeypatch
) -> None:
    """A copy of the bundled gzip or of the raw sample is recognised by size and sha256 alone;
    a good file in another container (re-gzipped) is read, checked and then finds the cache."""
    raw, _ = enwik8.load_raw("sample")
    copies = {"copy.gz": enwik8.SAMPLE_PATH.read_bytes(), "raw.txt": raw}
    for name, data in copies.items():
        (tmp_path / name).write_bytes(data)
    reads = []
    real = enwik8.read_local
    monkeypatch.setattr(enwik8, "read_local", lambda *a, **k: reads.append(a) or real(*a, **k))
    for name in copies:
        Enwik8DataModule(source="sample", path=str(tmp_path / name),
                         cache_dir=str(sample_cache)).prepare_data()
    assert reads == [] and build_calls == []
    regzipped = tmp_path / "again.gz"
    regzipped.write_bytes(gzip.compress(raw, compresslevel=1))
    dm = Enwik8DataModule(source="sample", path=str(regzipped), cache_dir=str(sample_cache))
    dm.prepare_data()
    assert len(reads) == 1 and build_calls == []


def test_probe_windows_depend_on_the_seed_only(make_dm) -> None:
    a = make_dm(seed=0, batch_size=8).probe_windows(16, seed=7)
    b = make_dm(seed=3, batch_size=2, val_windows=5).probe_windows(16, seed=7)
    c = make_dm().probe_windows(16, seed=8)
    assert a.shape == (16, 32) and a.dtype == torch.long
    assert torch.equal(a, b) and not torch.equal(a, c)
    dm = make_dm()
    valid = torch.from_numpy(np.asarray(dm.tokens["valid"], dtype=np.int64))
    starts = [i for i in range(0, len(valid) - 32, 32) if torch.equal(valid[i : i + 32], a[0])]
    assert starts, "a probe window is an aligned slice of the validation split"
    with pytest.raises(ValueError, match="n_windows"):
        dm.probe_windows(10**9, seed=0)


def test_state_dict_round_trip_and_mismatch(make_dm, tmp_path: Path) -> None:
    dm = make_dm()
    state = json.loads(json.dumps(dm.state_dict()))
    fresh = Enwik8DataModule(source="sample")
    fresh.load_state_dict(state)  # before setup: the vocab is known from the checkpoint
    assert fresh.vocab == dm.vocab
    dm.load_state_dict(state)
    bad = {**state, "vocab": Vocab(range(10)).to_dict()}
    with pytest.raises(DataError, match="vocabulary"):
        dm.load_state_dict(bad)


class _Recorder(L.LightningModule):
    """Records the first token of every sample it trains on; learns nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch[:, :4].clone())
        return (self.w - 1).pow(2).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(dm, max_steps: int, ckpt_path=None, save=None) -> _Recorder:
    model = _Recorder()
    trainer = L.Trainer(max_steps=max_steps, accumulate_grad_batches=2, accelerator="cpu",
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0)  # fmt: skip
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    if save:
        trainer.save_checkpoint(save)
    return model


def test_resume_with_a_trainer_continues_the_data_stream(sample_cache, tmp_path: Path) -> None:
    def dm():
        return Enwik8DataModule(source="sample", cache_dir=str(sample_cache), block_size=16,
                                batch_size=2)  # fmt: skip

    whole = _fit(dm(), max_steps=6).seen
    ckpt = tmp_path / "mid.ckpt"
    first = _fit(dm(), max_steps=3, save=ckpt).seen
    saved = torch.load(ckpt, weights_only=False)
    assert saved["Enwik8DataModule"]["vocab"] is not None  # the vocab rides in the checkpoint
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*not resumable.*")
        second = _fit(dm(), max_steps=6, ckpt_path=ckpt).seen
    assert len(whole) == 12 and len(first) == 6 and len(second) == 6
    assert all(torch.equal(x, y) for x, y in zip(whole, first + second, strict=True))
