"""The W&B tables, charts and summaries built from a tidy probe table (known answers)."""

import numpy as np
import pandas as pd
import pytest

from repgeom.probes.report import wandb_charts


def _frame(with_names: bool = False) -> pd.DataFrame:
    # twonn on layers 0..2 at steps 0, 10, 20: layer 1 peaks at step 10, layer 2 ties at 10/20.
    twonn = {0: [1.0, 2.0, 3.0], 1: [2.0, 9.0, 4.0], 2: [1.0, 5.0, 5.0]}
    rows = [
        {"step": s, "layer": layer, "metric": "twonn", "value": v}
        for layer, values in twonn.items()
        for s, v in zip((0, 10, 20), values, strict=True)
    ]
    rows += [  # anisotropy, final profile at step 20
        {"step": s, "layer": layer, "metric": "anisotropy", "value": 0.1 * layer + s / 100}
        for s in (0, 10, 20)
        for layer in range(3)
    ]
    rows += [  # a per-head metric: two heads on blocks 1 and 2
        {"step": s, "layer": layer, "head": h, "metric": "qk_cosine", "value": h + layer}
        for s in (0, 10)
        for layer in (1, 2)
        for h in (0, 1)
    ]
    frame = pd.DataFrame(rows)
    frame["head"] = frame["head"].fillna(-1).astype(int)
    frame["std"] = np.nan
    if with_names:
        frame["layer_name"] = frame["layer"].map({0: "embedding", 1: "block_1", 2: "final_norm"})
    return frame


@pytest.mark.parametrize("with_names", [False, True])
def test_layer_values_average_heads_and_name_layers(with_names: bool) -> None:
    values = wandb_charts.layer_values(_frame(with_names), "qk_cosine")
    # heads 0 and 1 of layer l hold l and l + 1: their mean is l + 0.5
    assert values["value"].tolist() == [1.5, 2.5, 1.5, 2.5]
    assert values["step"].tolist() == [0, 0, 10, 10]
    # Tables without the column get the block names from `table.rows_to_frame`.
    expected = ["block_1", "final_norm"] if with_names else ["block_1", "block_2"]
    assert values["layer_name"].tolist() == expected * 2
    assert wandb_charts.layer_values(_frame(), "absent").empty


def test_summary_gives_each_layers_peak_and_the_final_profile() -> None:
    out = wandb_charts.summary(_frame())
    assert out["probe_summary/twonn_peak_step/layer_00"] == 20
    assert out["probe_summary/twonn_peak_step/layer_01"] == 10
    assert out["probe_summary/twonn_peak/layer_01"] == 9.0
    assert out["probe_summary/twonn_peak_step/layer_02"] == 10  # a tie: the earliest step
    assert [out[f"probe_summary/final_anisotropy/layer_{i:02d}"] for i in range(3)] == (
        pytest.approx([0.2, 0.3, 0.4])
    )
    assert not any("gride" in k for k in out)  # absent metric: no keys


def test_summary_definitions_pick_exact_per_layer_keys() -> None:
    keys = ["probe/twonn/layer_01", "probe/twonn/mean", "probe/anisotropy/layer_00",
            "probe/qk_cosine/layer_01/head_00", "probe/gride_k16/layer_03",
            "probe/step"]  # fmt: skip
    assert wandb_charts.summary_definitions(keys) == {
        "probe/twonn/layer_01": "max",
        "probe/anisotropy/layer_00": "last",
        "probe/gride_k16/layer_03": "max",
    }


def test_charts_hold_one_line_per_step_and_one_cell_per_layer_and_step() -> None:
    frame = _frame()
    out = wandb_charts.charts(frame)
    assert set(out) == {
        "probe/tables/profile_anisotropy", "probe/charts/profile_anisotropy",
        "probe/tables/profile_twonn", "probe/charts/profile_twonn",
        "probe/tables/profile_qk_cosine", "probe/charts/profile_qk_cosine",
        "probe/tables/layer_step_twonn", "probe/charts/layer_step_twonn",
        "probe/tables/layer_step_anisotropy", "probe/charts/layer_step_anisotropy",
    }  # fmt: skip
    lines = out["probe/charts/profile_twonn"].table
    assert lines.columns == ["step", "lineKey", "lineVal"]
    by_line = {}
    for layer, key, value in lines.data:
        by_line.setdefault(key, []).append((layer, value))
    assert by_line["step 10"] == [(0, 2.0), (1, 9.0), (2, 5.0)]
    heat = out["probe/charts/layer_step_anisotropy"].table
    assert len(heat.data) == 9  # 3 layers x 3 steps
    # labels sort as text in W&B's matrix chart: zero-padded steps keep numeric order
    assert sorted({row[1] for row in heat.data}) == ["step 00", "step 10", "step 20"]
    tidy = out["probe/tables/layer_step_twonn"]
    assert tidy.columns == ["layer", "layer_name", "step", "value"]
    assert [row[3] for row in tidy.data if row[0] == 1] == [2.0, 9.0, 4.0]
