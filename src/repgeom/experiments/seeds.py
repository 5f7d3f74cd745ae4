"""Statistics over seeds: means and 95% t-intervals, per step and layer and for differences.

A claim about training ("the intrinsic dimension rises, then falls") is read off several runs that
differ only in their seed. This module holds the arithmetic, free of files and figures:

* `t_interval`: the mean over ``n`` seeds and its 95% Student-t interval,
  ``mean ± t_{0.975, n-1} · s / √n`` with ``s`` the sample standard deviation (``ddof=1``);
  for one seed there is no interval (its ends are NaN).
* `welch_interval`: the same for the difference of the means of two independent groups of seeds
  (a causal and a bidirectional model), with Welch's standard error and degrees of freedom.
* `per_seed` / `grid` / `aggregate`: one table per seed, stacked; a (x, seed) grid of one metric;
  the per-(step, layer, metric) mean and interval over seeds.

The verdicts' tests of significance (the seed as the unit, intersection-union tests, the
correction of a data-chosen peak, Holm) are in `repgeom.experiments.statistics`. The probe's
batch-noise arithmetic lives in `repgeom.probes.report.noise` (the phases of a single trajectory
use it); this module re-exports its names, and the report prints the batch noise as information
only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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
