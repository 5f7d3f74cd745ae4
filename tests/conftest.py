"""Shared fixtures: the real Hydra config shrunk to CPU-sized runs, and global state reset."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = ROOT / "conf"

# The smallest model and run that still exercise every code path, in seconds on 2 CPU cores.
TINY = [
    "data=sample",
    "model.n_layer=2",
    "model.n_head=2",
    "model.n_embd=32",
    "model.block_size=32",
    "data.batch_size=8",
    "data.val_windows=16",
    "trainer=cpu",
    "trainer.max_steps=20",
    "trainer.val_check_interval=10",
    "trainer.limit_val_batches=2",
    "trainer.log_every_n_steps=1",
    "optim.scheduler.warmup_steps=5",
    "~callbacks.progress_bar",
]


def compose_train(tmp_path: Path, overrides: list[str] = (), *, tiny: bool = True) -> DictConfig:
    """The real `conf/train.yaml`, shrunk by `TINY` unless `tiny=False`, writing to `tmp_path`."""
    GlobalHydra.instance().clear()
    shrink = TINY if tiny else []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=[*shrink, f"output_dir={tmp_path}", *overrides])


@pytest.fixture(autouse=True)
def _reset_global_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Seed torch, keep W&B offline and local, and leave no Hydra instance behind."""
    torch.manual_seed(0)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    default_dtype = torch.get_default_dtype()
    yield
    torch.set_default_dtype(default_dtype)
    GlobalHydra.instance().clear()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `gpu` tests with a reason when no CUDA device is present."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
