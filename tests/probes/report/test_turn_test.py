"""The turn test's parts against known answers: the critical value where its law is known in
closed form, and the standard errors read from a table."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from repgeom.probes.report import turn_test


def test_the_critical_value_of_two_points_is_the_one_sided_t_point() -> None:
    # Two points: the largest fall is the one difference (x0 − x1) / √(s0² + s1²). With known
    # noise that is N(0, 1); with s² ~ χ²_df / df at each point, √((s0² + s1²) / 2) is
    # √(χ²_2df / 2df), so the ratio is Student's t on 2·df degrees of freedom. The Monte Carlo
    # draws 20,000 curves: its 95% point is off by about 1% (tolerance 3%).
    assert turn_test.critical(2, 1e9) == pytest.approx(stats.norm.ppf(0.95), rel=0.03)
    for df in (1, 3, 10):
        assert turn_test.critical(2, df) == pytest.approx(stats.t.ppf(0.95, 2 * df), rel=0.03)


def test_the_critical_value_grows_with_the_trajectory_and_shrinks_with_the_noise_known() -> None:
    # More steps, more chances of a false fall: a higher bar; above the Šidák point of the
    # adjacent falls alone (K − 1 of them) and below Bonferroni over all K(K − 1)/2 pairs.
    values = [turn_test.critical(k, 30) for k in (2, 5, 16, 50)]
    assert values == sorted(values)
    k = 16
    sidak = stats.norm.ppf(1 - (1 - (1 - 0.05) ** (1 / (k - 1))))
    bonferroni = stats.t.ppf(1 - 0.05 / (k * (k - 1) / 2), 60)
    assert sidak < turn_test.critical(k, 1e9) < bonferroni
    assert turn_test.critical(16, 1) > turn_test.critical(16, 15) > turn_test.critical(16, 1e9)
    assert turn_test.critical(16, 0.5) == math.inf and turn_test.critical(16, np.nan) == math.inf
    assert turn_test.critical(1, 5) == 0.0
    # Seeded: the same number on every call (and cached).
    turn_test.critical.cache_clear()
    first = turn_test.critical(7, 4)
    turn_test.critical.cache_clear()
    assert turn_test.critical(7, 4) == first


def test_standard_errors_from_the_noise_columns_or_the_batches() -> None:
    frame = pd.DataFrame({
        "std": [0.3, 0.3, 0.3, np.nan, 0.0, 0.3],
        "n_batches": [2, 16, np.nan, 2, 2, 1],
        "se": [np.nan, 0.05, np.nan, np.nan, np.nan, np.nan],
        "se_df": [np.nan, 15, np.nan, np.nan, np.nan, np.nan],
    })
    se, df = turn_test.standard_errors(frame)
    # std is the population std over n batches: se = std / √(n − 1) on n − 1 degrees of
    # freedom; a missing n_batches reads as the default protocol's 2; the se column wins where
    # it is set; no std, a std of 0 or one batch: unknown.
    assert se.iloc[0] == pytest.approx(0.3) and df.iloc[0] == 1
    assert se.iloc[1] == pytest.approx(0.05) and df.iloc[1] == 15
    assert se.iloc[2] == pytest.approx(0.3) and df.iloc[2] == 1
    assert se.iloc[3:].isna().all() and df.iloc[3:].isna().all()
    # A table written before the noise columns existed: read as 2 batches.
    old = pd.DataFrame({"std": [0.2]})
    se, df = turn_test.standard_errors(old)
    assert se.iloc[0] == pytest.approx(0.2) and df.iloc[0] == 1


def test_several_seeds_pool_the_batch_noise_and_add_their_own_disagreement() -> None:
    base = np.array([0.0, 1.0, 2.0, 3.0, 2.0, 1.0])
    se = np.full((6, 3), 0.1)
    df = np.full((6, 3), 4.0)
    # Seeds that differ by a constant offset (and 0.001 of wiggle): the offsets cancel
    # (paired), so the noise is the pooled batch noise, √(Σ se²) / 3, on Welch-Satterthwaite's
    # 3 · 4 = 12 degrees of freedom, capped by the seeds' residual's 2 (3 − 1) = 4 (a window of
    # two steps at the ends).
    rng = np.random.default_rng(0)
    offset = base[:, None] + np.array([0.0, 5.0, -2.0]) + rng.normal(0, 1e-3, (6, 3))
    test = turn_test.curve_test(offset, se, df)
    assert test.se[0] == pytest.approx(math.sqrt(3 * 0.01) / 3)
    assert test.df == pytest.approx(4)
    assert test.beats(0, 3) and not test.beats(3, 0)
    # Seeds whose curves differ in shape: the residual of the step x seed layout, computed here
    # cell by cell, its variance per step (scaled by K / ((K − 1)(S − 1)) = 6 / 10) averaged over
    # the step and its neighbours, is the larger noise.
    wiggly = offset + rng.normal(0, 1.0, offset.shape)
    residual = [[wiggly[t, s] - wiggly[t].mean() - wiggly[:, s].mean() + wiggly.mean()
                 for s in range(3)] for t in range(6)]
    step_var = [sum(r**2 for r in row) * 6 / 10 for row in residual]
    window = [np.mean(step_var[max(t - 1, 0):t + 2]) for t in range(6)]
    test = turn_test.curve_test(wiggly, se, df)
    assert test.se == pytest.approx(np.sqrt(np.array(window) / 3))
    assert (test.se > math.sqrt(3 * 0.01) / 3).all()
    # The same mean change, but one seed against it: the seed interval (95%, t on 2 df) covers 0,
    # so no change is decided whatever the z.
    split = np.array([[0.0, 0.0, 0.0], [3.0, 3.0, -3.0]])
    assert not turn_test.curve_test(split, se[:2], df[:2]).beats(0, 1)
    # Seeds equal to the last bit decide nothing.
    same = np.repeat(base[:, None], 3, axis=1)
    assert not turn_test.curve_test(same, se, df).beats(0, 3)


def test_the_pooled_critical_value_of_two_points_is_the_t_point_on_the_pooled_df() -> None:
    # One variance estimate for every point (the seeds' pooled residual): the one difference
    # over √2 s, s² ~ χ²_df / df, is Student's t on df (not 2·df) degrees of freedom; a higher bar
    # than independent estimates of the same df at any length. Monte Carlo error about 1%.
    for df in (2, 5, 30):
        assert turn_test.critical(2, df, pooled=True) == pytest.approx(stats.t.ppf(0.95, df),
                                                                       rel=0.03)
        assert turn_test.critical(16, df, pooled=True) > turn_test.critical(16, df)


def test_three_seeds_of_two_batch_tables_let_the_seeds_residual_decide() -> None:
    # 3 seeds of 16 steps, each point's se from 2 batches (1 df, drawn as the 2-batch tables
    # give it: |b1 − b2| / 2 with batch sd 1). Before issue 49 the curve's df was the smallest of
    # the batch noise's (Welch's, about 1-3 here) and the residual's: c(16, ~1) is about 30 and a
    # rise then fall of 5 batch sds was never called. Now the seeds' residual, step by step over
    # windows of 3 steps, carries the test on 2 (3 − 1) = 4 df, the batch se a floor under each
    # point's.
    rng = np.random.default_rng(49)
    t = np.arange(16.0)
    mu = np.where(t <= 6, 5 * t / 6, 5 * (1 - (t - 6) / 9))
    batches = mu[:, None, None] + rng.standard_normal((16, 3, 2))
    v = batches.mean(axis=2)
    se = np.abs(batches[..., 0] - batches[..., 1]) / 2
    df = np.ones_like(se)
    test = turn_test.curve_test(v, se, df)
    assert test.df == 4 and not test.pooled
    _, seed_df = turn_test._seed_noise(v)
    assert seed_df == 4
    assert test.threshold == pytest.approx(turn_test.critical(16, 4))
    batch = np.sqrt((se**2).sum(axis=1)) / 3
    assert test.se == pytest.approx(np.fmax(batch, turn_test._seed_noise(v)[0]))
    peak = int(np.argmax(test.mean))
    assert test.beats(0, peak) and test.beats(15, peak)  # the rise, and the fall (swapped)


def test_the_seeds_variance_follows_a_disagreement_that_grows_along_the_curve() -> None:
    # Seeds that agree for 8 steps, then part (sd 3 each step): the residual pooled over the
    # whole curve (before the review of issue 49) gave every step the same se, half the late
    # steps'; step by step the late se is about the late spread and the early one small.
    rng = np.random.default_rng(3)
    wiggle = rng.normal(0, 3.0, (16, 5)) * (np.arange(16) >= 8)[:, None]
    v = wiggle + rng.normal(0, 0.1, (16, 5))
    seed_se, seed_df = turn_test._seed_noise(v)
    assert seed_df == 8
    assert seed_se[12] == pytest.approx(3 / math.sqrt(5), rel=0.5)
    assert seed_se[2] < 0.2 * seed_se[12]
