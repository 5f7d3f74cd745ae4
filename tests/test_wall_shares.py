"""benchmarks/wall_shares.py: a fit's wall time split into probes, checkpoint writes, validation
and the rest (issue 41, item 4: the GPU session's whole-run shares)."""

import sys
import time

import lightning as L
from cli_runs import ROOT
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

sys.path.insert(0, str(ROOT / "benchmarks"))
from wall_shares import WallShares  # noqa: E402

PAUSE_S = 0.1


class _SlowProbe(L.Callback):
    """A stand-in probe: every 2nd step, and once inside each validation, it takes PAUSE_S."""

    def __init__(self) -> None:
        self.calls = 0

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step % 2 == 0:
            self.calls += 1
            time.sleep(PAUSE_S)

    def on_validation_batch_end(self, *args) -> None:
        self.calls += 1
        time.sleep(PAUSE_S)


class _SlowValidation(BoringModel):
    def validation_step(self, batch, batch_idx):
        time.sleep(PAUSE_S)
        out = super().validation_step(batch, batch_idx)
        self.log("val/bpc", out["x"])
        return out


def test_the_parts_are_timed_apart_and_written_to_the_results(tmp_path) -> None:
    probe = _SlowProbe()
    shares = WallShares(results=str(tmp_path / "results.txt"), label="test",
                        probe_types=(_SlowProbe,))
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val/bpc", save_last=True)
    trainer = L.Trainer(max_steps=6, val_check_interval=3, limit_val_batches=2,
                        num_sanity_val_steps=0, callbacks=[probe, shares, checkpoint],
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu")
    trainer.fit(_SlowValidation())
    s = shares.seconds
    assert probe.calls == 3 + 2 * 2  # steps 2, 4, 6 and 2 batches in each of 2 validations
    assert s["probes"] >= probe.calls * PAUSE_S
    assert s["validation"] >= 2 * 2 * PAUSE_S  # its own batches, its probe seconds taken out
    assert s["checkpoints"] > 0  # best and last at each validation
    line = (tmp_path / "results.txt").read_text().strip()
    assert line == shares.line
    assert line.startswith("whole run (test): 6 steps in ")
    for part in ("probes", "checkpoints", "validation", "training and the rest"):
        assert f" {part} " in line
