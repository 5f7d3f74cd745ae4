"""The metric catalogue: numbers unchanged by it, the new built-ins equal their functions, user
metrics by configuration alone (train.py and probe.py), and representation similarity."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra_configs import CONF_DIR, compose_train
from make_reference_table import reference_frame
from wandb_records import logged_keys

from repgeom import metrics
from repgeom.models.capture import Capture
from repgeom.probes.core import catalogue, table
from repgeom.probes.core.measure import ProbeSettings, measure
from repgeom.probes.run.job import probe_job
from repgeom.probes.run.runner import probe
from repgeom.train import train

REFERENCE = Path(__file__).parent / "data" / "reference_table.csv"


# The reference was written on one CPU; float32 kernels round differently on another (SIMD width,
# BLAS blocking and oneDNN's choice of kernel change the order of every sum), so the same code
# gives numbers a few float32 ulps apart (u = 2**-24 = 6e-8). Measured against the stored file:
# up to 5e-7 relative on an AVX-512 CPU, 2.5e-6 under ATEN_CPU_CAPABILITY=default. RTOL = 1e-5
# (about 170 u) keeps a 4x margin over that and is still far below what a change of the probe
# itself does (another batching or metric moves the numbers by 1e-3 or more).
STORED_RTOL = 1e-5
# Values that are 0 (a near-duplicate share, a count) have no relative scale: 1e-9 absolute.
STORED_ATOL = 1e-9


@pytest.mark.stored_numbers
def test_probe_numbers_unchanged_by_the_catalogue() -> None:
    """Every row the probe wrote before the catalogue (reference_table.csv, written by the code
    of commit 25c2e81 with make_reference_table.py) comes back, to float32 rounding."""
    before = pd.read_csv(REFERENCE)
    after = reference_frame()
    keys = ["layer", "head", "metric"]
    merged = before.merge(after, on=keys, how="left", suffixes=("_before", "_after"))
    assert len(merged) == len(before) == 136
    assert merged["value_after"].notna().all(), "a metric of the old probe disappeared"
    # The same functions on the same batches, only the order of the calls is the catalogue's:
    # equal up to the CPU's float32 rounding (STORED_RTOL). Counts (duplicates, n_modes) must
    # match exactly: a difference of 1 is far outside the tolerance.
    np.testing.assert_allclose(merged["value_after"], merged["value_before"],
                               rtol=STORED_RTOL, atol=STORED_ATOL)
    # A std over batches is a difference of batch values, each known to STORED_RTOL of its size:
    # its rounding error is relative to the value, not to the (possibly tiny) std itself.
    has_std = merged["std_before"].notna()
    assert (merged["std_after"].notna() == has_std).all()
    scale = merged["value_before"].abs() + merged["std_before"].abs()
    error = (merged["std_after"] - merged["std_before"]).abs()
    assert (error[has_std] <= STORED_RTOL * scale[has_std] + STORED_ATOL).all(), (
        merged.loc[has_std & (error > STORED_RTOL * scale), keys + ["std_before", "std_after"]])
    assert (merged["layer_name_after"] == merged["layer_name_before"]).all()


def _states(n: int = 300, d: int = 12, layers: int = 3) -> Capture:
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(1, n, d, generator=generator)
    # Layers that drift apart: layer i adds i units of independent noise to a common signal.
    hidden = [base + i * torch.randn(1, n, d, generator=generator) for i in range(layers)]
    return Capture(hidden=hidden, queries=[], keys=[], attention=[], causal=True)


def test_new_builtins_equal_their_functions_on_the_same_batches() -> None:
    capture = _states()
    settings = ProbeSettings(metrics=["all"], max_order=8, state_batch_size=100)
    frame = pd.DataFrame(measure([capture], [], settings).rows)
    split = metrics.batch_indices(300, 100, 0)
    for layer, H in enumerate(capture.hidden):
        X = H[0]
        batches = [X[i] for i in split]

        def row(metric, layer=layer):
            rows = frame.loc[(frame["metric"] == metric) & (frame["layer"] == layer)]
            assert len(rows) == 1, metric
            return rows["value"].item(), rows["std"].item()

        for name, fn in (("effective_rank", metrics.effective_rank), ("rankme", metrics.rankme),
                         ("isoscore", metrics.isoscore)):
            values = [fn(b) for b in batches]
            assert row(name) == (pytest.approx(np.mean(values), rel=1e-12),
                                 pytest.approx(np.std(values), rel=1e-9))
        pca = np.array([metrics.pca_dimension(b, variance=(0.9, 0.99)) for b in batches])
        assert row("pca_dimension_90")[0] == pytest.approx(pca[:, 0].mean())
        assert row("pca_dimension_99")[0] == pytest.approx(pca[:, 1].mean())
        # The MLE comes from the same neighbour search as TwoNN and GRIDE.
        result = metrics.intrinsic_dimension(X, batch_size=100, max_order=8,
                                             near_duplicate_threshold=0.005)
        assert row("mle_dimension")[0] == pytest.approx(result.mle.dimension, rel=1e-12)
        assert row("twonn")[0] == pytest.approx(result.twonn.dimension, rel=1e-12)
    # Layer x layer similarity: every pair a <= b once, the diagonal 1, values equal the
    # functions' mean over the same batches.
    cka = frame.loc[frame["metric"] == "linear_cka"]
    assert sorted(zip(cka["layer"], cka["layer_b"], strict=True)) == [
        (0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2)]
    diagonal = cka.loc[cka["layer"] == cka["layer_b"], "value"]
    np.testing.assert_allclose(diagonal, 1.0, atol=1e-12)  # float64 inside linear_cka
    X0, X2 = capture.hidden[0][0], capture.hidden[2][0]
    expected = np.mean([metrics.linear_cka(X0[i], X2[i]) for i in split])
    got = cka.loc[(cka["layer"] == 0) & (cka["layer_b"] == 2), "value"].item()
    assert got == pytest.approx(expected, rel=1e-12)
    # More noise, less similar: layer 0 is closer to layer 1 than to layer 2.
    one = cka.loc[(cka["layer"] == 0) & (cka["layer_b"] == 1), "value"].item()
    assert one > got
    knn = frame.loc[(frame["metric"] == "mutual_knn") & (frame["layer"] == frame["layer_b"])]
    np.testing.assert_allclose(knn["value"], 1.0)  # a set is its own nearest-neighbour set
    # One neighbour search per layer and batch serves every pair: the same as mutual_knn.
    expected = np.mean([metrics.mutual_knn(X0[i], X2[i], k=10) for i in split])
    knn02 = frame.loc[(frame["metric"] == "mutual_knn") & (frame["layer"] == 0)
                      & (frame["layer_b"] == 2), "value"].item()
    assert knn02 == pytest.approx(expected, rel=1e-12) and 0.0 < knn02 < 1.0


def test_the_training_default_leaves_out_pairs_and_probe_py_computes_all() -> None:
    default = {m.name for m in catalogue.resolve(["default"])}
    assert {"effective_rank", "rankme", "isoscore", "pca_dimension"} <= default
    assert not default & {"linear_cka", "mutual_knn"}
    assert {m.name for m in catalogue.resolve(["all"])} == set(catalogue.BUILTIN)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        assert list(compose("train").probe.metrics) == ["default"]
        assert list(compose("probe").metrics) == ["all"]


def test_unknown_metric_fails_with_its_name() -> None:
    with pytest.raises(ValueError, match="'no_such_metric' is neither a built-in"):
        ProbeSettings(metrics=["default", "no_such_metric"])
    with pytest.raises(ValueError, match="cannot import 'nowhere.fn'"):
        ProbeSettings(metrics=["nowhere.fn"])
    with pytest.raises(ValueError, match="a list of names"):
        ProbeSettings(metrics="anisotropy")


USER_MODULE = """
import torch


