"""A local Hydra multirun (`python train.py -m masking=causal,bidirectional`) writes two runs."""

from pathlib import Path

import pytest
import torch
from cli_runs import assert_complete_run, run_train, tiny_overrides, wandb_runs
from wandb_records import wandb_records

pytestmark = pytest.mark.slow

STEPS = 10


def wandb_group(wandb_run: Path) -> str | None:
    """The W&B group recorded in the run's header record."""
    headers = wandb_records(wandb_run, "run")
    return headers[0].get("run_group") if headers else None


def test_masking_sweep_writes_two_complete_runs_in_one_wandb_group(tmp_path: Path) -> None:
    sweep = tmp_path / "multirun" / "masking-sweep"
    run_train(
        ["-m", "masking=causal,bidirectional", *tiny_overrides(), f"trainer.max_steps={STEPS}",
         "trainer.val_check_interval=5", f"hydra.sweep.dir={sweep}"]
    )
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in jobs] == ["0", "1"]
    ids = set()
    for job, masking in zip(jobs, ["causal", "bidirectional"], strict=True):
        assert_complete_run(job, max_steps=STEPS)
        ckpt = torch.load(job / "checkpoints" / "last.ckpt", weights_only=False)
        assert ckpt["hyper_parameters"]["masking"]["name"] == masking
        (run,) = wandb_runs(job)
        ids.add(run.name.rsplit("-", 1)[-1])
        # One group per sweep (its folder), one W&B run per job.
        assert wandb_group(run) == "masking-sweep"
    assert len(ids) == 2
