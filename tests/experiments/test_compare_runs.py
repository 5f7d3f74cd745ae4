"""`repgeom-compare-runs` (`repgeom.cli.compare_runs` over `repgeom.experiments.compare_runs`):
two run folders in, one side-by-side PNG out."""

from __future__ import annotations

import math

import pytest

from repgeom.cli import compare_runs as compare_command
from repgeom.experiments import compare_runs
from repgeom.probes.core.table import append_rows, probe_dir


def write_run(run_dir, *, steps=(0, 100), top_layer=2, n_layer=4):
    """A run folder whose table holds an anisotropy bell peaking at `top_layer`."""
    for step in steps:
        append_rows(probe_dir(run_dir), [
            dict(step=step, layer=layer, metric="anisotropy",
                 value=math.exp(-((layer - top_layer) ** 2)) * (1 + step / 100))
            for layer in range(n_layer + 1)
        ])
    return run_dir


def test_main_writes_a_png_from_two_runs(tmp_path, capsys):
    causal = write_run(tmp_path / "causal", top_layer=3)
    bidirectional = write_run(tmp_path / "bidirectional", top_layer=1)
    out = compare_command.main([str(causal), str(bidirectional), "--metric", "anisotropy",
                                "--out", str(tmp_path / "figs" / "compare.png")])
    assert out == tmp_path / "figs" / "compare.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5_000
    assert f"wrote {out}" in capsys.readouterr().out


def test_labels_and_step_reach_the_figure(tmp_path, monkeypatch):
    causal = write_run(tmp_path / "a")
    bidirectional = write_run(tmp_path / "b", steps=(0, 50))
    seen = {}
    real = compare_runs.profiles_side_by_side

    def spy(frames, metric, *, step):
        seen.update(labels=list(frames), metric=metric, step=step)
        return real(frames, metric, step=step)

    monkeypatch.setattr(compare_runs, "profiles_side_by_side", spy)
    compare_command.main([str(causal), str(bidirectional), "--labels", "causal", "bidirectional",
                          "--step", "0", "--out", str(tmp_path / "c.png")])
    assert seen == {"labels": ["causal", "bidirectional"], "metric": "anisotropy", "step": 0}
    # Default labels are the run folders' names; a table file or probes/ folder names its run.
    compare_command.main([str(causal / "probes" / "probes.csv"), str(bidirectional / "probes"),
                          "--out", str(tmp_path / "d.png")])
    assert seen["labels"] == ["a", "b"] and seen["step"] == "last"


def test_bad_arguments_fail_with_a_message(tmp_path):
    run = write_run(tmp_path / "a")
    with pytest.raises(ValueError, match="labels: got 1 labels for 2 runs"):
        compare_command.main([str(run), str(run), "--labels", "only-one"])
    with pytest.raises(ValueError, match="expected an integer or 'last'"):
        compare_command.main([str(run), "--step", "late"])
    with pytest.raises(SystemExit, match="unknown option --colour"):
        compare_command.main([str(run), "--colour", "red"])


def test_missing_table_and_missing_metric_are_clear(tmp_path):
    run = write_run(tmp_path / "a")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no probe table in .*empty"):
        compare_command.main([str(run), str(tmp_path / "empty"), "--out", str(tmp_path / "x.png")])
    with pytest.raises(ValueError, match="'twonn' is not in the table; available: anisotropy"):
        compare_command.main([str(run), "--metric", "twonn", "--out", str(tmp_path / "x.png")])
    assert not (tmp_path / "x.png").exists()


T_975_2 = 4.302652729911275
"""t_{0.975, 2}: the 95% two-sided Student-t quantile for 3 runs (tables: 4.303)."""


