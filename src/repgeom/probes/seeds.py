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

Noise. Two things make a number move that are not the effect: the probe's own sampling (the
table's ``std``: the spread over batches of 4096 states, Razzhigaev et al. 2023 §2.2) and the seed.
The noise of an effect is the larger of

(a) its batch noise: per seed, the batch std of the quantity, combined in quadrature over the
    points it is made of (``σ(a − b) = √(σ_a² + σ_b²)``, as for independent batches), and over
    seeds by the root mean square; the batch std of a *layer mean* is taken as the root mean
    square of the per-layer stds. That is an overestimate, on purpose: whatever the correlation
    between layers, the std of a mean of L estimates is at most the mean of their stds, which is
    at most their root mean square, so the check errs on the side of "not shown". Where the table
    holds no std (attention metrics), the batch noise is 0 and the seed spread alone counts;
(b) the seed-to-seed spread: the half-width of the 95% interval over seeds.

An effect *holds* when its mean exceeds both, i.e. when the interval excludes 0 and the mean is
above the batch noise. In one seed it holds when that seed's value exceeds its own batch noise.
With a single seed there is no interval and the batch noise alone decides; with a single seed
and no batch std, nothing does, and the effect does not hold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from repgeom.probes.table import FINAL_NORM

LEVEL = 0.95
"""Coverage of every interval in the report."""
SEED = "seed"
"""Column that numbers the seeds (0..n-1, in the order the tables were given) in stacked frames."""


# ---------------------------------------------------------------------------------------------
# Intervals


@dataclass(frozen=True)
class Interval:
    """A mean over seeds and its confidence interval; ``low``/``high`` are NaN for one seed."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        """Half the interval's width; NaN when there is no interval."""
        return (self.high - self.low) / 2

    def format(self, digits: int = 3) -> str:
        """``0.420 [0.310, 0.530]``, or ``0.420 (1 seed, no interval)``."""
        if not np.isfinite(self.half_width):
            return f"{self.mean:.{digits}f} ({self.n} seed, no interval)"
        return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"

    def __str__(self) -> str:
        return self.format()


def t_interval(values: Sequence[float] | np.ndarray, *, level: float = LEVEL) -> Interval:
    """The mean of `values` (one per seed) and its Student-t confidence interval.

    ``mean ± t_{(1+level)/2, n-1} · s / √n``, where ``s`` is the sample standard deviation
    (``ddof=1``) of the ``n`` finite values: the interval for the mean of a normal population with
    unknown variance, which is what a handful of seeds gives.

    Parameters
    ----------
    values : array-like of float, shape (n,)
        One number per seed; NaNs are left out.
    level : float
        Coverage, in (0, 1).

    Returns
    -------
    Interval
        With NaN ends when fewer than 2 values are finite.

    Raises
    ------
    ValueError
        If no value is finite, or `level` is outside (0, 1).

    Examples
    --------
    >>> t_interval([1.0, 2.0, 3.0]).format(2)  # t_{0.975, 2} = 4.303, s = 1
    '2.00 [-0.48, 4.48]'
    """
    if not 0 < level < 1:
        raise ValueError(f"level: expected a number in (0, 1), got {level}")
    arr = np.asarray(values, dtype=float).ravel()
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        raise ValueError("values: need at least one finite value")
    mean = float(arr.mean())
    if arr.size < 2:
        return Interval(mean, math.nan, math.nan, 1)
    half = float(stats.t.ppf(0.5 + level / 2, arr.size - 1) * arr.std(ddof=1) / math.sqrt(arr.size))
    return Interval(mean, mean - half, mean + half, int(arr.size))


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


def rms(values: Sequence[float] | np.ndarray) -> float:
    """Root mean square of the finite values; 0 when none is finite (no noise known)."""
    arr = np.asarray(values, dtype=float).ravel()
    arr = arr[np.isfinite(arr)]
    return float(np.sqrt(np.mean(arr**2))) if arr.size else 0.0


def quadrature(*stds: float | np.ndarray) -> np.ndarray:
    """``√(Σ σ_i²)`` elementwise, NaN counted as 0: the batch std of a sum or difference."""
    return np.sqrt(sum(np.nan_to_num(np.asarray(s, dtype=float)) ** 2 for s in stds))


