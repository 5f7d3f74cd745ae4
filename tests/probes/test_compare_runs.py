"""`python -m repgeom.probes.compare_runs`: two run folders in, one side-by-side PNG out."""

from __future__ import annotations

import math

import pytest

from repgeom.probes import compare_runs
from repgeom.probes.table import append_rows, probe_dir


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
    out = compare_runs.main([str(causal), str(bidirectional), "--metric", "anisotropy",
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
    compare_runs.main([str(causal), str(bidirectional), "--labels", "causal", "bidirectional",
                       "--step", "0", "--out", str(tmp_path / "c.png")])
    assert seen == {"labels": ["causal", "bidirectional"], "metric": "anisotropy", "step": 0}
    # Default labels are the run folders' names; a table file or probes/ folder names its run.
    compare_runs.main([str(causal / "probes" / "probes.csv"), str(bidirectional / "probes"),
                       "--out", str(tmp_path / "d.png")])
    assert seen["labels"] == ["a", "b"] and seen["step"] == "last"


def test_bad_arguments_exit_with_a_message(tmp_path, capsys):
    run = write_run(tmp_path / "a")
    with pytest.raises(SystemExit):
        compare_runs.main([str(run), str(run), "--labels", "only-one"])
    assert "--labels: got 1 labels for 2 runs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        compare_runs.main([str(run), "--step", "late"])
    assert "expected an integer or 'last'" in capsys.readouterr().err


def test_missing_table_and_missing_metric_are_clear(tmp_path):
    run = write_run(tmp_path / "a")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no probe table in .*empty"):
        compare_runs.main([str(run), str(tmp_path / "empty"), "--out", str(tmp_path / "x.png")])
    with pytest.raises(ValueError, match="'twonn' is not in the table; available: anisotropy"):
        compare_runs.main([str(run), "--metric", "twonn", "--out", str(tmp_path / "x.png")])
    assert not (tmp_path / "x.png").exists()