def width(X: torch.Tensor) -> float:
    return float(X.shape[1])


def shape(X: torch.Tensor) -> dict:
    return {"rows": float(X.shape[0]), "mean_norm": float(X.norm(dim=1).mean())}
"""


@pytest.fixture
def user_module(tmp_path_factory, monkeypatch) -> str:
    """A module of the user's, outside the package, importable as `my_geometry`."""
    folder = tmp_path_factory.mktemp("user_code")
    (folder / "my_geometry.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(folder))
    yield "my_geometry"
    sys.modules.pop("my_geometry", None)
    catalogue._USER.clear()


def _assert_user_metric_everywhere(run_dir: Path, wandb_dir: Path, n_layers: int) -> None:
    frame = table.read_table(run_dir)
    csv = pd.read_csv(run_dir / "probes" / "probes.csv")
    layers = list(range(n_layers + 2))  # embedding, blocks, final norm
    for name in ("width", "shape_rows", "shape_mean_norm"):
        rows = csv.loc[csv["metric"] == name]
        assert sorted(rows["layer"].unique()) == layers, name
    # Known answers: the width of every layer is n_embd = 32; each batch holds 256 states
    # (512 states, state_batch_size 256), with no spread between the two batches.
    width = frame.loc[frame["metric"] == "width"]
    assert (width["value"] == 32.0).all() and (width["std"] == 0.0).all()
    assert (frame.loc[frame["metric"] == "shape_rows", "value"] == 256.0).all()
    keys = logged_keys(wandb_dir)
    assert {f"probe/width/layer_{i:02d}" for i in layers} <= keys
    assert "probe/shape_mean_norm/layer_01" in keys and "probe/width/mean" in keys
    assert (run_dir / "probes" / "plots" / "profile_width.png").is_file()
    assert any(k.startswith("probe/plots/profile_width") for k in keys)


@pytest.mark.slow
def test_user_metric_by_configuration_in_train_and_probe(tmp_path, user_module) -> None:
    run_dir = tmp_path / "train"
    overrides = ["logger=wandb", "trainer.max_steps=10", "probe.every_n_steps=10",
                 "probe.n_log_spaced=0",
                 f"probe.metrics=[default,{user_module}.width,{user_module}.shape]"]
    train(compose_train(run_dir, overrides))
    wandb_dir = next((run_dir / "wandb").glob("offline-run-*"))
    _assert_user_metric_everywhere(run_dir, wandb_dir, n_layers=2)

    probe_dir = tmp_path / "probe"
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("probe", overrides=[
            f"output_dir={probe_dir}", f"ckpt={run_dir}/checkpoints/last.ckpt", "device=cpu",
            "logger=wandb", "settings.distributions=false",
            f"metrics=[default,{user_module}.width,{user_module}.shape]"])
    result = probe(probe_job(cfg))
    _assert_user_metric_everywhere(probe_dir, result.wandb_dir, n_layers=2)
    # probe.py of the last checkpoint gives the training probe's numbers for the user metric.
    trained = table.read_table(run_dir)
    trained = trained.loc[(trained["step"] == 10) & (trained["metric"] == "shape_mean_norm")]
    probed = table.read_table(probe_dir).query("metric == 'shape_mean_norm'")
    np.testing.assert_allclose(probed.sort_values("layer")["value"],
                               trained.sort_values("layer")["value"], rtol=1e-6)


@pytest.mark.slow
def test_similarity_maps_in_probe_py_over_a_run(tmp_path) -> None:
    """A run with checkpoints at steps 10 and 20: layer x layer CKA per checkpoint and each
    step against the last, in the table, W&B and probes/plots."""
    run_dir = tmp_path / "train"
    steps_ckpt = (
        "+callbacks.every10={_target_:lightning.pytorch.callbacks.ModelCheckpoint,"
        f"dirpath:'{run_dir}/checkpoints',filename:'step{{step}}',every_n_train_steps:10,"
        "save_top_k:-1,auto_insert_metric_name:false}"
    )
    train(compose_train(run_dir, ["logger=csv", "probe=none", steps_ckpt]))
    out = tmp_path / "probe"
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("probe", overrides=[
            f"output_dir={out}", f"run={run_dir}", "device=cpu", "logger=wandb",
            "n_states=256", "settings.state_batch_size=128", "settings.max_order=8",
            "settings.distributions=false", "metrics=[anisotropy,linear_cka,mutual_knn]"])
    result = probe(probe_job(cfg))
    frame = table.read_table(out)
    layer_pairs = frame.loc[(frame["metric"] == "linear_cka") & (frame["step_b"] < 0)]
    assert set(layer_pairs["step"]) == {10, 20}
    assert len(layer_pairs) == 2 * (4 * 5 // 2)  # 4 layers: 10 pairs a <= b per step
    vs_final = frame.loc[(frame["metric"] == "linear_cka") & (frame["step_b"] == 20)]
    assert sorted(vs_final["step"].unique()) == [10, 20]
    # The final step against itself is exactly the same states: CKA 1 (float16 storage cannot
    # change that, both sides round the same way).
    np.testing.assert_allclose(vs_final.loc[vs_final["step"] == 20, "value"], 1.0, atol=1e-9)
    assert (vs_final.loc[vs_final["step"] == 10, "value"] < 1.0).all()
    plots_dir = out / "probes" / "plots"
    for name in ("similarity_linear_cka", "vs_final_linear_cka", "similarity_mutual_knn"):
        assert (plots_dir / f"{name}.png").is_file(), name
    keys = logged_keys(result.wandb_dir)
    assert {"probe/linear_cka/layer_01/layer_02", "probe/linear_cka_vs_final/layer_01",
            "probe/plots/similarity_linear_cka"} <= {k.split(".")[0] for k in keys} | keys
    # Pairwise rows stay out of the layer means.
    assert "probe/linear_cka/mean" not in keys


def test_probe_spec_has_each_default_once_and_reads_old_checkpoints() -> None:
    from dataclasses import asdict

    from repgeom.probes.core.spec import ProbeCallbackConf, ProbeSpec

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        probe_conf = compose("train", overrides=["seed=7"]).probe
    # conf/probe/default.yaml only overrides the structured config: every estimator option
    # comes from ProbeSettings' own defaults.
    assert dict(probe_conf.settings) == {
        k: v for k, v in asdict(ProbeSettings()).items() if k not in ("seed", "metrics")
    }
    assert probe_conf.seed == 7 and probe_conf.n_states == ProbeCallbackConf.n_states == 8192
    # A checkpoint of the callback before the spec: a loose dict, the oldest with
    # twonn_batch_size; null positions_per_window means every position and must stay null.
    old = {"config": {"n_states": 100, "positions_per_window": None, "attention_windows": 4,
                      "batch_size": 2, "seed": 3,
                      "settings": {"twonn_batch_size": 64, "seed": 3, "distributions": True}}}
    spec = ProbeSpec.from_checkpoint(old)
    assert (spec.n_states, spec.positions_per_window, spec.seed) == (100, None, 3)
    settings = spec.probe_settings()
    assert (settings.state_batch_size, settings.distributions, settings.seed) == (64, True, 3)
    assert ProbeSpec.from_checkpoint({"spec": spec.to_dict()}) == spec
    with pytest.raises(ValueError, match="max_order must be a power of two"):
        ProbeSpec(settings={"max_order": 12})


@pytest.mark.slow
def test_training_similarity_and_run_against_run(tmp_path) -> None:
    """Training with a pairwise metric: layer x layer maps and each step against the final one
    in the table, W&B and probes/plots; then causal against bidirectional, layer by layer,
    through compare_runs, equal to linear_cka on the two runs' saved states."""
    from repgeom.experiments import compare_runs
    from repgeom.probes.core.pairwise import similarity

    runs = {}
    for masking, logger in (("causal", "wandb"), ("bidirectional", "csv")):
        runs[masking] = tmp_path / masking
        train(compose_train(runs[masking], [
            f"masking={masking}", f"logger={logger}", "trainer.max_steps=10",
            "probe.every_n_steps=5", "probe.n_log_spaced=0",
            "probe.metrics=[default,linear_cka]"]))
    causal = runs["causal"]
    frame = table.read_table(causal)
    vs_final = frame.loc[(frame["metric"] == "linear_cka") & (frame["step_b"] == 10)]
    assert sorted(vs_final["step"].unique()) == [0, 5, 10]
    np.testing.assert_allclose(vs_final.loc[vs_final["step"] == 10, "value"], 1.0, atol=1e-9)
    assert (causal / "probes" / "plots" / "similarity_linear_cka.png").is_file()
    assert (causal / "probes" / "plots" / "vs_final_linear_cka.png").is_file()
    keys = logged_keys(next((causal / "wandb").glob("offline-run-*")))
    assert {"probe/linear_cka/layer_00/layer_03", "probe/linear_cka_vs_final/layer_02"} <= keys
    assert any(k.startswith("probe/plots/similarity_linear_cka") for k in keys)  # image keys

    out = tmp_path / "causal_vs_bidi.png"
    from repgeom.cli import compare_runs as compare_command

    compare_command.main([str(causal), str(runs["bidirectional"]), "--similarity", "linear_cka",
                          "--labels", "causal", "bidirectional", "--batch-size", "256",
                          "--out", str(out)])
    rows = pd.read_csv(out.with_suffix(".csv"))
    assert out.is_file() and rows["run_b"].eq("bidirectional").all() and len(rows) == 4
    # Independent: linear_cka of the two saved state sets, mean over the same batches.
    A, _ = similarity.load_states(causal / "probes" / "states" / "step_10.pt")
    B, _ = similarity.load_states(runs["bidirectional"] / "probes" / "states" / "step_10.pt")
    split = metrics.batch_indices(A[0].shape[0], 256, 0)
    for layer in range(4):
        expected = np.mean([metrics.linear_cka(A[layer][i], B[layer][i]) for i in split])
        got = rows.loc[rows["layer"] == layer, "value"].item()
        assert got == pytest.approx(expected, rel=1e-9)
    same = compare_runs.run_similarity([str(causal), str(causal)], ["a", "b"], "linear_cka",
                                       batch_size=256)
    np.testing.assert_allclose(same["value"], 1.0, atol=1e-9)  # a run against itself


@pytest.mark.slow
def test_the_offline_path_does_not_import_the_training_callback() -> None:
    import subprocess

    code = ("import sys, repgeom.probes.run.runner, repgeom.experiments.compare_runs; "
            "print('repgeom.probes.run.callback' in sys.modules, 'lightning' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == "False"


def test_qk_cosine_concat_reaches_the_table_console_wandb_and_figures(
    tmp_path, capsys, monkeypatch
) -> None:
    """Godey et al.'s Fig. 23 cosine: one row per block beside the per-head rows, equal to the
    heads-concatenated cosine of the captured means, and read by every consumer of the table."""
    from repgeom.probes.report import console, plots, sink

    g = torch.Generator().manual_seed(0)
    B, H, T, D = 3, 2, 8, 4
    hidden = [torch.randn(B, T, H * D, generator=g) for _ in range(3)]
    queries = [torch.randn(B, H, T, D, generator=g) + 0.5 for _ in range(2)]
    keys = [torch.randn(B, H, T, D, generator=g) - 0.2 * i for i in range(2)]
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[0, :3] = False  # e.g. special tokens: left out of the means
    capture = Capture(hidden=hidden, queries=queries, keys=keys, causal=True, valid=valid)
    settings = ProbeSettings(metrics=["qk_alignment", "qk_cosine_concat"], attention=False)
    frame = pd.DataFrame(measure([capture], [capture], settings).rows)
    concat = frame[frame["metric"] == "qk_cosine_concat"].sort_values("layer")
    assert concat["layer"].tolist() == [1, 2] and (concat["head"] == -1).all()
    assert (frame["metric"] == "qk_cosine").sum() == 2 * H
    for (_, row), Q, K in zip(concat.iterrows(), queries, keys, strict=True):
        # independent: token rows with the H heads side by side, numpy means over valid tokens
        q = Q.permute(0, 2, 1, 3).reshape(B, T, H * D)[valid].double().numpy().mean(axis=0)
        k = K.permute(0, 2, 1, 3).reshape(B, T, H * D)[valid].double().numpy().mean(axis=0)
        expected = q @ k / (np.linalg.norm(q) * np.linalg.norm(k))
        assert row["value"] == pytest.approx(expected, abs=1e-12)  # float64 both sides
    frame["step"] = 0
    assert "qk_cosine_concat" in catalogue.console_metrics()
    assert "qk_cosine_concat" in catalogue.wandb_metrics("profile")
    assert catalogue.label("qk_cosine_concat") == "Q\u0304/K\u0304 cosine, heads concatenated"
    assert not catalogue.per_head("qk_cosine_concat") and catalogue.per_head("qk_cosine")
    scalars = sink.wandb_scalars(frame)
    assert scalars["probe/qk_cosine_concat/layer_02"] == pytest.approx(concat["value"].iloc[1])
    assert scalars["probe/qk_cosine_concat/mean"] == pytest.approx(concat["value"].mean())
    assert "probe/qk_cosine_concat/layer_01/head_00" not in scalars
    paths = plots.save_figures(frame, tmp_path, metrics=["qk_cosine_concat"])
    assert [p.name for p in paths] == ["profile_qk_cosine_concat.png"]
    subject = type("Subject", (), {"step": 0, "label": "tiny", "kind": "decoder",
                                   "model": "tiny"})()
    monkeypatch.setenv("COLUMNS", "250")  # wide enough for every column name unbroken
    console.print_tables(frame, [subject])
    printed = capsys.readouterr().out
    assert "qk_cosine_concat" in printed and f"{concat['value'].iloc[0]:.4g}" in printed
