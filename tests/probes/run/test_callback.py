"""The training probe: schedule, table, W&B keys, bad input, and no effect on training."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hydra_configs import compose_train
from wandb_records import wandb_history

from repgeom import metrics
from repgeom.cli.compare_runs import main as compare_runs
from repgeom.models.capture import Capture
from repgeom.probes.core import table
from repgeom.probes.core.measure import PER_HEAD_METRICS, ProbeSettings, measure
from repgeom.probes.run.callback import ProbeCallback
from repgeom.probes.run.schedule import probe_schedule
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
LAYER_QK_METRICS = {"qk_cosine_concat"}
"""Read from queries and keys like the head metrics, but one row per block (head -1)."""


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


@pytest.mark.slow
def test_probes_fire_on_schedule_and_log_every_metric(tmp_path: Path) -> None:
    result = train(compose_train(tmp_path, [*PROBE, "trainer.max_steps=20"]))
    frame = table.read_table(tmp_path)
    assert sorted(frame["step"].unique()) == [0, 1, 2, 4, 10, 20]
    n_layers = result.module.model.config.n_layer
    n_heads = result.module.model.config.n_head
    last = frame[frame["step"] == 20]
    # One layer convention: embedding, the residual stream after each block, then the final
    # norm's output as its own named layer (pre-LN models have one).
    names = ["embedding", *(f"block_{i}" for i in range(1, n_layers + 1)), "final_norm"]
    for metric in STATE_METRICS:
        rows = last.loc[last["metric"] == metric].sort_values("layer")
        assert rows["layer"].tolist() == list(range(n_layers + 2)), metric
        assert rows["layer_name"].tolist() == names, metric
    # Razzhigaev et al.'s protocol: 512 states in two batches of 256, mean and std over batches.
    for metric in ("anisotropy", "mean_cosine", "twonn", "gride_k2"):
        spread = last.loc[last["metric"] == metric, "std"]
        assert len(spread) == n_layers + 2 and (spread > 0).all(), metric
    for metric in HEAD_METRICS:
        rows = last[last["metric"] == metric]
        assert len(rows) == n_layers * n_heads, metric
        assert set(rows["layer"]) == set(range(1, n_layers + 1))
    for metric in LAYER_QK_METRICS:
        rows = last[last["metric"] == metric]
        assert rows["layer"].tolist() == list(range(1, n_layers + 1)), metric
        assert (rows["head"] == -1).all(), metric
    assert np.isfinite(last["value"]).all()
    assert any((tmp_path / "probes" / "plots").glob("profile_anisotropy.png"))

    history = wandb_history(result.wandb_dir)
    probe_rows = [row for row in history if "probe/step" in row]
    assert sorted({row["probe/step"] for row in probe_rows}) == [0, 1, 2, 4, 10, 20]
    keys = {key for row in probe_rows for key in row}
    assert "probe/anisotropy/layer_02" in keys and "probe/twonn/mean" in keys
    assert "probe/qk_cosine/layer_01/head_01" in keys
    assert "probe/qk_cosine_concat/layer_01" in keys and "probe/qk_cosine_concat/mean" in keys
    # The current phase of every layer at each probe (+1/-1/0), and phases.csv at the end.
    assert "probe/phase/twonn/mean" in keys and "probe/phase/twonn/layer_01" in keys
    assert (tmp_path / "probes" / "phases.csv").exists()
    # The W&B value is the table's value: one number, two sinks.
    logged = next(
        row
        for row in probe_rows
        if row.get("probe/step") == 20 and "probe/anisotropy/layer_01" in row
    )
    expected = last.query("metric == 'anisotropy' and layer == 1")["value"].item()
    assert logged["probe/anisotropy/layer_01"] == pytest.approx(expected)


@pytest.mark.slow
def test_probing_leaves_training_unchanged(tmp_path: Path) -> None:
    losses = []
    for name, probe in (("with", PROBE), ("without", ["probe=none"])):
        train(compose_train(tmp_path / name, ["logger=csv", "trainer.max_steps=12", *probe]))
        frame = read_csv_metrics(tmp_path / name).dropna(subset=["train/loss"])
        losses.append(frame.set_index("step")["train/loss"])
    assert (tmp_path / "with" / "probes" / "probes.csv").exists()
    assert not (tmp_path / "without" / "probes").exists()
    pd.testing.assert_series_equal(losses[0], losses[1])


@pytest.mark.slow
def test_probe_values_equal_the_metrics_on_the_captured_states(tmp_path: Path) -> None:
    result = train(compose_train(tmp_path, ["logger=csv", "trainer.max_steps=5", *PROBE]))
    callback = next(cb for cb in result.trainer.callbacks if isinstance(cb, ProbeCallback))
    probes = callback.probes
    model = result.module.model.eval()
    with torch.no_grad():
        capture = model.capture(probes.windows, attention=False)
        whole = model.capture(probes.windows[: probes.attention_windows])
    assert probes.positions.sum(1).eq(4).all() and probes.n_states == 512
    used = json.loads((tmp_path / "probes" / "probe_set.json").read_text())
    assert used == {"protocol": "repgeom", "n_states": 512, "n_windows": 128, "window": 32,
                    "positions_per_window": 4, "attention_windows": 16, "texts": "real",
                    "twonn_convention": "facco"}
    frame = table.read_table(tmp_path)
    final = frame[frame["step"] == 5]
    # The same permutation as the probe (seed 0), cut into two batches of 256.
    perm = torch.randperm(512, generator=torch.Generator().manual_seed(0))
    for layer_index, states in enumerate([*capture.hidden, capture.final_norm]):
        X = states[probes.positions]  # (512, C), in window order
        values = [metrics.anisotropy(X[half]) for half in perm.chunk(2)]
        row = final.loc[(final["metric"] == "anisotropy") & (final["layer"] == layer_index)]
        assert row["value"].item() == pytest.approx(np.mean(values), rel=1e-6)
        assert row["std"].item() == pytest.approx(np.std(values), rel=1e-6)
    # The final norm is the model's own ln_f applied to the last block's residual stream.
    torch.testing.assert_close(capture.final_norm, model.transformer.ln(capture.hidden[-1]))
    probs = whole.attention[0]
    got = final.query("metric == 'attention_entropy' and layer == 1").sort_values("head")["value"]
    np.testing.assert_allclose(
        got, metrics.attention_entropy(probs, causal=True).entropy, rtol=1e-5
    )
    # Heads concatenated: the mean query and key of the whole windows, (H, D) flattened.
    for layer, (Q, K) in enumerate(zip(whole.queries, whole.keys, strict=True), start=1):
        q = Q.double().mean(dim=(0, 2)).flatten().numpy()
        k = K.double().mean(dim=(0, 2)).flatten().numpy()
        got = final.query(f"metric == 'qk_cosine_concat' and layer == {layer}")["value"].item()
        # float32 Q/K reduced in float64 on both sides
        assert got == pytest.approx(q @ k / (np.linalg.norm(q) * np.linalg.norm(k)), abs=1e-6)


def test_llm_microscope_preset_is_the_authors_protocol(tmp_path: Path) -> None:
    """probe=llm_microscope: whole windows, every state in one set, the authors' TwoNN fit."""
    # The tiny config's 512 states in one set stand in for the preset's 4,096.
    overrides = ["logger=csv", "trainer.max_steps=5", "probe=llm_microscope",
                 "probe.n_states=512", "probe.settings.state_batch_size=512"]
    result = train(compose_train(tmp_path, overrides))
    callback = next(cb for cb in result.trainer.callbacks if isinstance(cb, ProbeCallback))
    probes = callback.probes
    used = json.loads((tmp_path / "probes" / "probe_set.json").read_text())
    assert used["protocol"] == "llm_microscope" and used["twonn_convention"] == "llm_microscope"
    assert used["positions_per_window"] == used["window"] == 32 and used["n_states"] == 512
    frame = table.read_table(tmp_path)
    assert "twonn" not in set(frame["metric"])  # one convention per table, named in the rows
    final = frame[frame["step"] == 5]
    with torch.no_grad():
        capture = result.module.model.eval().capture(probes.windows, attention=False)
    for layer in (1, 2):
        X = capture.hidden[layer][probes.positions]
        row = final.query(f"metric == 'twonn_llm_microscope' and layer == {layer}")
        # The same states in the same process: equal to float64 rounding.
        assert row["value"].item() == pytest.approx(metrics.twonn_authors(X).dimension,
                                                    rel=1e-9)
        assert np.isnan(row["std"].item())  # one set: no spread over batches


