"""Shared fixtures: global state reset, and tiny random Hugging Face models saved to disk.

`tiny_hf(family)` loads a 2-layer model of that family written by `tiny_hf_models.build_tiny_hf`
(its docstring lists the families and their tokenizers). Each folder is built once per test
session.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

# One thread for the CPU math of every process of the session: this one, its xdist workers, and
# the train.py and probe.py they start, which inherit it. These tests compare tables across
# processes bit for bit or at rtol 1e-6, and on several threads of a loaded machine a process's
# first CPU forward of a Hugging Face model sometimes rounded differently
# (`repgeom.models.hf.capture._settle_first_call`). Once
# test_offload.py::test_training_and_its_worker_killed_then_rerun_end_with_the_uninterrupted_table
# read 1.3e-4 relative off too (our GPT; cause not established). One thread has no thread timing
# to race. Set before torch is imported; a value the developer set is kept.
for _threads in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hydra.core.global_hydra import GlobalHydra  # noqa: E402
from tiny_hf_models import TEXT, build_tiny_hf  # noqa: E402


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


LONG_WAITS = ("test_install.py", "test_slurm.py")
"""The modules whose tests mostly wait (pip building a fresh venv; SLURM's scheduler and its
one-minute time limit): collected first, so that under `pytest -n` (make test) they start at
once and overlap with everything else instead of running alone at the end."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long waits first (`LONG_WAITS`); skip `gpu` tests with a reason when no CUDA device
    is present."""
    items.sort(key=lambda item: item.path.name not in LONG_WAITS)  # stable: else as collected
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_text() -> str:
    """A few hundred characters, all in the tiny tokenizers' vocabulary."""
    return TEXT


@pytest.fixture(scope="session")
def tiny_hf_folder(tmp_path_factory):
    """`tiny_hf_folder(family)` -> path of a saved tiny model of that family (built once);
    ``tokenizer=False``: the same model saved without its tokenizer."""
    built: dict[tuple[str, bool], str] = {}

    def make(family: str, *, tokenizer: bool = True) -> str:
        if (family, tokenizer) not in built:
            name = family.replace("-", "_") + ("" if tokenizer else "_model_only")
            folder = tmp_path_factory.mktemp(name)
            build_tiny_hf(family, folder, tokenizer=tokenizer)
            built[family, tokenizer] = str(folder)
        return built[family, tokenizer]

    return make


@pytest.fixture(scope="session")
def tiny_hf(tiny_hf_folder):
    """`tiny_hf(family)` -> `HFModel` loaded from its saved folder through `load_hf_model`."""
    from repgeom.models.hf import load_hf_model

    loaded: dict = {}

    def make(family: str):
        if family not in loaded:
            loaded[family] = load_hf_model(tiny_hf_folder(family))
        return loaded[family]

    return make


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
