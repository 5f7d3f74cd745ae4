"""Statistics over seeds: means, 95% t-intervals, and effects that must beat the noise.

A claim about training ("the intrinsic dimension rises, then falls") is read off several runs that
differ only in their seed. This module holds the arithmetic, free of files and figures:

* `t_interval`: the mean over ``n`` seeds and its 95% Student-t interval,
  ``mean ± t_{0.975, n-1} · s / √n`` with ``s`` the sample standard deviation (``ddof=1``);
  for one seed there is no interval (its ends are NaN).
* `welch_interval`: the same for the difference of the means of two independent groups of seeds
  (a causal and a bidirectional model), with Welch's standard error and degrees of freedom.
* `per_seed` / `grid` / `aggregate`: one table per seed, stacked; a (x, seed) grid of one metric;
  the per-(step, layer, metric) mean and interval over seeds.
* `Effect`, `change` and `rise_then_fall`: a derived quantity per seed (a difference, a peak's
  height) with its interval and its noise, and the verdict "it is there" decided with a
  tolerance.

Noise: the rule and its arithmetic live in `repgeom.probes.report.noise` (one copy, also used by the
phases of a single trajectory); this module re-exports its names.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from repgeom.probes.report.noise import (  # noqa: F401 - re-exported: the report's public names
    LEVEL,
    SEED,
    Effect,
    Interval,
    change,
    check_steps,
    effect,
    grid,
    per_seed,
    quadrature,
    rms,
    t_interval,
)

# ---------------------------------------------------------------------------------------------
# Intervals


def welch_interval(
    a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, *, level: float = LEVEL
) -> Interval:
    """``mean(a) − mean(b)`` with Welch's t-interval (two independent groups, unequal variances).

    Standard error ``√(s_a²/n_a + s_b²/n_b)``; degrees of freedom by Welch–Satterthwaite
    (``n_a + n_b − 2`` when both variances are 0). NaN ends when a group has fewer than 2 values.

    Examples
    --------
    >>> welch_interval([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]).mean
    0.0
    """
    x = np.asarray(a, dtype=float).ravel()
    y = np.asarray(b, dtype=float).ravel()
    x, y = x[np.isfinite(x)], y[np.isfinite(y)]
    if x.size == 0 or y.size == 0:
        raise ValueError("a, b: need at least one finite value in each group")
    mean = float(x.mean() - y.mean())
    if x.size < 2 or y.size < 2:
        return Interval(mean, math.nan, math.nan, int(min(x.size, y.size)))
    va, vb = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    se = math.sqrt(va + vb)
    if se == 0:
        df = x.size + y.size - 2
    else:
        df = (va + vb) ** 2 / (va**2 / (x.size - 1) + vb**2 / (y.size - 1))
    half = float(stats.t.ppf(0.5 + level / 2, df) * se)
    return Interval(mean, mean - half, mean + half, int(min(x.size, y.size)))


# ---------------------------------------------------------------------------------------------
# Tables of several seeds


def aggregate(tables: Sequence[pd.DataFrame], metric: str, *, level: float = LEVEL) -> pd.DataFrame:
    """Per (step, layer): the mean over seeds of `metric` and its t-interval.

    Returns
    -------
    DataFrame
        Columns ``step, layer, layer_name, value`` (mean over seeds), ``low, high`` (the
        interval; NaN for one seed), ``n_seeds``, ``std`` (root mean square over seeds of the
        batch std, NaN where the table has none). Every layer is kept, the final norm's too.
    """
    stacked = per_seed(tables, metric)
    rows = []
    for (step, layer, name), group in stacked.groupby(["step", "layer", "layer_name"], sort=True):
        ci = t_interval(group["value"].to_numpy(), level=level)
        std = rms(group["std"]) if group["std"].notna().any() else np.nan
        rows.append(dict(step=step, layer=layer, layer_name=name, value=ci.mean, low=ci.low,
                         high=ci.high, n_seeds=ci.n, std=std))
    return pd.DataFrame(rows)


def layer_mean_bands(
    tables: Sequence[pd.DataFrame], metric: str, *, level: float = LEVEL
) -> pd.DataFrame:
    """Per step: the mean over seeds of the layer mean (blocks 1..L) and its t-interval.

    Returns
    -------
    DataFrame
        Columns ``step, value, low, high, n_seeds, std`` (std: root mean square over seeds of
        the layer mean's batch std, see `grid`).
    """
    values, stds = grid(per_seed(tables, metric), layer_mean=True)
    rows = []
    for step in values.index:
        ci = t_interval(values.loc[step].to_numpy(), level=level)
        rows.append(dict(step=int(step), value=ci.mean, low=ci.low, high=ci.high, n_seeds=ci.n,
                         std=rms(stds.loc[step])))
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# Effects and verdicts


def difference_effect(
    name: str,
    a: Sequence[float] | np.ndarray,
    a_stds: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    b_stds: Sequence[float] | np.ndarray,
    *,
    level: float = LEVEL,
) -> Effect:
    """``mean(a) − mean(b)`` for two independent groups of seeds, with Welch's interval.

    Its batch noise combines the two groups' root mean square batch stds in quadrature. Per
    seed, the i-th seeds of the two groups are compared (``a_i − b_i`` against their combined
    batch std), up to the shorter group.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    a_stds, b_stds = np.nan_to_num(np.asarray(a_stds, float)), np.nan_to_num(np.asarray(b_stds,
                                                                                         float))
    n = min(a.size, b.size)
    pair_noise = quadrature(a_stds[:n], b_stds[:n])
    return Effect(
        name,
        welch_interval(a, b, level=level),
        float(quadrature(rms(a_stds), rms(b_stds))),
        tuple(bool(d > s) for d, s in zip(a[:n] - b[:n], pair_noise, strict=True)),
    )


@dataclass(frozen=True)
class RiseThenFall:
    """The verdict on "rises, then falls" for a curve measured in several seeds.

    The peak is the argmax of the mean curve over seeds; `above_start` and `above_end` are the
    per-seed differences ``v(peak) − v(first)`` and ``v(peak) − v(last)`` with their noise.
    """

    x: tuple
    mean: tuple[Interval, ...]
    peak: int
    """Position (0-based) of the mean curve's maximum."""
    above_start: Effect
    above_end: Effect
    seeds_holding: int
    """Seeds whose own curve peaks strictly inside and above its own first and last points by
    more than their batch noise."""
    n_seeds: int

    @property
    def interior(self) -> bool:
        return 0 < self.peak < len(self.x) - 1

    @property
    def agrees(self) -> bool:
        """Peak strictly inside, and above both ends by more than the noise (see `Effect`)."""
        return self.interior and self.above_start.holds and self.above_end.holds


def rise_then_fall(
    values: pd.DataFrame, stds: pd.DataFrame, *, level: float = LEVEL
) -> RiseThenFall:
    """Does the curve rise to an interior maximum and fall again, by more than the noise?

    Parameters
    ----------
    values, stds : DataFrame
        Index: the x axis (steps or layers), sorted; one column per seed (as `grid` returns).

    Raises
    ------
    ValueError
        With fewer than 3 points, or when the two frames differ in shape.
    """
    if len(values) < 3:
        raise ValueError(f"values: need at least 3 points for a rise and a fall, got {len(values)}")
    if values.shape != stds.shape:
        raise ValueError(f"values, stds: shapes differ, {values.shape} and {stds.shape}")
    v, s = values.to_numpy(dtype=float), np.nan_to_num(stds.to_numpy(dtype=float))
    curve = [t_interval(row, level=level) for row in v]
    peak = int(np.argmax([c.mean for c in curve]))
    above_start = change("peak − start", v, s, 0, peak, level=level)
    above_end = change("peak − end", v, s, len(v) - 1, peak, level=level)
    holding = 0
    for k in range(v.shape[1]):
        own = int(np.argmax(v[:, k]))
        if (0 < own < len(v) - 1
                and v[own, k] - v[0, k] > quadrature(s[own, k], s[0, k])
                and v[own, k] - v[-1, k] > quadrature(s[own, k], s[-1, k])):
            holding += 1
    return RiseThenFall(tuple(values.index), tuple(curve), peak, above_start, above_end, holding,
                        int(v.shape[1]))