@pytest.mark.slow
def test_causal_and_bidirectional_runs_probe_the_same_windows(tmp_path: Path) -> None:
    windows = []
    for masking in ("causal", "bidirectional"):
        result = train(
            compose_train(tmp_path / masking, [f"masking={masking}", "trainer.max_steps=2", *PROBE])
        )
        callback = next(cb for cb in result.trainer.callbacks if isinstance(cb, ProbeCallback))
        windows.append((callback.probes.windows, callback.probes.positions))
    assert torch.equal(windows[0][0], windows[1][0]) and torch.equal(windows[0][1], windows[1][1])
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
    settings = ProbeSettings(max_order=8, state_batch_size=128)
    out = measure([capture], [capture], settings)
    bad = [w for w in out.warnings if "layer 1:" in w]
    assert any("anisotropy" in w for w in bad) and any("intrinsic_dimension" in w for w in bad)
    frame = pd.DataFrame(out.rows)
    assert not ((frame["layer"] == 1) & (frame["metric"] == "anisotropy")).any()
    assert ((frame["layer"] == 2) & (frame["metric"] == "anisotropy")).any()
    assert (frame["metric"] == "qk_cosine").sum() == 4
    # keys equal to queries: the concatenated mean query and mean key are one vector
    concat = frame[frame["metric"] == "qk_cosine_concat"]
    assert concat["layer"].tolist() == [1, 2] and (concat["head"] == -1).all()
    np.testing.assert_allclose(concat["value"], 1.0, atol=1e-12)


