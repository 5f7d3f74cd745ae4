"""Shared fixtures: the real Hydra config shrunk to CPU-sized runs, and global state reset."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra


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
