"""Per-token values: each state's local ID against scikit-dimension's pointwise MLE on the same
neighbours; the parquet and the Spearman table of probe.py and of the training callback."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from hydra_configs import compose_job, compose_train

from repgeom import files
from repgeom.metrics.intrinsic_dimension.knn_batches import search_batches
from repgeom.metrics.intrinsic_dimension.mle import local_mle
from repgeom.probes.core import table
from repgeom.probes.core.prediction import tokens
from repgeom.probes.run.runner import probe
from repgeom.train import train

SMALL = ["n_states=192", "settings.max_order=8", "settings.state_batch_size=192",
         "metrics=[default]", "settings.distributions=false", "device=cpu", "plot_metrics=[]",
         "settings.per_token=true"]


def test_local_ids_equal_scikit_dimension_pointwise_mle_on_the_same_neighbours() -> None:
    skdim = pytest.importorskip("skdim")
    g = torch.Generator().manual_seed(0)
    X = torch.randn(900, 5, generator=g) @ torch.randn(5, 40, generator=g)
    X[10] = X[11]  # a duplicate: merged before the search, its own row NaN
    found = search_batches(X, k=20, batch_size=300, seed=1, min_points=21, what="test")
    local = local_mle(found, 20, X.shape[0])
    assert np.isnan(local).sum() == 1 and np.isnan(local[[10, 11]]).sum() == 1
    for distances, rows in zip(found.distances, found.rows, strict=True):
        reference = skdim.id.MLE().fit(
            X[rows].numpy(), precomputed_knn_arrays=(distances[:, :20],
                                                     np.zeros((len(rows), 20), dtype=int)))
        # the same float64 distances, the same formula: equal to rounding
        np.testing.assert_allclose(local[rows], reference.dimension_pw_, rtol=1e-12)
        # their MacKay-Ghahramani mean is the batch's MLE (mle_from_neighbours)
        assert 1 / np.mean(1 / local[rows]) == pytest.approx(reference.dimension_, rel=1e-12)


@pytest.mark.slow
def test_probe_py_writes_the_per_token_parquet_and_the_correlation(trained_run, tmp_path):
    path = trained_run / "checkpoints" / "last.ckpt"
    frame = probe(compose_job(tmp_path, [f"ckpt={path}", *SMALL])).frame
    folder = table.probe_dir(tmp_path)
    files = sorted((folder / tokens.TOKENS_DIR).glob("*.parquet"))
    assert len(files) == 1
    per_token = pd.read_parquet(files[0])
    n_layers = int(frame.loc[frame["layer"] >= 0, "layer"].max()) + 1
    assert len(per_token) == 192 * n_layers
    assert set(per_token["layer"]) == set(range(n_layers))
    # the states' surprisals are the lm_loss row's, their local IDs make the mle_dimension row
    layer0 = per_token.loc[per_token["layer"] == 0]
    rows = frame.set_index(["layer", "metric"])["value"]
    assert layer0["surprisal"].mean() == pytest.approx(rows[(-1, "lm_loss")], rel=1e-5)
    for layer, part in per_token.groupby("layer"):
        ids = part["local_id"].dropna().to_numpy(np.float64)
        assert 1 / np.mean(1 / ids) == pytest.approx(rows[(layer, "mle_dimension")], rel=1e-5)
    # bounded: float32 values and int32 ids, well under 16 bytes a row compressed
    assert files[0].stat().st_size < 16 * len(per_token) + 8192
    table_csv = pd.read_csv(folder / tokens.CSV_NAME)
    assert len(table_csv) == n_layers
    assert (table_csv["n"] > 100).all() and table_csv["rho"].between(-1, 1).all()


@pytest.mark.slow
def test_the_training_callback_writes_them_at_every_probe_step(tmp_path) -> None:
    train(compose_train(tmp_path, ["logger=csv", "probe.settings.per_token=true",
                                   "trainer.max_steps=4", "probe.every_n_steps=2"]))
    folder = table.probe_dir(tmp_path)
    steps = sorted(set(table.read_table(tmp_path)["step"]))
    assert sorted(p.name for p in (folder / tokens.TOKENS_DIR).iterdir()) == [
        f"step_{s}.parquet" for s in steps]
    correlation = pd.read_csv(folder / tokens.CSV_NAME)
    assert sorted(set(correlation["step"])) == steps
    assert not math.isnan(correlation["rho"].iloc[-1])


def test_steps_and_models_accumulate_and_a_step_probed_again_is_replaced(tmp_path) -> None:
    positions = torch.zeros(4, 6, dtype=torch.bool)
    positions[:, 1:4] = True
    windows = torch.arange(24).reshape(4, 6)
    rng = np.random.default_rng(0)

    def states(shift: float) -> tokens.TokenStates:
        return tokens.TokenStates.of(positions, windows, rng.random(12) + shift,
                                     [rng.random(12), None], ["embedding", "block_1"])

    for step in (0, 5):
        for model in ("a", "b"):
            tokens.save_step(tmp_path, step, states(0.0), {"model": model, "revision": None})
    tokens.save_step(tmp_path, 5, states(1.0), {"model": "a", "revision": None})  # again
    table_csv = pd.read_csv(tmp_path / tokens.CSV_NAME)
    assert len(table_csv) == 2 * 2 * 2  # steps x models x layers, the repeat replaced
    assert table_csv["n"].tolist().count(0) == 4  # block_1 has no local IDs: no pairs
    assert len(list((tmp_path / tokens.TOKENS_DIR).glob("*.parquet"))) == 4
    frame = pd.read_parquet(tmp_path / tokens.TOKENS_DIR / "step_5_a.parquet")
    assert frame["surprisal"].min() >= 1.0 and set(frame["token"]) == set(
        windows[positions].tolist())


def test_per_token_local_ids_go_through_the_copies_guard() -> None:
    """A layer whose states are mostly copies gets NaN ID rows (max_copy_share) and NaN local
    IDs alike; below the limit both are read."""
    from repgeom.probes.core import id_entries
    from repgeom.probes.core.measure import ProbeSettings

    g = torch.Generator().manual_seed(0)
    distinct = torch.randn(200, 5, generator=g) @ torch.randn(5, 16, generator=g)
    settings = ProbeSettings(per_token=True, state_batch_size=400, max_order=8, noise_splits=0)
    for n_copies, guarded in ((200, True), (40, False)):  # 50% + 1 copies vs 17%
        X = torch.cat([distinct, distinct[:1].repeat(n_copies, 1)])
        if guarded:
            X = torch.cat([X, distinct[1:2]])  # one more copy: over the 50% limit
        rows = {row[0]: row[1] for row in id_entries._intrinsic_dimension(X, settings)}
        local = id_entries.local_ids(X)
        assert local is not None and len(local) == X.shape[0]
        assert math.isnan(rows["mle_dimension"]) == guarded
        assert np.isnan(local).all() == guarded
        if not guarded:  # the distinct states have their own local IDs
            assert np.isfinite(local[1:200]).mean() > 0.9


def test_the_per_token_files_are_fenced_like_every_worker_write(tmp_path) -> None:
    # The offload worker records a step under files.fenced(lock.check): a worker that lost its
    # run writes nothing more, the per-token parquet and the correlation table included (before,
    # they were renamed with a bare os.replace, outside the fence).
    states = tokens.TokenStates(np.array([0, 0, 1]), np.array([0, 1, 0]), np.array([5, 6, 7]),
                                np.array([1.0, 2.0, 3.0]), [np.array([4.0, 5.0, 6.0])],
                                ["embedding"])

    def lost() -> None:
        raise RuntimeError("the lease names another worker")

    with files.fenced(lost), pytest.raises(RuntimeError, match="another worker"):
        tokens.save_step(tmp_path, 10, states)
    assert not (tmp_path / tokens.CSV_NAME).exists()
    assert not list((tmp_path / tokens.TOKENS_DIR).iterdir())  # no file, no temporary