def test_too_few_states_and_missing_attention_are_warnings_not_crashes() -> None:
    capture = _capture(n_windows=1, T=8)
    capture.attention = []
    out = measure([capture], [capture], ProbeSettings(max_order=64))
    assert any("intrinsic_dimension" in w and "layer 0" in w for w in out.warnings)
    assert any("attention probabilities were not captured" in w for w in out.warnings)
    metrics_logged = {row["metric"] for row in out.rows}
    assert {"anisotropy", "mean_cosine", "qk_cosine"} <= metrics_logged
    assert "attention_entropy" not in metrics_logged


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("discard_fraction", 0.0, r"discard_fraction must lie in \(0\.0, 1\.0\), got 0\.0"),
        ("discard_fraction", 1.0, r"discard_fraction must lie in \(0\.0, 1\.0\), got 1\.0"),
        ("near_duplicate_threshold", -0.1, r"near_duplicate_threshold must lie in"),
        ("cosine_baseline_quantile", 1.5, r"cosine_baseline_quantile must lie in"),
        ("state_batch_size", 2, r"state_batch_size must be an integer >= 3"),
        ("max_order", 12, r"max_order must be a power of two"),
    ],
)
def test_out_of_range_settings_fail_with_the_option_and_its_range(option, value, message):
    with pytest.raises(ValueError, match=message):
        ProbeSettings(**{option: value})


def test_out_of_range_setting_fails_before_training(tmp_path: Path) -> None:
    from hydra.errors import InstantiationException

    cfg = compose_train(tmp_path, ["probe.settings.discard_fraction=0.0"])
    message = r"discard_fraction must lie in \(0\.0, 1\.0\)"
    with pytest.raises(InstantiationException, match=message):
        train(cfg)
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.slow
def test_a_finished_offloaded_run_stays_finished_when_rerun(tmp_path: Path) -> None:
    import threading

    from repgeom.probes.run.offload import snapshots
    from repgeom.probes.run.offload.follow import follow

    overrides = [*PROBE, "trainer.max_steps=20", "logger=csv", "probe.offload=snapshots"]
    train(compose_train(tmp_path, overrides))
    folder = snapshots.snapshot_dir(tmp_path)
    done = snapshots.read_json(folder / snapshots.DONE)
    assert done["step"] == 20
    # train.py resumes from last.ckpt at step 20: Lightning's fit loop is skipped (no
    # on_train_start, no on_train_end); the run must not be turned back into "running".
    train(compose_train(tmp_path, overrides))
    assert snapshots.read_json(folder / snapshots.DONE) == done
    assert snapshots.read_json(folder / snapshots.TRAINING)["state"] == "finished"
    assert not [t for t in threading.enumerate() if t.name == "snapshot-heartbeat"]
    # so a worker started now probes the run and ends "done", not "died"
    result = follow(tmp_path, timeout_s=30, wandb=False)
    assert result.stopped == "done" and result.probed == [0, 1, 2, 4, 10, 20]
