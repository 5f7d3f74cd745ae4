"""The probe's noise: an effect must beat the probe's batch noise and the spread over seeds. Used
by the phases of one trajectory (`repgeom.probes.report.phases`, during training too); the
cross-run report (`repgeom.experiments.seeds`) uses its intervals and stacked tables, and prints
the batch noise as information only: its verdicts are tests over seeds
(`repgeom.experiments.statistics`), which this rule no longer decides.

* `t_interval`: the mean over ``n`` seeds and its 95% Student-t interval,
  ``mean ± t_{0.975, n-1} · s / √n`` with ``s`` the sample standard deviation (``ddof=1``);
  for one seed there is no interval (its ends are NaN).
* `check_steps` / `per_seed` / `grid`: one table per seed, stacked; a (x, seed) grid of one
  metric (one seed is a table too).
* `Effect`, `effect` and `change`: a derived quantity per seed (a difference, a peak's height)
  with its interval and its noise, and the verdict "it is there".

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

from repgeom.probes.core.table import FINAL_NORM

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
    heads' batch stds (not the spread across heads, which `aggregate.head_means` gives: that is not
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


# ---------------------------------------------------------------------------------------------
# Effects


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
    The phases of a trajectory (`repgeom.probes.report.phases`) use it.

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
