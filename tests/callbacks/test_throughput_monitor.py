"""repgeom.callbacks.throughput_monitor against a clock the test sets: the rates it logs are the
known answers (items, samples, batches and FLOPs of a step over its seconds), with and without
sync-free logging, and the same numbers Lightning's own ThroughputMonitor logs."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ThroughputMonitor as LightningThroughputMonitor
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader

from repgeom.callbacks import throughput_monitor as tm

STEP_S, VAL_BATCH_S = 0.5, 10.0  # seconds a training step and a validation batch take
BATCH, ITEMS, FLOPS, PEAK = 4, 8, 1000, 1e4  # windows per batch, items per window, ...


class Clock:
    """`time.perf_counter` of a run whose steps take exactly the seconds the module says."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


class Module(L.LightningModule):
    def __init__(self, clock: Clock, sync_free_logging: bool) -> None:
        super().__init__()
        self.save_hyperparameters({"sync_free_logging": sync_free_logging})
        self.clock = clock
        self.layer = torch.nn.Linear(ITEMS, 1)
        self.flops_per_batch = FLOPS

    def training_step(self, batch, batch_idx):
        self.clock.now += STEP_S
        return self.layer(batch).mean()

    def validation_step(self, batch, batch_idx):
        self.clock.now += VAL_BATCH_S

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(torch.randn(400, ITEMS), batch_size=BATCH)

    def val_dataloader(self):
        return DataLoader(torch.randn(8, ITEMS), batch_size=BATCH)


class Recorder(Logger):
    """A logger that keeps what it is given: step -> metrics."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: dict[int, dict[str, float]] = {}

    name, version = "recorder", 0

    def log_metrics(self, metrics, step=None) -> None:
        self.steps.setdefault(step, {}).update({k: float(v) for k, v in metrics.items()})

    def log_hyperparams(self, *args, **kwargs) -> None:
        pass


def _fit(monkeypatch, monitor, sync_free_logging: bool, clock_module) -> Recorder:
    clock = Clock()
    monkeypatch.setattr(clock_module, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    recorder = Recorder()
    trainer = L.Trainer(max_steps=40, log_every_n_steps=5, val_check_interval=10,
                        limit_val_batches=2, num_sanity_val_steps=0, logger=recorder,
                        callbacks=[monitor], enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu", devices=1)
    trainer.fit(Module(clock, sync_free_logging))
    return recorder


def _train_rows(recorder: Recorder) -> dict[int, dict[str, float]]:
    return {step: {k: v for k, v in row.items() if k.startswith("train/")}
            for step, row in recorder.steps.items() if "train/batches" in row}


def _ours(window: int = 10) -> tm.ThroughputMonitor:
    return tm.ThroughputMonitor(batch_size_fn=len, length_fn=torch.numel, window_size=window)


@pytest.mark.parametrize("sync_free_logging", [False, True])
def test_the_logged_rates_are_the_steps_counts_over_their_seconds(monkeypatch,
                                                                  sync_free_logging) -> None:
    monkeypatch.setattr(tm, "available_flops", lambda trainer: PEAK)
    rows = _train_rows(_fit(monkeypatch, _ours(), sync_free_logging, tm))
    assert sorted(rows) == [4, 9, 14, 19, 24, 29, 34, 39]  # the logging steps only
    full = [step for step, row in rows.items() if "train/device/items_per_sec" in row]
    # the window (10 updates; sync-free 10 // 5 = 2 updates of 5 steps) is full from step 9 on,
    # and spans validations (20 s each) that are not training time
    assert full == [9, 14, 19, 24, 29, 34, 39]
    for step in full:
        row = rows[step]
        assert row["train/batches"] == step + 1
        assert row["train/lengths"] == (step + 1) * BATCH * ITEMS
        # a step takes STEP_S: exact in binary, so the known answers are exact
        assert row["train/device/batches_per_sec"] == 1 / STEP_S
        assert row["train/device/samples_per_sec"] == BATCH / STEP_S
        assert row["train/device/items_per_sec"] == BATCH * ITEMS / STEP_S
        assert row["train/device/flops_per_sec"] == FLOPS / STEP_S
        assert row["train/device/mfu"] == FLOPS / STEP_S / PEAK


def test_every_logged_number_is_lightnings(monkeypatch) -> None:
    """Lightning's monitor (a sync and an update every batch), on the same clock: the same keys
    and values at the same steps."""
    import lightning.pytorch.callbacks.throughput_monitor as theirs_module

    ours = _train_rows(_fit(monkeypatch, _ours(), False, tm))
    theirs = _fit(monkeypatch, LightningThroughputMonitor(batch_size_fn=len, length_fn=torch.numel,
                                                          window_size=10),
                  False, theirs_module)
    assert ours == _train_rows(theirs)
    assert len(ours) == 8
