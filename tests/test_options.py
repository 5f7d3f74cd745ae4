"""Options are checked before any work: out-of-range values and a bad data.path, by name."""

import shutil
from pathlib import Path

import pytest
from hydra_configs import compose_train

from repgeom.data import enwik8
from repgeom.data.datamodule import Enwik8DataModule
from repgeom.data.enwik8 import DataError
from repgeom.options import OptionError, check_options
from repgeom.train import train


@pytest.mark.parametrize(
    ("override", "error", "name"),
    [
        ("optim.optimizer.lr=-0.001", OptionError, "optim.optimizer.lr"),
        ("optim.optimizer.lr=0", OptionError, "optim.optimizer.lr"),
        ("model.n_head=3", ValueError, "model.n_head"),
        ("model.n_embd=0", ValueError, "model.n_embd"),
        ("optim.optimizer.betas=[0.9,1.5]", OptionError, r"optim.optimizer.betas\[1\]"),
        ("optim.scheduler.warmup_steps=-1", OptionError, "optim.scheduler.warmup_steps"),
        ("data.batch_size=0", OptionError, "data.batch_size"),
    ],
)
def test_out_of_range_option_is_refused_by_name_before_the_data(
    tmp_path: Path, override: str, error: type, name: str
) -> None:
    cache = tmp_path / "cache"
    cfg = compose_train(tmp_path, [override, f"data.cache_dir={cache}", "logger=none"])
    with pytest.raises(error, match=name):
        train(cfg)
    assert not cache.exists()  # refused before the data was prepared


def test_good_config_passes_the_checks(tmp_path: Path) -> None:
    cfg = compose_train(tmp_path)
    assert check_options(cfg) is None  # no OptionError for the shipped defaults
    cfg.optim.optimizer.lr = -cfg.optim.optimizer.lr  # and the same config one sign away fails
    with pytest.raises(OptionError, match="optim.optimizer.lr"):
        check_options(cfg)


def test_missing_data_path_is_refused_also_when_a_cache_exists(tmp_path: Path) -> None:
    copy = tmp_path / "sample.gz"
    shutil.copy(enwik8.SAMPLE_PATH, copy)
    kwargs = dict(source="sample", path=str(copy), cache_dir=str(tmp_path / "c"), block_size=32)
    first = Enwik8DataModule(**kwargs)
    first.prepare_data()  # builds the token cache for the sample's checksum
    copy.unlink()
    with pytest.raises(DataError, match=r"does not exist \(data.path="):
        Enwik8DataModule(**kwargs)


def test_folder_as_data_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="data.path=.* is a folder"):
        Enwik8DataModule(source="sample", path=str(tmp_path), cache_dir=str(tmp_path / "c"))


def test_missing_data_path_is_refused_by_train_before_any_output(tmp_path: Path) -> None:
    cfg = compose_train(
        tmp_path / "run", [f"data.path={tmp_path / 'nope.gz'}", "logger=none"]
    )
    with pytest.raises(DataError, match="does not exist"):
        train(cfg)
