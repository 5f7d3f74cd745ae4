"""Fixtures of the end-to-end probe tests (core/test_targets.py, core/test_spec.py,
run/test_runner.py, run/test_compare.py): a text file in the tiny tokenizers' vocabulary, and a
tiny training run with checkpoints (trained once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra_configs import compose_train

from repgeom.train import train


@pytest.fixture(scope="module")
def text_file(tmp_path_factory, tiny_text) -> Path:
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text(tiny_text * 3)  # in the tiny tokenizers' vocabulary: no <unk>
    return path


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> Path:
    """A tiny training run probed at steps 0, 10 and 20, with checkpoints at steps 10 and 20."""
    run_dir = tmp_path_factory.mktemp("run")
    steps_ckpt = (
        "+callbacks.every10={_target_:lightning.pytorch.callbacks.ModelCheckpoint,"
        f"dirpath:'{run_dir}/checkpoints',filename:'step{{step}}',every_n_train_steps:10,"
        "save_top_k:-1,auto_insert_metric_name:false}"
    )
    overrides = ["logger=csv", "probe.every_n_steps=10", "probe.n_log_spaced=0", steps_ckpt]
    train(compose_train(run_dir, overrides))
    return run_dir