# ---------------------------------------------------------------------------------------------
# Tables of several seeds


def check_steps(tables: Mapping[str, Sequence[pd.DataFrame]], names=None) -> None:
    """Raise unless every seed of a group was probed at the same steps (the same schedule).

    Parameters
    ----------
    tables : dict of group -> list of DataFrame
        E.g. ``{"causal": [seed0, seed1, seed2], ...}``.
    names : dict of group -> list of str, optional
        How to name each seed in the message (its run folder); default ``seed <i>``.

    Raises
    ------
    ValueError
        Naming the group, the seeds whose steps differ from the first seed's, and the steps
        that are missing or extra; or when a group has no table.
    """
    for group, frames in tables.items():
        if not frames:
            raise ValueError(f"{group}: no run")
        labels = (names or {}).get(group) or [f"seed {i}" for i in range(len(frames))]
        first = sorted(int(s) for s in frames[0]["step"].unique())
        for label, frame in zip(labels[1:], frames[1:], strict=True):
            steps = sorted(int(s) for s in frame["step"].unique())
            if steps != first:
                missing = sorted(set(first) - set(steps))
                extra = sorted(set(steps) - set(first))
                raise ValueError(
                    f"{group}: the seeds were probed at different steps, so they cannot be "
                    f"averaged step by step: {label} lacks steps {missing} and has extra steps "
                    f"{extra} compared with {labels[0]} ({first}); are some runs unfinished?"
                )


def per_seed(tables: Sequence[pd.DataFrame], metric: str) -> pd.DataFrame:
    """The rows of `metric` from every seed, averaged over heads, stacked with a ``seed`` column.

    Per-head rows are averaged over heads; their ``std`` becomes the root mean square of the
    heads' batch stds (not the spread across heads, which `table.head_means` gives: that is not
    sampling noise). All layers are kept, the final norm's included (``layer_name`` tells).

    Returns
    -------
    DataFrame
        Columns ``seed, step, layer, layer_name, value, std``, sorted.

    Raises
    ------
    ValueError
        If a table lacks `metric`.
    """
    parts = []
    for seed, frame in enumerate(tables):
        rows = frame.loc[frame["metric"] == metric]
        if rows.empty:
            available = ", ".join(sorted(frame["metric"].unique())) or "none"
            raise ValueError(f"seed {seed}: metric {metric!r} is not in the table; {available}")
        whole = rows.loc[rows["head"] == -1]
        heads = rows.loc[(rows["head"] >= 0)]
        if not heads.empty:
            keys = ["step", "layer", "layer_name"]
            mean = heads.groupby(keys)["value"].mean()
            std = heads.groupby(keys)["std"].agg(lambda s: rms(s) if s.notna().any() else np.nan)
            averaged = pd.DataFrame({"value": mean, "std": std}).reset_index()
            have = pd.MultiIndex.from_frame(whole[keys]) if not whole.empty else None
            if have is not None:
                averaged = averaged.loc[~pd.MultiIndex.from_frame(averaged[keys]).isin(have)]
            whole = pd.concat([whole, averaged], ignore_index=True)
        parts.append(whole[["step", "layer", "layer_name", "value", "std"]].assign(**{SEED: seed}))
    out = pd.concat(parts, ignore_index=True)
    return out[[SEED, "step", "layer", "layer_name", "value", "std"]].sort_values(
        [SEED, "step", "layer"], ignore_index=True
    )