def write_seed(run_dir, values, *, masking=None, final_norm=None, step=100):
    """A run probed at steps 0 and `step`; at `step` block i holds values[i - 1]."""
    rows = []
    for at in (0, step):
        for layer, value in enumerate([0.1, *values], start=0):
            rows.append(dict(step=at, layer=layer, metric="anisotropy",
                             value=value if at else 0.05, std=0.01))
        if final_norm is not None:
            rows.append(dict(step=at, layer=len(values) + 1, layer_name="final_norm",
                             metric="anisotropy", value=final_norm))
    append_rows(probe_dir(run_dir), rows)
    if masking is not None:
        (run_dir / ".hydra").mkdir(parents=True)
        (run_dir / ".hydra" / "config.yaml").write_text(f"masking:\n  name: {masking}\nseed: 0\n")
    return run_dir


def _band_ends(ax):
    """The lower and upper edge of the first shaded band, as {x: (low, high)}."""
    vertices = ax.collections[0].get_paths()[0].vertices
    ends = {}
    for x, y in vertices:
        low, high = ends.get(round(x, 9), (math.inf, -math.inf))
        ends[round(x, 9)] = (min(low, y), max(high, y))
    return ends


def test_runs_sharing_a_label_draw_their_mean_and_t_interval(tmp_path, monkeypatch):
    # Block 2 holds 0.30, 0.40, 0.35 in the three causal runs: mean 0.35, s = 0.05.
    causal = [write_seed(tmp_path / f"c{k}", [0.2, v, 0.25], final_norm=0.9)
              for k, v in enumerate((0.30, 0.40, 0.35))]
    bidirectional = [write_seed(tmp_path / f"b{k}", [0.2, 0.2, 0.2]) for k in range(3)]
    figures = []
    real = compare_runs.profile_bands

    def spy(groups, metric, *, step):
        figures.append(real(groups, metric, step=step))
        return figures[-1]

    monkeypatch.setattr(compare_runs, "profile_bands", spy)
    out = compare_command.main([*map(str, causal), *map(str, bidirectional),
                                "--labels", *["causal"] * 3, *["bidirectional"] * 3,
                                "--out", str(tmp_path / "bands.png")])
    assert out.stat().st_size > 5_000
    (fig,) = figures
    left, right = fig.axes[:2]
    (mean,) = [line for line in left.get_lines() if line.get_gid() == "mean"]
    assert list(mean.get_xdata()) == [0, 1, 2, 3]  # the final norm is not on the block line
    assert mean.get_ydata()[2] == pytest.approx(0.35)
    half = T_975_2 * 0.05 / math.sqrt(3)
    assert _band_ends(left)[2.0] == pytest.approx((0.35 - half, 0.35 + half))
    assert _band_ends(left)[1.0] == pytest.approx((0.2, 0.2))  # identical runs: no width
    assert "3 seeds" in left.get_title() and right.get_title().startswith("bidirectional")


def test_group_by_masking_reads_each_runs_config(tmp_path, monkeypatch):
    runs = [write_seed(tmp_path / f"{m}-seed{k}", [0.2, 0.3 + 0.1 * k, 0.2], masking=m)
            for m in ("causal", "bidirectional") for k in range(2)]
    seen = {}
    real = compare_runs.profile_bands

    def spy(groups, metric, *, step):
        seen.update({label: len(tables) for label, tables in groups.items()})
        return real(groups, metric, step=step)

    monkeypatch.setattr(compare_runs, "profile_bands", spy)
    compare_command.main([*map(str, runs), "--group-by", "masking",
                          "--out", str(tmp_path / "g.png")])
    assert seen == {"causal": 2, "bidirectional": 2}
    with pytest.raises(FileNotFoundError, match="has no .*config.yaml"):
        compare_command.main([str(write_run(tmp_path / "plain")), "--group-by", "masking",
                              "--out", str(tmp_path / "h.png")])


def test_runs_of_one_label_must_share_their_steps(tmp_path):
    a = write_seed(tmp_path / "a", [0.2, 0.3, 0.2])
    b = write_seed(tmp_path / "b", [0.2, 0.3, 0.2], step=50)
    with pytest.raises(ValueError, match="probed at different steps"):
        compare_command.main([str(a), str(b), "--labels", "x", "x",
                              "--out", str(tmp_path / "x.png")])
