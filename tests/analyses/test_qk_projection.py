"""The common SVD projection of queries and keys across training (papers/003 Figs. 11-12)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra_configs import CONF_DIR, compose_train

from repgeom.analyses import probe_extras
from repgeom.analyses.qk_projection import common_svd, project, qk_trajectory, svd_basis
from repgeom.cli import qk_projection
from repgeom.probes.core import table
from repgeom.probes.run.job import probe_job
from repgeom.train import train


def planted(D: int = 6, c: float = 0.5, shift: float = 2.0, steps: int = 3):
    """Queries P + s v and keys P - s v at step s = 1..steps, with P = [cI; -cI]: P's rows sum
    to zero and P^T P = 2c^2 I, so the union's Gram matrix is isotropic plus a term along v, and
    its first right singular vector is exactly v / |v|."""
    P = np.concatenate([c * np.eye(D), -c * np.eye(D)])
    v = np.zeros(D)
    v[[1, 4]] = shift / np.sqrt(2)  # |v| = shift, along no axis
    return [P + s * v for s in range(1, steps + 1)], [P - s * v for s in range(1, steps + 1)], v


@pytest.mark.parametrize("basis", ["union", "query", "key"])
def test_planted_shift_is_the_separation_along_component_1(basis) -> None:
    queries, keys, v = planted()
    out = common_svd(queries, keys, basis=basis)
    np.testing.assert_allclose(np.abs(out.basis[:, 0]), np.abs(v) / np.linalg.norm(v),
                               atol=1e-12)
    # sign convention: the largest entry positive; v's two entries tie, the first wins -> +v
    assert out.basis[1, 0] > 0
    steps = np.arange(1, 4)
    np.testing.assert_allclose(out.query_means[:, 0], 2.0 * steps, atol=1e-12)
    np.testing.assert_allclose(out.key_means[:, 0], -2.0 * steps, atol=1e-12)
    np.testing.assert_allclose(out.query_means[:, 1], 0.0, atol=1e-12)
    np.testing.assert_allclose(out.key_means[:, 1], 0.0, atol=1e-12)
    # Projection is linear: the mean of the projected rows is the projected mean.
    np.testing.assert_allclose([q.mean(0) for q in out.queries], out.query_means, atol=1e-12)


@pytest.mark.parametrize("basis", ["union", "key"])
def test_common_svd_is_numpy_svd_of_the_stacked_rows(basis) -> None:
    rng = np.random.default_rng(0)
    scale = np.array([5.0, 3.0, 1.0, 0.5, 0.2])
    queries = [rng.normal(size=(40, 5)) * scale + s for s in range(3)]
    keys = [rng.normal(size=(40, 5)) * scale[::-1] - s for s in range(3)]
    out = common_svd(queries, keys, basis=basis)
    stacked = np.concatenate(queries + keys if basis == "union" else keys)
    _, s, Vt = np.linalg.svd(stacked, full_matrices=False)  # uncentred, as the paper's SVD
    np.testing.assert_allclose(out.singular_values, s[:2], rtol=1e-10)
    np.testing.assert_allclose(out.energy, s[:2] ** 2 / (s**2).sum(), rtol=1e-10)
    signs = np.sign((out.basis * Vt[:2].T).sum(0))  # numpy's signs are arbitrary
    for mine, rows in ((out.queries, queries), (out.keys, keys)):
        for got, x in zip(mine, rows, strict=True):
            np.testing.assert_allclose(got, x @ Vt[:2].T * signs, rtol=1e-9, atol=1e-9)


def test_svd_basis_and_common_svd_reject_bad_input() -> None:
    with pytest.raises(ValueError, match="square"):
        svd_basis(np.ones((2, 3)))
    with pytest.raises(ValueError, match="n_components must be between 1 and D=2"):
        svd_basis(np.eye(2), 3)
    x = np.ones((4, 3))
    with pytest.raises(ValueError, match="basis must be one of"):
        common_svd([x], [x], basis="values")
    with pytest.raises(ValueError, match="one array per step each, got 2 and 1"):
        common_svd([x, x], [x])
    with pytest.raises(ValueError, match="same width D"):
        common_svd([x], [np.ones((4, 2))])
    with pytest.raises(ValueError, match=r"keys\[0\] contains NaN"):
        common_svd([x], [np.full((4, 3), np.nan)])


# ---------------------------------------------------------------------------------------------
# A run of train.py


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny run (2 blocks x 2 heads, D = 16) with checkpoints at steps 10 and 20 and the
    training probe's qk_cosine logged at both."""
    run_dir = tmp_path_factory.mktemp("run")
    overrides = ["logger=csv", "probe.every_n_steps=10", "probe.n_log_spaced=0",
                 "probe.metrics=[qk_alignment]", "callbacks=trajectory",
                 "callbacks.checkpoint_every.every_n_train_steps=10"]
    train(compose_train(run_dir, overrides))
    return run_dir


@pytest.mark.slow
def test_trajectory_checkpoints_keep_the_weights_not_the_optimizer(run) -> None:
    """callbacks=trajectory: step checkpoints without AdamW's moments; last.ckpt complete."""
    step = torch.load(run / "checkpoints" / "step10.ckpt", map_location="cpu", weights_only=True)
    last = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert "optimizer_states" not in step and "optimizer_states" in last
    assert "Enwik8DataModule" in step and "hyper_parameters" in step  # what probe.py reads
    # AdamW keeps two moments per weight: a full checkpoint is about three times the weights.
    size = {p.name: p.stat().st_size for p in (run / "checkpoints").glob("*.ckpt")}
    assert size["step10.ckpt"] < 0.5 * size["last.ckpt"]


