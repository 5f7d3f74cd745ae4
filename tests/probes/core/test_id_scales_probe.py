"""The scale profile in the probe: its rows, the plateau, the copies guard and the table's note."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from repgeom import metrics
from repgeom.models.capture import Capture
from repgeom.probes.core import catalogue, table
from repgeom.probes.core.measure import ProbeSettings, measure


def _capture(clumped: bool = False, n: int = 3000) -> Capture:
    """Layer 1: a 2-D Gaussian plane in R^16. Layer 0: the same, or (`clumped`) n / 5 of its
    states each repeated 5 times with a jitter of 1e-4 (above float32 rounding, so not exact
    duplicates; far below the plane's spacing, so near-copies): the char embedding's clumps."""
    g = torch.Generator().manual_seed(0)
    plane = torch.randn(1, n, 2, generator=g) @ torch.randn(2, 16, generator=g)
    first = plane
    if clumped:
        first = plane[:, : n // 5].repeat_interleave(5, dim=1)
        first = first + 1e-4 * torch.randn(first.shape, generator=g)
    return Capture(hidden=[first, plane], queries=[], keys=[], attention=[], causal=True)


def _rows(frame: pd.DataFrame, layer: int) -> pd.DataFrame:
    return frame.loc[frame["layer"] == layer].set_index("metric")


def test_id_scales_rows_equal_the_metric_functions_and_find_the_plane() -> None:
    capture = _capture()
    settings = ProbeSettings(metrics=["default", "id_scales"], state_batch_size=1500,
                             attention=False)
    frame = table.rows_to_frame(
        pd.DataFrame(measure([capture], [], settings).rows).assign(step=0))
    rows = _rows(frame, 1)
    X = capture.hidden[1][0]
    decimation = metrics.twonn_decimation(X, seed=settings.seed)
    for j, (dim, scale) in enumerate(zip(decimation.dimension, decimation.scale, strict=True)):
        assert rows.loc[f"twonn_dec{j}", "value"] == pytest.approx(dim, rel=1e-12)
        assert rows.loc[f"twonn_dec{j}_scale", "value"] == pytest.approx(scale, rel=1e-12)
    assert math.isnan(rows.loc["twonn_dec0", "std"])  # one subset: no error of a mean
    gride = metrics.gride(X, batch_size=1500, max_order=64, seed=0)
    for order, scale in zip(gride.orders, gride.scale, strict=True):
        assert rows.loc[f"gride_k{order}_scale", "value"] == pytest.approx(scale, rel=1e-12)
    # A clean plane: the plateau reads 2 (TwoNN and GRIDE's finite-sample bias is a few %; the
    # smallest scales read up to 2.5 on 3000 points of a Gaussian plane, its edges thin).
    assert rows.loc["id_plateau", "value"] == pytest.approx(2.0, rel=0.1)
    assert rows.loc["id_plateau_lo", "value"] < rows.loc["id_plateau_hi", "value"]
    assert "note" not in frame.columns or (frame["note"] == "").all()
    assert catalogue.is_intrinsic_dimension("id_plateau")
    assert not catalogue.is_intrinsic_dimension("gride_k16_scale")
    assert "id_plateau" in catalogue.wandb_metrics("peak")  # phases follow it (PHASE_METRICS)


@pytest.mark.parametrize("convention", ["facco", "llm_microscope"])
def test_copies_above_the_limit_make_every_id_reading_nan_with_the_reason(convention, tmp_path):
    settings = ProbeSettings(metrics=["default", "id_scales"], state_batch_size=1500,
                             attention=False, twonn_convention=convention)
    frame = table.rows_to_frame(
        pd.DataFrame(measure([_capture(clumped=True)], [], settings).rows).assign(step=0))
    guarded, clean = _rows(frame, 0), _rows(frame, 1)
    # Batches of 1500 of 3000 states: a state of a clump of 5 has another of its clump in its
    # batch with probability 1 - (1/2)^4 ~ 0.94
    assert guarded.loc["copy_share", "value"] > 0.85
    # A clean 2-D sample has K tau^d = 64 * 0.005^2 = 0.2% near-copies by chance (measured 0.3%)
    assert clean.loc["copy_share", "value"] < 0.01
    ids = [m for m in guarded.index if catalogue.ID_GUARDED.fullmatch(m)]
    expected = {"mle_dimension", "gride_k16", "twonn_dec0", "id_plateau", "id_plateau_hi",
                "twonn_llm_microscope" if convention == "llm_microscope" else "twonn"}
    assert expected <= set(ids)
    assert guarded.loc[ids, "value"].isna().all()
    assert guarded.loc[ids, "note"].str.startswith("copies: ").all()
    assert "max_copy_share 50%" in guarded.loc["gride_k16", "note"]
    # Not ID readings: kept. The clean layer: untouched, no note.
    assert guarded.loc[["duplicates", "near_duplicate_share", "anisotropy"], "value"].notna().all()
    assert (guarded.loc[["anisotropy", "twonn_dec0_scale"], "note"] == "").all()
    assert clean.loc[[m for m in clean.index if catalogue.ID_GUARDED.fullmatch(m)],
                     "value"].notna().all()
    # The note survives the table on disk (csv and parquet), as a string, empty elsewhere.
    written = table.append_rows(tmp_path, frame)
    for name in ("probes.csv", "probes.parquet"):
        again = table._read_file(tmp_path / name)
        assert (again["note"] == written["note"]).all() and again["note"].notna().all()
    # A higher limit lets the same layer through.
    loose = ProbeSettings(metrics=["default"], state_batch_size=1500, attention=False,
                          max_copy_share=1.0)
    rows = pd.DataFrame(measure([_capture(clumped=True)], [], loose).rows)
    assert rows.loc[(rows["layer"] == 0) & (rows["metric"] == "gride_k16"), "value"].notna().all()


def test_max_copy_share_is_checked() -> None:
    with pytest.raises(ValueError, match="max_copy_share"):
        ProbeSettings(max_copy_share=1.5)


def test_the_note_is_not_a_grouping_column() -> None:
    from repgeom.probes.report import aggregate

    rows = [dict(step=0, layer=layer, metric="twonn", value=value, note=note)
            for layer, value, note in [(1, 2.0, ""), (2, np.nan, "copies: 60%"), (3, 4.0, "")]]
    means = aggregate.layer_means(table.rows_to_frame(rows))
    assert len(means) == 1 and means["value"].item() == pytest.approx(3.0)


def test_every_run_with_the_profile_writes_the_scale_figures_and_phases_follow_the_plateau(
        tmp_path) -> None:
    from repgeom.probes.report import phases, plots

    frames = []
    g = torch.Generator().manual_seed(1)
    # Three steps of a 3-D plane in R^16 under shrinking 16-D noise: the plateau's ID falls.
    for step, noise in [(0, 0.5), (10, 0.05), (20, 0.01)]:
        plane = torch.randn(1, 800, 3, generator=g) @ torch.randn(3, 16, generator=g)
        hidden = [plane + noise * i * torch.randn(1, 800, 16, generator=g) for i in (1, 2)]
        capture = Capture(hidden=hidden, queries=[], keys=[], attention=[], causal=True)
        settings = ProbeSettings(metrics=["id_scales"], state_batch_size=400, max_order=8,
                                 attention=False)
        frames.append(pd.DataFrame(measure([capture], [], settings).rows).assign(step=step))
    frame = table.rows_to_frame(pd.concat(frames))
    names = {p.name for p in plots.save_figures(frame, tmp_path)}
    assert {"id_vs_scale.png", "id_scale_heatmap.png", "vs_step_id_plateau.png"} <= names
    assert not any(n.startswith(("heatmap_twonn_dec", "profile_gride_k8_scale")) for n in names)
    # The training probe lists its figures: the scale figures come with the rows all the same.
    listed = {p.name for p in plots.save_figures(frame, tmp_path / "b", metrics=["anisotropy"])}
    assert {"id_vs_scale.png", "id_scale_heatmap.png"} <= listed
    assert not plots.save_figures(frame, tmp_path / "c", metrics=[])
    # log axes label 1, 2 and 5 x 10^k plainly and no minor tick (matplotlib's own overlapped)
    from matplotlib.ticker import NullFormatter

    for figure, axis in ((plots.id_vs_scale(frame), "xaxis"), (plots.scale_heatmap(frame),
                                                               "yaxis")):
        panels = [ax for ax in figure.axes if ax.get_label() != "<colorbar>"]
        assert all(isinstance(getattr(ax, axis).get_minor_formatter(), NullFormatter)
                   for ax in panels)
    events = phases.find_phases(frame)
    assert "id_plateau" in set(events["metric"])


def test_a_layer_guarded_at_every_step_has_no_peak_in_the_wandb_summary() -> None:
    from repgeom.probes.report import wandb_charts

    rows = [dict(step=step, layer=layer, metric="twonn", value=value)
            for step in (0, 10) for layer, value in ((0, math.nan), (1, 2.0 + step))]
    summary = wandb_charts.summary(table.rows_to_frame(rows))
    assert summary["probe_summary/twonn_peak_step/layer_01"] == 10
    assert "probe_summary/twonn_peak_step/layer_00" not in summary
