"""The training probe: schedule, table, W&B keys, bad input, and no effect on training."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hydra_configs import compose_train
from wandb_records import wandb_history

from repgeom import metrics
from repgeom.models.capture import Capture
from repgeom.probes import table
from repgeom.probes.callback import ProbeCallback, probe_schedule
from repgeom.probes.compare_runs import main as compare_runs
from repgeom.probes.measure import PER_HEAD_METRICS, ProbeSettings, measure
from repgeom.train import read_csv_metrics, train

STATE_METRICS = {
    "anisotropy",
    "mean_cosine",
    "cosine_baseline",
    "drift_norm",
    "drift_ratio",
    "twonn",
    "twonn_mle",
    "near_duplicate_share",
    "gride_k2",
    "gride_k16",
}
HEAD_METRICS = set(PER_HEAD_METRICS)


def test_schedule_is_log_spaced_then_even() -> None:
    steps = probe_schedule(1000, every_n_steps=250, log_spaced_until=100, n_log_spaced=3)
    assert steps == [0, 1, 10, 100, 250, 500, 750, 1000]
    thinned = probe_schedule(
        1000, every_n_steps=10, log_spaced_until=100, n_log_spaced=5, max_probes=6
    )
    assert len(thinned) == 6 and thinned[0] == 0 and thinned[-1] == 1000
    with pytest.raises(ValueError, match="max_steps"):
        probe_schedule(-1, every_n_steps=10, log_spaced_until=10, n_log_spaced=2)


PROBE = ["probe.every_n_steps=10", "probe.log_spaced_until=4", "probe.n_log_spaced=3"]


def test_probes_fire_on_schedule_and_log_every_metric(tmp_path: Path) -> None:
    result = train(compose_train(tmp_path, [*PROBE, "trainer.max_steps=20"]))
    frame = table.read_table(tmp_path)
    assert sorted(frame["step"].unique()) == [0, 1, 2, 4, 10, 20]
    n_layers = result.module.model.config.n_layer
    n_heads = result.module.model.config.n_head
    last = frame[frame["step"] == 20]
    for metric in STATE_METRICS:
        assert sorted(last.loc[last["metric"] == metric, "layer"]) == list(range(n_layers + 1)), (
            metric
        )
    for metric in HEAD_METRICS:
        rows = last[last["metric"] == metric]
        assert len(rows) == n_layers * n_heads, metric
        assert set(rows["layer"]) == set(range(1, n_layers + 1))
    assert np.isfinite(last["value"]).all()
    assert any((tmp_path / "probes" / "plots").glob("profile_anisotropy.png"))

    history = wandb_history(result.wandb_dir)
    probe_rows = [row for row in history if "probe/step" in row]
    assert sorted({row["probe/step"] for row in probe_rows}) == [0, 1, 2, 4, 10, 20]
    keys = {key for row in probe_rows for key in row}
    assert "probe/anisotropy/layer_02" in keys and "probe/twonn/mean" in keys
    assert "probe/qk_cosine/layer_01/head_01" in keys
    # The W&B value is the table's value: one number, two sinks.
    logged = next(
        row
        for row in probe_rows
        if row.get("probe/step") == 20 and "probe/anisotropy/layer_01" in row
    )
    expected = last.query("metric == 'anisotropy' and layer == 1")["value"].item()
    assert logged["probe/anisotropy/layer_01"] == pytest.approx(expected)


def test_probing_leaves_training_unchanged(tmp_path: Path) -> None:
    losses = []
    for name, probe in (("with", PROBE), ("without", ["probe=none"])):
        train(compose_train(tmp_path / name, ["logger=csv", "trainer.max_steps=12", *probe]))
        frame = read_csv_metrics(tmp_path / name).dropna(subset=["train/loss"])
        losses.append(frame.set_index("step")["train/loss"])
    assert (tmp_path / "with" / "probes" / "probes.csv").exists()
    assert not (tmp_path / "without" / "probes").exists()
    pd.testing.assert_series_equal(losses[0], losses[1])


def test_probe_values_equal_the_metrics_on_the_captured_states(tmp_path: Path) -> None:
    result = train(compose_train(tmp_path, ["logger=csv", "trainer.max_steps=5", *PROBE]))
    callback = next(cb for cb in result.trainer.callbacks if isinstance(cb, ProbeCallback))
    model = result.module.model.eval()
    with torch.no_grad():
        capture = model.capture(callback.windows)
    frame = table.read_table(tmp_path)
    final = frame[frame["step"] == 5]
    for layer_index, states in enumerate(capture.hidden):
        X = states.reshape(-1, states.size(-1))
        row = (final["metric"] == "anisotropy") & (final["layer"] == layer_index)
        got = final.loc[row, "value"].item()
        assert got == pytest.approx(metrics.anisotropy(X), rel=1e-6)
    probs = capture.attention[0]
    got = final.query("metric == 'attention_entropy' and layer == 1").sort_values("head")["value"]
    np.testing.assert_allclose(
        got, metrics.attention_entropy(probs, causal=True).entropy, rtol=1e-5
    )


def test_causal_and_bidirectional_runs_probe_the_same_windows(tmp_path: Path) -> None:
    windows = []
    for masking in ("causal", "bidirectional"):
        result = train(
            compose_train(tmp_path / masking, [f"masking={masking}", "trainer.max_steps=2", *PROBE])
        )
        callback = next(cb for cb in result.trainer.callbacks if isinstance(cb, ProbeCallback))
        windows.append(callback.windows)
    assert torch.equal(windows[0], windows[1])
    # The README's comparison command draws both final profiles in one figure.
    out = compare_runs(
        [
            str(tmp_path / "causal"),
            str(tmp_path / "bidirectional"),
            "--metric",
            "anisotropy",
            "--out",
            str(tmp_path / "compare.png"),
        ]
    )
    assert Path(out).stat().st_size > 10_000


def _capture(
    n_windows: int = 4, T: int = 32, C: int = 16, layers: int = 2, heads: int = 2
) -> Capture:
    generator = torch.Generator().manual_seed(0)
    hidden = [torch.randn(n_windows, T, C, generator=generator) for _ in range(layers + 1)]
    qk = [torch.randn(n_windows, heads, T, C // heads, generator=generator) for _ in range(layers)]
    scores = [q @ q.transpose(-1, -2) for q in qk]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    attention = [s.masked_fill(mask, float("-inf")).softmax(-1) for s in scores]
    return Capture(hidden=hidden, queries=qk, keys=qk, attention=attention, causal=True)


def test_nan_states_warn_once_per_metric_and_keep_the_rest() -> None:
    capture = _capture()
    capture.hidden[1][0, 3, 0] = float("nan")
    settings = ProbeSettings(max_order=8, twonn_batch_size=128)
    out = measure([capture], settings)
    bad = [w for w in out.warnings if "layer 1:" in w]
    assert any("anisotropy" in w for w in bad) and any("intrinsic_dimension" in w for w in bad)
    frame = pd.DataFrame(out.rows)
    assert not ((frame["layer"] == 1) & (frame["metric"] == "anisotropy")).any()
    assert ((frame["layer"] == 2) & (frame["metric"] == "anisotropy")).any()
    assert (frame["metric"] == "qk_cosine").sum() == 4


def test_too_few_states_and_missing_attention_are_warnings_not_crashes() -> None:
    capture = _capture(n_windows=1, T=8)
    capture.attention = []
    out = measure([capture], ProbeSettings(max_order=64))
    assert any("intrinsic_dimension" in w and "layer 0" in w for w in out.warnings)
    assert any("attention probabilities were not captured" in w for w in out.warnings)
    metrics_logged = {row["metric"] for row in out.rows}
    assert {"anisotropy", "mean_cosine", "qk_cosine"} <= metrics_logged
    assert "attention_entropy" not in metrics_logged
