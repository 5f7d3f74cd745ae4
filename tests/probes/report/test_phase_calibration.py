"""The phase finder's false-turn rate and power on synthetic probe tables (issue 37), the fast
version of benchmarks/bench_phase_calibration.py (its module doc says how the tables are drawn).

300 trajectories per cell: with a true rate of 5% the share seen is above 7.5% with chance
about 2%, so the bound below is the issue's 5% plus that sampling margin; the rates measured at
1,000 draws are in benchmarks/README.md ("Phase calibration"), all well under 5%."""

from __future__ import annotations

import importlib.util

import numpy as np
import pandas as pd
import pytest
from hydra_configs import ROOT

from repgeom.probes.report import phases

_spec = importlib.util.spec_from_file_location(
    "bench_phase_calibration", ROOT / "benchmarks" / "bench_phase_calibration.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

DRAWS = 300
MARGIN = 0.075
"""5% plus the sampling margin of 300 draws (module doc)."""


@pytest.mark.parametrize("protocol", ["default", "2-batch"])
@pytest.mark.parametrize("n_seeds", [1, 3])
def test_null_curves_get_a_false_turn_in_at_most_five_percent(protocol, n_seeds) -> None:
    rng = np.random.default_rng(37 + n_seeds)
    for name in bench.NULL_CURVES:
        per_layer, mean = bench.turn_shares(
            bench.draw_tables(name, protocol, n_seeds, DRAWS, rng), DRAWS)
        assert per_layer <= MARGIN and mean <= MARGIN, (name, per_layer, mean)


@pytest.mark.parametrize("n_seeds", [1, 3])
def test_a_true_rise_then_fall_of_five_batch_stds_is_found(n_seeds) -> None:
    # Power at the default protocol: measured 97.5% (1 seed) and 99.8% (3 seeds) per layer at
    # 1,000 draws; 80% is the floor.
    rng = np.random.default_rng(5)
    per_layer, mean = bench.turn_shares(
        bench.draw_tables("rise_fall_5", "default", n_seeds, DRAWS, rng), DRAWS)
    assert per_layer >= 0.8 and mean >= 0.8


@pytest.mark.parametrize("n_seeds", [3, 5])
def test_null_curves_under_correlated_or_growing_noise_stay_at_five_percent(n_seeds) -> None:
    # 2-batch tables, where the seeds' residual carries the test (issue 49): each batch's error
    # an AR(1) along the steps (correlation 0.9: the same probe states at every step), or a
    # batch sd that triples along the curve (an estimator's noise growing with the dimension),
    # which a residual pooled over the curve underestimates at the top (issue 49 measured 5.2% /
    # 6.7% at 5 seeds without the batch floor); the seeds' variance step by step and the batch
    # se's floor both guard it.
    rng = np.random.default_rng(49 + n_seeds)
    for name in bench.NULL_CURVES:
        for noise in ({"rho": 0.9}, {"growth": 2.0}):
            per_layer, mean = bench.turn_shares(
                bench.draw_tables(name, "2-batch", n_seeds, DRAWS, rng, **noise), DRAWS)
            assert per_layer <= MARGIN and mean <= MARGIN, (name, noise, per_layer, mean)


def test_three_seeds_of_two_batch_tables_find_a_rise_then_fall_of_four_batch_stds() -> None:
    # Issue 49's floor: 80% of layer means at h = 4. Measured 99% (and 78% per layer) at 200
    # draws with the seeds' variance step by step (4 df at 3 seeds); 0% before issue 49 (the
    # batch noise's 1-3 df decided).
    rng = np.random.default_rng(4)
    per_layer, mean = bench.turn_shares(
        bench.draw_tables("rise_fall_4", "2-batch", 3, DRAWS, rng), DRAWS)
    assert mean >= 0.8 and per_layer >= 0.6


@pytest.mark.parametrize("shape", ["late", "ramp"])
def test_seeds_that_part_late_in_training_give_no_more_false_turns(shape) -> None:
    # Issue 49's review: seeds whose own wiggles (sd 2 batch sds) start only at the middle step,
    # or grow along the curve. One residual variance pooled over the whole curve gave false
    # turns in 8-13% of curves at 5 seeds; the variance taken step by step (over windows of 3)
    # reads at most 3.3% at 600 draws (benchmarks/README.md). Bound: 5% plus the margin of 300
    # draws (module doc).
    rng = np.random.default_rng(490)
    per_layer, mean = bench.turn_shares(
        bench.draw_tables("rise_flat", "2-batch", 5, DRAWS, rng, 2.0, wiggles=shape), DRAWS)
    assert per_layer <= MARGIN and mean <= MARGIN, (per_layer, mean)


def test_the_fast_path_makes_find_phases_decisions() -> None:
    """The benchmark follows curves from arrays; `find_phases` on the same tables agrees."""
    rng = np.random.default_rng(1)
    for name, n_seeds, protocol in (("rise_fall_4", 1, "default"), ("rise_fall_3", 3, "default"),
                                    ("rise_fall_3", 3, "2-batch")):
        tables = bench.draw_tables(name, protocol, n_seeds, 12, rng)
        fast = bench.fast_turns(tables, 12)
        events = phases.find_phases(tables, metrics=["twonn"])
        turned = events.loc[events["event"] == phases.TO_COMPRESSION]
        slow = np.zeros_like(fast)
        for row in turned[["run", "layer"]].drop_duplicates().itertuples():
            column = bench.N_BLOCKS if row.layer == phases.MEAN_LAYER else row.layer - 1
            slow[int(row.run), column] = True
        assert (fast == slow).all()
        assert 0 < fast.sum() < fast.size  # both answers occur: the comparison can fail
    assert isinstance(tables[0], pd.DataFrame)