def test_run_trajectory_reads_the_probes_queries_and_keys(run) -> None:
    trajectory = qk_trajectory(run, points=None)
    assert trajectory.steps == [10, 20]  # last.ckpt is step 20 too: one entry per step
    assert sorted(trajectory.heads) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    points, means, basis = project(trajectory)
    # The cosine of the mean query and key in full dimension is the training probe's
    # qk_cosine at the same step, layer and head: same windows, same capture, same indexing.
    # Both reduce the same float32 rows in float64, hence 1e-6.
    logged = table.read_table(run)
    logged = logged[logged["metric"] == "qk_cosine"][["step", "layer", "head", "value"]]
    merged = means[means["kind"] == "query"].merge(logged, on=["step", "layer", "head"])
    assert len(merged) == 8
    np.testing.assert_allclose(merged["cosine"], merged["value"], rtol=1e-6, atol=1e-6)
    # The projection is numpy's SVD of every token of both steps, queries and keys stacked.
    head = trajectory.heads[(2, 1)]
    stacked = np.concatenate(head.queries + head.keys)
    assert stacked.shape == (4 * trajectory.n_tokens, 16)
    _, s, Vt = np.linalg.svd(stacked, full_matrices=False)
    rows = basis[(basis["layer"] == 2) & (basis["head"] == 1)]
    np.testing.assert_allclose(rows["singular_value"], s[:2], rtol=1e-8)
    mine = points[(points["layer"] == 2) & (points["head"] == 1)]
    expected = np.concatenate([x @ Vt[:2].T for x in head.queries + head.keys])
    got = mine[["component_1", "component_2"]].to_numpy()
    signs = np.sign((got * expected).sum(0))
    np.testing.assert_allclose(got, expected * signs, rtol=1e-8, atol=1e-8)


@pytest.mark.slow
def test_command_line_writes_tables_and_one_figure_per_head(run, tmp_path) -> None:
    tables = qk_projection.main([f"run={run}", f"out={tmp_path}", "layer=2", "head=0,1",
                                 "points=50", "basis=key"])
    points = pd.read_csv(tmp_path / "qk_projection.csv")
    assert list(points.columns) == ["step", "layer", "head", "kind", "token", "component_1",
                                    "component_2"]
    # 2 steps x 2 heads x 2 kinds x 50 tokens, the same tokens at every step and kind
    assert len(points) == 400 and set(points["layer"]) == {2}
    assert points.groupby(["step", "head", "kind"])["token"].apply(tuple).nunique() == 1
    means = pd.read_csv(tmp_path / "qk_projection_means.csv")
    assert len(means) == 2 * 2 * 2
    pd.testing.assert_frame_equal(means, tables["means"], check_dtype=False)
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        "qk_projection_layer02_head00.png", "qk_projection_layer02_head01.png"]


def test_bad_runs_and_indices(run, tmp_path) -> None:
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        qk_trajectory(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no such folder"):
        qk_trajectory(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"layer=\[3\] is out of range: .* 2 blocks, so layer "
                                         r"must be in 1..2"):
        qk_trajectory(run, layers=[1, 3])
    with pytest.raises(ValueError, match=r"head=\[2\] is out of range: .* 2 heads, so head must "
                                         r"be in 0..1"):
        qk_trajectory(run, heads=[2])
    with pytest.raises(ValueError, match="points must be a positive integer"):
        qk_trajectory(run, points=0)
    with pytest.raises(ValueError, match="'a,b' is not a comma-separated list of integers"):
        qk_projection.main([f"run={run}", f"out={tmp_path}", "layer=a,b"])


def compose_probe(tmp_path: Path, overrides: list[str]):
    """The real `conf/probe.yaml`, writing to `tmp_path`."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("probe", overrides=[f"output_dir={tmp_path}", *overrides])


@pytest.mark.slow
def test_probe_py_draws_it_on_request(run, tmp_path) -> None:
    cfg = compose_probe(tmp_path / "probe", [
        f"run={run}", "qk_projection=true", "device=cpu", "metrics=[qk_alignment]",
        "plot_metrics=[]", "settings.distributions=false"])
    result = probe_extras.probe(probe_job(cfg))  # probe.py's function: the pipeline and its extras
    drawn = sorted(p.name for p in result.plots)
    assert drawn == [f"qk_projection_layer{layer:02d}_head{head:02d}.png"
                     for layer in (1, 2) for head in (0, 1)]
    # The same numbers as the command line's (same windows: the training probe's).
    means = pd.read_csv(tmp_path / "probe" / "qk_projection" / "qk_projection_means.csv")
    expected = qk_projection.main([f"run={run}", f"out={tmp_path / 'cli'}", "device=cpu",
                                   "layer=2"])["means"]
    pd.testing.assert_frame_equal(means[means["layer"] == 2].reset_index(drop=True), expected,
                                  check_dtype=False)
    # Off by default, and refused where there is no trajectory.
    assert compose_probe(tmp_path, [f"run={run}"]).qk_projection is False
    with pytest.raises(ValueError, match="qk_projection=true draws a trajectory and needs run="):
        probe_job(compose_probe(tmp_path, ["hf=gpt2", "qk_projection=true"]))
