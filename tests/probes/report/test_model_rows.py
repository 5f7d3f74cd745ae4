"""The LM loss rows (``lm_loss``, ``bpc``) sit at layer -1 in the table, the number the phase
tables give the layer mean: every reader of layers tells them apart by their metric
(`table.model_rows`), so they are never a layer nor the layer mean."""

from __future__ import annotations

import pandas as pd
import pytest

from repgeom.probes.core import table
from repgeom.probes.report import aggregate, phases, wandb_charts
from repgeom.probes.run.runner import _layer_names

STEPS = [0, 10, 20, 30, 40]


def _frame() -> pd.DataFrame:
    """twonn on blocks 1..2 rising then falling; the loss falling all along, at layer -1."""
    rows = [dict(step=s, layer=layer, metric="twonn", value=v + layer, std=0.1)
            for s, v in zip(STEPS, [2.0, 5.0, 9.0, 6.0, 3.0], strict=True) for layer in (1, 2)]
    rows += [dict(step=s, layer=table.MODEL_LAYER, layer_name=table.MODEL_LAYER_NAME,
                  metric=metric, value=v, std=0.01)
             for s, v in zip(STEPS, [5.0, 4.0, 3.0, 2.0, 1.0], strict=True)
             for metric in table.MODEL_METRICS]
    return table.rows_to_frame(rows)


def test_the_phases_never_take_the_loss_rows_for_a_layer_or_the_mean() -> None:
    found = phases.find_phases(_frame(), metrics=["twonn", "lm_loss", "bpc"])
    assert set(found["metric"]) == {"twonn"}
    at_mean = found.loc[found["layer"] == phases.MEAN_LAYER]
    assert len(at_mean) and (at_mean["layer_name"] == phases.MEAN_NAME).all()
    by_step = phases.phase_by_step(_frame(), metrics=["lm_loss"])
    assert by_step.empty


def test_layer_means_and_blocks_leave_the_loss_rows_out() -> None:
    frame = _frame()
    for embedding in (False, True):
        means = aggregate.layer_means(frame, include_embedding=embedding)
        assert set(means["metric"]) == {"twonn"}
        assert (aggregate.blocks(frame, include_embedding=embedding)["layer"] >= 1).all()


def test_probe_info_layers_and_wandb_keys_name_the_loss_as_the_model() -> None:
    frame = _frame().assign(model="m")
    assert _layer_names(frame) == {"m": {"1": "block_1", "2": "block_2"}}
    summary = wandb_charts.summary(frame)
    assert summary["probe_summary/final_lm_loss/model"] == pytest.approx(1.0)
    assert "probe_summary/twonn_peak/layer_01" in summary
    assert not any("layer_-1" in key for key in summary)


def test_model_rows_reads_the_metric_not_the_layer_number() -> None:
    frame = table.rows_to_frame([
        dict(step=0, layer=-1, metric="lm_loss", value=1.0),
        dict(step=0, layer=1, metric="anisotropy", value=0.5),
    ])
    assert table.model_rows(frame).tolist() == [True, False]
    assert table.layer_rows(frame)["metric"].tolist() == ["anisotropy"]
    assert not table.model_rows(table.rows_to_frame([])).any()
