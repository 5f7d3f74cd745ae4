"""The progress bar shows the throughput monitor's tokens/s and the logged loss and bpc."""

from pathlib import Path

import pytest
from hydra_configs import compose_train

from repgeom.callbacks.progress_bar import TokensProgressBar
from repgeom.train import train


@pytest.mark.slow
def test_bar_shows_tokens_per_second_from_the_throughput_monitor(tmp_path: Path) -> None:
    # 20 steps fill ThroughputMonitor's window (window_size: 20) once.
    result = train(compose_train(tmp_path, ["logger=csv", "probe=none", "trainer.max_steps=20"]))
    trainer = result.trainer
    measured = float(trainer.logged_metrics["train/device/items_per_sec"])
    # items are tokens (length_fn): 8 windows x 32 tokens per step
    assert float(trainer.logged_metrics["train/lengths"]) == 20 * 8 * 32
    assert measured > 0
    shown = TokensProgressBar().get_metrics(trainer, result.module)
    assert shown["tokens/s"] == f"{measured:,.0f}"
    assert "v_num" not in shown
    assert float(shown["val/bpc"]) == pytest.approx(float(trainer.logged_metrics["val/bpc"]),
                                                    rel=1e-3)