def grid(
    stacked: pd.DataFrame, *, step: int | None = None, layer_mean: bool = False
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Values and batch stds of one metric as (x, seed) grids, blocks 1..L only.

    Parameters
    ----------
    stacked : DataFrame
        From `per_seed`.
    step : int, optional
        Take this step: rows are the blocks (a layer profile).
    layer_mean : bool
        Average over blocks 1..L at every step: rows are the steps (a curve over training); the
        batch std of the mean is the root mean square of the blocks' stds (see the module doc).

    Returns
    -------
    values, stds : DataFrame
        Index ``layer`` or ``step``; one column per seed. A std unknown to the table is NaN.
    """
    rows = stacked.loc[(stacked["layer_name"] != FINAL_NORM) & (stacked["layer"] >= 1)]
    if (step is None) == (not layer_mean):
        raise ValueError("grid: pass either step= (a profile) or layer_mean=True (a curve)")
    if layer_mean:
        grouped = rows.groupby(["step", SEED])
        values = grouped["value"].mean().unstack(SEED)
        stds = grouped["std"].agg(lambda s: rms(s) if s.notna().any() else np.nan).unstack(SEED)
        return values.sort_index(), stds.reindex_like(values).sort_index()
    at = rows.loc[rows["step"] == step]
    if at.empty:
        raise ValueError(f"step: no rows at step {step}; steps: {sorted(rows['step'].unique())}")
    values = at.pivot(index="layer", columns=SEED, values="value").sort_index()
    stds = at.pivot(index="layer", columns=SEED, values="std").reindex_like(values)
    return values, stds


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


@dataclass(frozen=True)
class Effect:
    """A quantity that the claim says is positive, per seed and over seeds.

    Attributes
    ----------
    name : str
        What it is, e.g. ``"peak − end"``.
    interval : Interval
        Its mean over seeds and 95% interval.
    batch_noise : float
        Root mean square over seeds of its per-seed batch std (0 when unknown).
    per_seed_holds : tuple of bool
        Per seed: its value exceeds its own batch std.
    """

    name: str
    interval: Interval
    batch_noise: float
    per_seed_holds: tuple[bool, ...]

    @property
    def noise(self) -> float:
        """The larger of the batch noise and the interval's half-width (0 for one seed)."""
        half = self.interval.half_width
        return max(self.batch_noise, half if np.isfinite(half) else 0.0)

    @property
    def known_noise(self) -> bool:
        """Whether any noise is known: an interval (2+ seeds) or a batch std."""
        return bool(np.isfinite(self.interval.half_width) or self.batch_noise > 0)

    @property
    def holds(self) -> bool:
        """The mean exceeds the noise: the interval excludes 0 and the batch noise is beaten.

        With one seed and no batch std nothing tells an effect from noise: it does not hold.
        """
        return bool(self.known_noise and self.interval.mean > self.noise)

    @property
    def seeds_holding(self) -> int:
        return int(sum(self.per_seed_holds))

    def format(self, digits: int = 3) -> str:
        """``peak − end = 0.420 [0.310, 0.530] (batch noise 0.010)``."""
        noise = (f"batch noise {self.batch_noise:.{digits}f}" if self.batch_noise > 0
                 else "no batch std in the table")
        return f"{self.name} = {self.interval.format(digits)} ({noise})"


def effect(
    name: str,
    values: Sequence[float] | np.ndarray,
    stds: Sequence[float] | np.ndarray,
    *,
    level: float = LEVEL,
) -> Effect:
    """An `Effect` from one value and one batch std per seed (NaN std: unknown, counted as 0)."""
    values = np.asarray(values, dtype=float)
    stds = np.nan_to_num(np.asarray(stds, dtype=float))
    if values.shape != stds.shape:
        raise ValueError(f"values, stds: shapes differ, {values.shape} and {stds.shape}")
    return Effect(
        name,
        t_interval(values, level=level),
        rms(stds),
        # One seed's value holds when it beats its batch std; where the table has none (0), a
        # positive value counts: the seed spread then decides the aggregate verdict.
        tuple(bool(v > s) for v, s in zip(values, stds, strict=True)),
    )


def change(
    name: str,
    values: np.ndarray | pd.DataFrame,
    stds: np.ndarray | pd.DataFrame,
    start: int,
    end: int,
    *,
    level: float = LEVEL,
) -> Effect:
    """The change of a curve from point `start` to point `end`, per seed, as an `Effect`.

    ``v[end] − v[start]`` for every seed, with the batch stds of the two points combined in
    quadrature (the module doc's rule (a)); `Effect.holds` then says whether it beats the noise.
    The report's peak − start / peak − end (`rise_then_fall`) and the phases of a trajectory
    (`repgeom.probes.phases`) use it.

    Parameters
    ----------
    values, stds : array or DataFrame, shape (n_points, n_seeds)
        One row per point of the curve (a step or a layer), one column per seed (as `grid`).
    start, end : int
        Positions (0-based) of the two points.
    """
    v = np.asarray(values, dtype=float)
    s = np.nan_to_num(np.asarray(stds, dtype=float))
    return effect(name, v[end] - v[start], quadrature(s[end], s[start]), level=level)


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
