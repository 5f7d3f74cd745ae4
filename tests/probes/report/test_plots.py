"""Plots of the probe table: each returns a Figure holding what it should, at the known places."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from repgeom.experiments import figures
from repgeom.probes.core.table import rows_to_frame
from repgeom.probes.report import plots
from repgeom.probes.report.plots.phase_markers import MARKERS

STEPS = (0, 1, 2, 4, 8, 100, 200, 300)
N_LAYER = 3  # blocks; layers 0..3
N_HEAD = 4
ID_PEAK_STEP = 8


def make_table(steps=STEPS, *, shift: float = 0.0, **extra) -> pd.DataFrame:
    """twonn peaks (layer mean) at ID_PEAK_STEP; anisotropy is a bell at layer 2; per-head metrics
    `qk_cosine` and `attention_entropy` are head + layer (+ step / 1000)."""
    rows = []
    for step in steps:
        for layer in range(N_LAYER + 1):
            peak = 10.0 if step == ID_PEAK_STEP else 0.0
            for metric, value in (
                ("twonn", 5.0 + layer + peak + shift),
                ("gride_k4", 4.0 + layer),
                ("anisotropy", math.exp(-((layer - 2) ** 2)) * (1 + step / 300) + shift),
                ("mean_cosine", 0.1 * layer),
            ):
                rows.append(dict(step=step, layer=layer, metric=metric, value=value, std=0.1,
                                 **extra))
            if layer == 0:
                continue
            for head in range(N_HEAD):
                for metric in ("qk_cosine", "attention_entropy"):
                    rows.append(dict(step=step, layer=layer, head=head, metric=metric,
                                     value=head - 1.5 + layer + step / 1000, **extra))
    return rows_to_frame(rows)


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return make_table()


def data_lines(ax):
    """The data lines: not the maximum's marker nor the phases' turn markers."""
    return [line for line in ax.get_lines() if line.get_gid() not in ("max", *MARKERS)]


def test_metric_labels():
    assert plots.metric_label("twonn") == "Intrinsic dimension (TwoNN)"
    assert plots.metric_label("gride_k32") == "Intrinsic dimension (GRIDE, k=32)"
    assert plots.metric_label("some_new_metric") == "Some new metric"
    assert plots.is_id_metric("gride_k2") and not plots.is_id_metric("anisotropy")


def test_layer_profile_one_line_per_step_with_a_colour_bar(frame):
    fig = plots.layer_profile(frame, "anisotropy")
    assert isinstance(fig, Figure)
    ax, bar = fig.axes  # the plot and its colour bar
    lines = ax.get_lines()
    assert len(lines) == len(STEPS)
    last = lines[-1]
    np.testing.assert_array_equal(last.get_xdata(), range(N_LAYER + 1))
    assert np.argmax(last.get_ydata()) == 2
    assert bar.get_ylabel() == "training step"
    assert "Anisotropy" in ax.get_title()


def test_layer_profile_by_revision_has_a_legend():
    frames = [make_table(steps=(i,), revision=f"step{i}") for i in (1000, 8000, 143000)]
    fig = plots.layer_profile(pd.concat(frames), "anisotropy", by="revision")
    (ax,) = fig.axes
    assert len(ax.get_lines()) == 3
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["step1000", "step8000",
                                                                    "step143000"]


def test_layer_profile_averages_heads(frame):
    ax = plots.layer_profile(frame, "qk_cosine").axes[0]
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), np.arange(1, N_LAYER + 1))


def test_missing_metric_names_it_and_lists_the_available(frame):
    with pytest.raises(ValueError, match=r"'nope' is not in the table; available: anisotropy, "
                                         r"attention_entropy, gride_k4, mean_cosine, qk_cosine"):
        plots.layer_profile(frame, "nope")
    for draw in (plots.metric_vs_step, plots.heatmap, plots.per_layer_vs_step,
                 plots.per_head_vs_step):
        with pytest.raises(ValueError, match="'nope' is not in the table"):
            draw(frame, "nope")


def test_metric_vs_step_marks_the_maximum(frame):
    fig = plots.metric_vs_step(frame, "twonn")
    (ax,) = fig.axes
    (marker,) = [line for line in ax.get_lines() if line.get_gid() == "max"]
    assert marker.get_xdata()[0] == ID_PEAK_STEP
    assert marker.get_ydata()[0] == pytest.approx(5.0 + 2.0 + 10.0)  # mean over blocks 1..3
    (line,) = data_lines(ax)
    np.testing.assert_array_equal(line.get_xdata(), STEPS)
    assert f"at step {ID_PEAK_STEP}" in ax.texts[0].get_text()
    assert ax.get_xscale() == "symlog"  # steps span 1..300


def test_metric_vs_step_by_run_one_line_and_one_marker_per_run():
    both = pd.concat([make_table(run="causal"), make_table(run="bidirectional", shift=1.0)])
    ax = plots.metric_vs_step(both, "anisotropy", by="run").axes[0]
    assert len(data_lines(ax)) == 2
    markers = [line for line in ax.get_lines() if line.get_gid() == "max"]
    assert [m.get_xdata()[0] for m in markers] == [STEPS[-1], STEPS[-1]]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["causal", "bidirectional"]
    with pytest.raises(ValueError, match="several runs share a step; pass by= one of \\['run'\\]"):
        plots.metric_vs_step(both, "anisotropy")


def test_heatmap_is_layers_by_steps(frame):
    fig = plots.heatmap(frame, "anisotropy")
    ax, bar = fig.axes
    array = ax.images[0].get_array()
    assert array.shape == (N_LAYER + 1, len(STEPS))
    np.testing.assert_allclose(array[:, -1], np.exp(-((np.arange(N_LAYER + 1) - 2.0) ** 2)) * 2)
    assert bar.get_ylabel() == "Anisotropy"
    per_head = plots.heatmap(frame, "qk_cosine").axes[0].images[0].get_array()
    assert per_head.shape == (N_LAYER, len(STEPS))  # per-head metric: blocks only, heads averaged


def test_heatmap_refuses_two_runs_mixed():
    both = pd.concat([make_table(model="a"), make_table(model="b")])
    with pytest.raises(ValueError, match="several runs at the same step \\('model'\\)"):
        plots.heatmap(both, "anisotropy")


def test_per_layer_vs_step_one_line_per_layer(frame):
    ax = plots.per_layer_vs_step(frame, "attention_entropy").axes[0]
    lines = ax.get_lines()
    assert len(lines) == N_LAYER
    # head mean of (head - 1.5 + layer + step / 1000) is layer + step / 1000
    np.testing.assert_allclose(lines[0].get_ydata(), 1 + np.array(STEPS) / 1000)
    assert "mean over heads" in ax.get_title()


def test_per_head_vs_step_one_panel_per_layer_one_line_per_head(frame):
    fig = plots.per_head_vs_step(frame, "qk_cosine", ncols=2)
    panels = [ax for ax in fig.axes if ax.get_title().startswith("layer")]
    assert len(panels) == N_LAYER  # the fourth cell of the 2 x 2 grid is removed
    assert len(fig.axes) == N_LAYER
    for ax in panels:
        assert len(ax.get_lines()) == N_HEAD
    assert len(fig.legends[0].get_texts()) == N_HEAD


def test_profiles_side_by_side_shares_y_and_draws_the_last_step():
    frames = {"causal": make_table(), "bidirectional": make_table(steps=(0, 5), shift=0.5)}
    fig = figures.profiles_side_by_side(frames, "anisotropy")
    left, right = fig.axes
    assert left.get_shared_y_axes().joined(left, right)
    assert left.get_title() == f"causal (step {STEPS[-1]})"
    assert right.get_title() == "bidirectional (step 5)"
    assert len(left.get_lines()) == len(right.get_lines()) == 1
    np.testing.assert_allclose(
        right.get_lines()[0].get_ydata(),
        np.exp(-((np.arange(N_LAYER + 1) - 2.0) ** 2)) * (1 + 5 / 300) + 0.5,
    )
    at_zero = figures.profiles_side_by_side(frames, "anisotropy", step=0)
    assert [ax.get_title() for ax in at_zero.axes] == ["causal (step 0)", "bidirectional (step 0)"]
    with pytest.raises(ValueError, match="run 'bidirectional': no step 8 .* steps: \\[0, 5\\]"):
        figures.profiles_side_by_side(frames, "anisotropy", step=8)
    with pytest.raises(ValueError, match="run 'causal': metric 'nope' is not in the table"):
        figures.profiles_side_by_side(frames, "nope")


def test_compare_texts():
    pooled = np.linspace(0.2, 0.9, N_LAYER + 1)
    matrix = np.random.default_rng(0).uniform(-1, 1, size=(3, 5))
    fig = plots.compare_texts(pooled, matrix, ["a", "b", "c", "d", "e", "f", "g", "h"])
    left, right, bar = fig.axes
    np.testing.assert_allclose(left.get_lines()[0].get_ydata(), pooled)
    assert right.images[0].get_array().shape == (3, 5)
    assert [t.get_text() for t in right.get_xticklabels()] == ["d", "e", "f", "g", "h"]
    square = plots.compare_texts(pooled, matrix[:, :3], ["x", "y", "z"])
    assert [t.get_text() for t in square.axes[1].get_yticklabels()] == ["x", "y", "z"]
    with pytest.raises(ValueError, match="tokens: expected 8"):
        plots.compare_texts(pooled, matrix, ["a"])
    with pytest.raises(ValueError, match="token_matrix: expected a 2-D array"):
        plots.compare_texts(pooled, np.zeros(3))


def test_save_figures_writes_the_standard_set(frame, tmp_path):
    paths = plots.save_figures(frame, tmp_path / "plots")
    names = sorted(p.name for p in paths)
    assert names == sorted([
        "profile_anisotropy.png", "profile_twonn.png", "profile_gride_k4.png",
        "profile_mean_cosine.png",
        "vs_step_twonn.png", "vs_step_anisotropy.png",
        *(f"heatmap_{m}.png" for m in ("twonn", "gride_k4", "anisotropy", "mean_cosine",
                                       "qk_cosine", "attention_entropy")),
        "per_layer_attention_entropy.png", "per_head_qk_cosine.png",
    ])
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5_000


def test_revisions_get_one_line_per_layer_against_step(tmp_path):
    # Pythia-style revisions of one model: each step is a revision.
    steps = (100, 200, 300)
    frame = rows_to_frame(pd.concat(
        [make_table(steps=(s,), model="m", revision=f"step{s}") for s in steps]
    ))
    names = {p.name for p in plots.save_figures(frame, tmp_path, metrics=["anisotropy", "twonn",
                                                                          "mean_cosine"])}
    assert {"vs_step_anisotropy.png", "per_layer_anisotropy.png", "vs_step_twonn.png",
            "per_layer_twonn.png"} <= names
    assert "per_layer_mean_cosine.png" not in names  # no vs_step figure: its heatmap suffices
    lines = plots.per_layer_vs_step(frame, "anisotropy").axes[0].get_lines()
    assert len(lines) == N_LAYER + 1  # embedding and blocks 1..3
    for layer, line in enumerate(lines):
        assert list(line.get_xdata()) == list(steps)
        expected = [math.exp(-((layer - 2) ** 2)) * (1 + s / 300) for s in steps]
        np.testing.assert_allclose(line.get_ydata(), expected)


def test_save_figures_one_step_gives_every_profile_and_nothing_over_steps(tmp_path):
    one = make_table(steps=(0,))
    names = sorted(p.name for p in plots.save_figures(one, tmp_path))
    assert names == sorted(f"profile_{m}.png" for m in one["metric"].unique())


def test_save_figures_subset_and_absent_metrics(frame, tmp_path):
    paths = plots.save_figures(frame, tmp_path, metrics=["qk_cosine", "kurtosis"])
    assert sorted(p.name for p in paths) == ["heatmap_qk_cosine.png", "per_head_qk_cosine.png"]


def test_save_figures_skips_a_figure_it_cannot_draw_with_a_warning(tmp_path):
    only_embedding = rows_to_frame(
        [dict(step=s, layer=0, metric="twonn", value=1.0 + s) for s in (0, 1)]
    )
    with pytest.warns(UserWarning, match="skipped vs_step_twonn.png: .*no values in layers 1..L"):
        paths = plots.save_figures(only_embedding, tmp_path)
    assert sorted(p.name for p in paths) == ["heatmap_twonn.png", "profile_twonn.png"]
