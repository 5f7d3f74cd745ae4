"""The tidy probe table: dtypes, append/replace on disk, atomic writes, known-answer reductions."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from repgeom.probes.core import table
from repgeom.probes.core.table import (
    COLUMNS,
    append_rows,
    probe_dir,
    read_table,
    rows_to_frame,
    write_table,
)
from repgeom.probes.report.aggregate import format_summary, head_means, layer_means, summary

STEPS = (0, 10, 100, 1000)
N_LAYER = 4  # blocks; layers 0..4
N_HEAD = 2
ID_PEAK_STEP = 100
TOP_LAYER = 2


def known_rows(steps=STEPS, **extra) -> list[dict]:
    """A table with known answers.

    - twonn: blocks 1..L have value 10 + layer + (20 at ID_PEAK_STEP), so their mean peaks there;
      the embedding (layer 0) is 100 at step 0, which would move the peak to 0 were it averaged.
    - anisotropy: a bell over layers, largest at TOP_LAYER, growing with the step.
    - qk_cosine: per head, head h of layer l is l + h (head mean l + 0.5).
    """
    rows = []
    for step in steps:
        for layer in range(N_LAYER + 1):
            twonn = 100.0 if (layer == 0 and step == 0) else 10.0 + layer
            if layer >= 1 and step == ID_PEAK_STEP:
                twonn += 20.0
            rows.append(dict(step=step, layer=layer, metric="twonn", value=twonn, std=0.5, **extra))
            bell = (1 + step / 1000) * math.exp(-((layer - TOP_LAYER) ** 2))
            rows.append(dict(step=step, layer=layer, metric="anisotropy", value=bell, **extra))
            if layer >= 1:
                for head in range(N_HEAD):
                    rows.append(dict(step=step, layer=layer, head=head, metric="qk_cosine",
                                     value=float(layer + head), **extra))
    return rows


# ---------------------------------------------------------------------------------------------
# rows_to_frame


def test_rows_to_frame_columns_dtypes_and_defaults():
    frame = rows_to_frame(known_rows(model="gpt2", revision="1000"))
    assert list(frame.columns) == [*COLUMNS, "model", "revision"]
    assert frame["step"].dtype == np.int64
    assert frame["layer"].dtype == np.int64
    assert frame["head"].dtype == np.int64
    assert frame["value"].dtype == np.float64
    assert frame["std"].dtype == np.float64
    assert pd.api.types.is_string_dtype(frame["metric"])
    assert pd.api.types.is_string_dtype(frame["revision"])
    whole = frame[frame["metric"] != "qk_cosine"]
    assert (whole["head"] == -1).all()  # rows without `head` in a batch with heads
    assert frame.loc[frame["metric"] == "anisotropy", "std"].isna().all()
    assert (frame.loc[frame["metric"] == "twonn", "std"] == 0.5).all()


def test_rows_to_frame_empty_keeps_the_columns():
    frame = rows_to_frame([])
    assert list(frame.columns) == list(COLUMNS) and frame.empty


def test_rows_to_frame_names_missing_columns():
    with pytest.raises(ValueError, match=r"missing required column\(s\) layer, value"):
        rows_to_frame([{"step": 0, "metric": "anisotropy"}])


def test_rows_to_frame_rejects_fractional_steps():
    with pytest.raises(ValueError, match="'step' must hold integers"):
        rows_to_frame([{"step": 1.5, "layer": 0, "metric": "anisotropy", "value": 0.1}])


# ---------------------------------------------------------------------------------------------
# On disk


def test_append_then_reprobe_a_step_replaces_it(tmp_path):
    folder = probe_dir(tmp_path)
    append_rows(folder, known_rows(steps=(0,)))
    append_rows(folder, known_rows(steps=(10,)))
    n_per_step = len(known_rows(steps=(0,)))
    assert len(read_table(tmp_path)) == 2 * n_per_step

    # A resumed run probes step 10 again, with other numbers: its rows are replaced.
    again = [dict(r, value=-1.0) for r in known_rows(steps=(10,))]
    out = append_rows(folder, again)
    back = read_table(tmp_path)
    assert len(back) == len(out) == 2 * n_per_step
    assert (back.loc[back["step"] == 10, "value"] == -1.0).all()
    assert (back.loc[back["step"] == 0, "value"] != -1.0).all()
    assert not back.duplicated(["step", "layer", "head", "metric"]).any()



def test_a_killed_writes_temporaries_go_at_the_next_write_and_a_live_ones_stay(tmp_path):
    # A kill between a temporary's write and its rename leaves `.probes.parquet.<id>.tmp`; the
    # next write removes it once it is older than any write takes, never a younger one (another
    # process may be writing it now).
    folder = probe_dir(tmp_path)
    append_rows(folder, known_rows(steps=(0,)))
    killed, live = folder / ".probes.parquet.0a1b2c3d.tmp", folder / ".probes.csv.ffff0000.tmp"
    for path in (killed, live):
        path.write_bytes(b"half a table")
    then = time.time() - table.STALE_WRITE_S - 60
    os.utime(killed, (then, then))
    append_rows(folder, known_rows(steps=(10,)))
    assert not killed.exists() and live.exists()
    assert sorted(read_table(tmp_path)["step"].unique()) == [0, 10]

def test_reprobe_replaces_only_the_same_model(tmp_path):
    """probe.py: the same step of two models (or revisions) are different rows."""
    append_rows(tmp_path, known_rows(steps=(0,), model="a"))
    append_rows(tmp_path, known_rows(steps=(0,), model="b"))
    append_rows(tmp_path, [dict(r, value=-1.0) for r in known_rows(steps=(0,), model="b")])
    back = read_table(tmp_path)
    assert back.groupby("model").size().tolist() == [len(known_rows(steps=(0,)))] * 2
    assert (back.loc[back["model"] == "b", "value"] == -1.0).all()
    assert (back.loc[back["model"] == "a", "value"] != -1.0).all()


@pytest.mark.parametrize("failing", ["to_csv", "to_parquet"])
def test_failed_write_leaves_the_previous_table_intact(tmp_path, monkeypatch, failing):
    folder = probe_dir(tmp_path)
    append_rows(folder, known_rows(steps=(0,)))
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert set(before) == {"probes.csv", "probes.parquet"}

    real = getattr(pd.DataFrame, failing)

    def write_half_then_fail(self, path, *args, **kwargs):
        real(self.iloc[: len(self) // 2], path, *args, **kwargs)  # a partial file on disk...
        raise OSError("disk full")  # ...then the writer dies

    monkeypatch.setattr(pd.DataFrame, failing, write_half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        append_rows(folder, known_rows(steps=(10,)))
    after = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert after == before  # same files, same bytes, no temporary file left behind


def test_read_table_finds_the_table_from_any_of_its_paths(tmp_path):
    written = append_rows(probe_dir(tmp_path), known_rows(revision="143000"))
    for path in (
        tmp_path,
        tmp_path / "probes",
        tmp_path / "probes" / "probes.parquet",
        tmp_path / "probes" / "probes.csv",
    ):
        back = read_table(path)
        pd.testing.assert_frame_equal(back, written, check_dtype=True)
    # A revision that looks like a number stays a string through CSV.
    assert read_table(tmp_path / "probes" / "probes.csv")["revision"].iloc[0] == "143000"


def test_read_table_falls_back_to_csv(tmp_path):
    frame = rows_to_frame(known_rows())
    (tmp_path / "probes").mkdir()
    frame.to_csv(tmp_path / "probes" / "probes.csv", index=False)
    pd.testing.assert_frame_equal(read_table(tmp_path), frame)


def test_read_table_without_a_table_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_table(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "probes" / "probes")):
        read_table(tmp_path)


def test_write_table_without_pyarrow_writes_csv_only(tmp_path, monkeypatch):
    monkeypatch.setattr(table, "_has_parquet", lambda: False)
    paths = write_table(rows_to_frame(known_rows()), tmp_path)
    assert [p.name for p in paths] == ["probes.csv"]
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == ["probes.csv"]


# ---------------------------------------------------------------------------------------------
# Reductions


def test_head_means_average_the_heads():
    frame = rows_to_frame(known_rows())
    means = head_means(frame[frame["metric"] == "qk_cosine"])
    assert (means["head"] == -1).all()
    assert len(means) == len(STEPS) * N_LAYER
    np.testing.assert_allclose(means["value"], means["layer"] + 0.5)
    np.testing.assert_allclose(means["std"], 0.5)  # population std of {l, l + 1}


def test_layer_means_leave_out_the_embedding_unless_asked():
    frame = rows_to_frame(known_rows())
    twonn = layer_means(frame).query("metric == 'twonn'").set_index("step")["value"]
    # blocks 1..4: mean of 10 + layer is 12.5, plus 20 at the peak step.
    assert twonn.to_dict() == {0: 12.5, 10: 12.5, 100: 32.5, 1000: 12.5}
    with_embedding = layer_means(frame, include_embedding=True).query("metric == 'twonn'")
    assert with_embedding.set_index("step")["value"][0] == pytest.approx((100 + 50) / 5)
    assert (with_embedding["n_layers"] == N_LAYER + 1).all()
    qk = layer_means(frame).query("metric == 'qk_cosine'")
    np.testing.assert_allclose(qk["value"], 3.0)  # mean over layers 1..4 of (layer + 0.5)


def test_summary_finds_the_known_answers():
    result = summary(rows_to_frame(known_rows()))
    assert result["final_step"] == STEPS[-1]
    assert result["id_peak_step"] == ID_PEAK_STEP
    assert result["id_peak_value"] == pytest.approx(32.5)
    assert result["most_anisotropic_layer"] == TOP_LAYER
    assert result["most_anisotropic_value"] == pytest.approx(2.0)
    assert result["final_anisotropy_layers"] == list(range(N_LAYER + 1))
    expected = [2.0 * math.exp(-((layer - TOP_LAYER) ** 2)) for layer in range(N_LAYER + 1)]
    np.testing.assert_allclose(result["final_anisotropy_profile"], expected)
    text = format_summary(result)
    assert f"peaked at step {ID_PEAK_STEP}: 32.50" in text
    assert f"most anisotropic layer: {TOP_LAYER}" in text


def test_summary_with_metrics_missing_gives_none():
    rows = [r for r in known_rows() if r["metric"] == "qk_cosine"]
    result = summary(rows_to_frame(rows))
    assert result["final_step"] == STEPS[-1]
    for key in ("id_peak_step", "id_peak_value", "final_anisotropy_profile",
                "most_anisotropic_layer"):
        assert result[key] is None
    assert "not measured" in format_summary(result)
    assert summary(rows_to_frame([]))["final_step"] is None


def test_summary_refuses_a_table_of_several_models():
    frame = rows_to_frame(known_rows(model="a") + known_rows(model="b"))
    with pytest.raises(ValueError, match="column 'model' has \\['a', 'b'\\]"):
        summary(frame)
