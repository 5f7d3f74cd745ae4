"""The test behind every turn of a trajectory: a change beyond the noise, with the false-turn
rate controlled over the whole curve.

A curve is the mean over seeds ``m_t`` of one metric (one layer, or the layer mean) at the steps
``t = 0..K-1`` of a trajectory, with the standard error ``se_t`` of each point and the degrees of
freedom ``df`` of those standard errors. `repgeom.probes.report.phases` follows the curve and
asks, at each step, whether it has risen or fallen from an earlier point: `CurveTest.beats`.

Where the standard errors come from (`standard_errors`), per table row:

* the ``se`` and ``se_df`` columns, where the probe wrote them (its noise batches:
  `repgeom.probes.core.measure`, ``settings.noise_splits``): the standard error of ``value`` from
  the spread of the estimator over smaller batches of the same states, and its degrees of freedom;
* otherwise ``std`` (the population std over the ``n_batches`` estimator batches whose mean is
  ``value``; a table without the ``n_batches`` column is read as 2 batches, the default protocol of
  8,192 states in batches of 4,096): ``se = std / √(n_batches − 1)`` with ``n_batches − 1``
  degrees of freedom. With the default protocol that is one degree of freedom.

Over seeds the point is the mean of the seeds' values, its standard error ``√(Σ se_s²) / S`` with
Welch-Satterthwaite's degrees of freedom. The layer mean's standard error is the root mean square
of its blocks' (an upper bound whatever the correlation between blocks, as in
`repgeom.probes.report.noise`), with the smallest degrees of freedom among them. A curve's ``df``
is the smallest over its steps.

The test. A change from point ``a`` to point ``b`` counts when

    z = (m_b − m_a) / √(se_a² + se_b²)  >  c(K, df)

where ``c`` is the ``1 − FALSE_TURN_RATE`` quantile of ``max_{p<q} (x_p − x_q) / √(s_p² + s_q²)``
over a flat curve of ``K`` independent points, ``x ~ N(0, 1)``, ``s² ~ χ²_df / df`` (`critical`,
by a seeded Monte Carlo). That is a threshold from the maximum over the trajectory (the largest
standardised fall anywhere along it), not a per-step one, and it controls the false turns:

* a false ``expansion_to_compression`` turn needs a standardised fall beyond ``c`` between two
  steps. Under any curve whose true mean never falls (flat; a rise, then flat; a monotone rise)
  every ``m_p − m_q`` with ``p < q`` is at most pure noise, so the chance of such a fall anywhere
  is at most that of the flat curve: ``FALSE_TURN_RATE`` (5%), per curve and over all its steps;
* the same holds for a false ``compression_to_expansion`` turn under curves that never rise.

With several seeds the batch noise is not the whole noise: seeds differ in the shape of their
curves, and a mean over seeds inherits that. The seeds' own disagreement (`_seed_noise`: the
residual of the two-way step-by-seed layout, a seed's constant offset cancelling, its variance
taken at each step over a window of 3 neighbouring steps on ``2 (S − 1)`` degrees of freedom)
holds both: each seed's batch noise and its own wiggles, where they are, along the curve. So with
several seeds that residual and its degrees of freedom carry the test, with the pooled batch
noise above as a floor: each point's standard error is the larger of the two, and ``c`` is taken
for independent estimates at each point (`critical`; neighbouring windows share steps, which the
calibration measures: benchmarks/README.md). The floor can only lower ``z``, so the false-turn
rate is at most that of the residual alone; it guards the steps where the residual is too small
by chance on its few degrees of freedom, or an estimator whose noise grows with the dimension
(TwoNN's sd is about ``d / √N``). The floor ``√(Σ se²) / S`` takes the seeds' batch errors as
independent: each seed draws its own probe set from its seed (docs/probing.md, "Probing while
training"); seeds probed on one shared set would have errors common to them at a step, which
neither the floor nor the residual sees. Before issue 49 the test took the smaller of the
batch noise's and the residual's degrees of freedom, so 3 seeds of 2-batch tables (Welch's 3 df
from the batch noise) decided nothing; issue 49 then pooled the residual over the whole curve on
``(K − 1)(S − 1)`` df, which let false turns through in 8-13% of curves at 5 seeds when the
seeds part only late in training (the review's ``late`` and ``ramp`` nulls), hence the window.
A change must also hold over seeds:
the lower end of the 95% Student-t interval of the paired per-seed changes ``v_s(b) − v_s(a)`` is
above 0 (seeds that agree to the last bit, with no spread at all, decide nothing). That second
condition can only remove turns (an intersection of two tests, Berger 1982).

What a turn says. The probe reads the same states at every step, so the batch errors at
neighbouring steps are correlated (TwoNN's at 0.86-1.00 on the stored runs). ``c`` assumes
independent points; with positively correlated errors every difference between steps is less
noisy than ``√(se_a² + se_b²)`` says, so the false-turn rate stays below 5% (at most 0.2% on the
calibration with an AR(1) of correlation 0.9), but the power is that of the correlated noise,
lower than with independent points at one seed (benchmarks/README.md, "Phase calibration").
The rate is per curve: a run has a curve per layer, the layer mean and each metric, and no
correction is made across them (the W&B alerts make one:
`repgeom.probes.report.phase_report.PhaseWatch`). And with one seed a turn is one of *this run's*
curve beyond the probe's noise: a seed's own training wiggle is part of its curve, not noise, so
whether other seeds turn too is the cross-run report's question (`repgeom.experiments`), not
this one's.

Where no noise is known (one seed and no std: a single estimator batch), or the degrees of freedom
are below 1, ``c`` is infinite and nothing is decided: the phase stays *undecided*. With the
2-batch tables of the default protocol (``df = 1``) ``c`` is about 30 at 16 steps: a turn must be
enormous to be called with one seed (with several, the seeds' residual decides).
docs/probing.md ("Phases") argues the choice; benchmarks/README.md
("Phase calibration") measures the false-turn rate and the power
(benchmarks/bench_phase_calibration.py).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

FALSE_TURN_RATE = 0.05
"""The chance, per curve and over all its steps, of a turn where the true curve has none."""
DEFAULT_N_BATCHES = 2
"""How many estimator batches a table without the ``n_batches`` column is read as (the default
protocol: 8,192 states in batches of 4,096)."""
SEED_LEVEL = 0.95
"""Coverage of the seed interval a change must also clear (its lower end above 0)."""
MAX_DF = 200
"""Degrees of freedom above which a curve is tested as if it had this many (``c`` moves by under
1% from 200 to infinity)."""
SEED_WINDOW = 3
"""Steps whose seed residuals make each step's variance (`_seed_noise`): the step and its two
neighbours."""
SIMULATIONS = 20_000
"""Flat curves drawn for each critical value (`critical`); its Monte Carlo error is about 1%."""


def standard_errors(frame: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Each row's standard error of ``value`` and its degrees of freedom (module doc).

    Returns
    -------
    se, df : Series
        Aligned with `frame`; NaN where the row carries no usable noise (no std, one batch, a
        std of 0).
    """
    std = pd.to_numeric(frame["std"], errors="coerce") if "std" in frame else np.nan
    n = (pd.to_numeric(frame["n_batches"], errors="coerce").fillna(DEFAULT_N_BATCHES)
         if "n_batches" in frame else pd.Series(float(DEFAULT_N_BATCHES), index=frame.index))
    se = std / np.sqrt(n - 1).where(n > 1)
    df = (n - 1).where(n > 1)
    if "se" in frame.columns:
        own = pd.to_numeric(frame["se"], errors="coerce")
        own_df = (pd.to_numeric(frame["se_df"], errors="coerce") if "se_df" in frame.columns
                  else pd.Series(np.nan, index=frame.index))  # an se without its df: unused
        use = own.notna() & (own > 0) & own_df.notna() & (own_df >= 1)
        se, df = se.where(~use, own), df.where(~use, own_df)
    usable = se.notna() & (se > 0) & df.notna()
    return se.where(usable), df.where(usable)


@functools.lru_cache(maxsize=256)
def critical(n_steps: int, df: float, rate: float = FALSE_TURN_RATE, pooled: bool = False) -> float:
    """The threshold ``c(K, df)`` of the module doc: the ``1 − rate`` quantile of the largest
    standardised fall over a flat curve of `n_steps` points whose standard errors have `df`
    degrees of freedom: each point its own (``s_t² ~ χ²_df / df``, independent), or with
    `pooled` one for all (a single ``s² ~ χ²_df / df``: the seeds' pooled residual, whose error
    moves every comparison at once, so its bar is higher).

    Seeded (the same number on every call and machine up to float rounding), cached; ``inf`` where
    `df` is below 1 or unknown, and 0 for fewer than two steps (there is nothing to compare).

    Examples
    --------
    >>> round(critical(2, 1e9), 1)  # two points, known noise: the one-sided normal 95% point
    1.6
    """
    if n_steps < 2:
        return 0.0
    if not np.isfinite(df) or df < 1:
        return math.inf
    df = float(min(df, 1e6))
    rng = np.random.default_rng(20231)
    draws = SIMULATIONS if n_steps <= 64 else max(2000, SIMULATIONS * 64 // n_steps)
    x = rng.standard_normal((draws, n_steps))
    s2 = rng.chisquare(df, (draws, n_steps)) / df
    if pooled:
        s2 = np.repeat(s2[:, :1], n_steps, axis=1)
    return float(np.quantile(_largest_fall(x, s2), 1 - rate))


def _largest_fall(x: np.ndarray, s2: np.ndarray) -> np.ndarray:
    """``max_{p<q} (x_p − x_q) / √(s2_p + s2_q)`` per row of (draws, K) arrays."""
    best = np.full(x.shape[0], -np.inf)
    for p in range(x.shape[1] - 1):
        z = (x[:, p, None] - x[:, p + 1:]) / np.sqrt(s2[:, p, None] + s2[:, p + 1:])
        np.maximum(best, z.max(axis=1), out=best)
    return best


@dataclass
class CurveTest:
    """One curve's points and noise, and the test of a change between two of them.

    Attributes
    ----------
    values : ndarray, shape (K, S)
        Per step, each seed's value.
    se : ndarray, shape (K,)
        The standard error of the mean over seeds at each step (NaN: unknown).
    df : float
        The curve's degrees of freedom (NaN: unknown).
    n_steps : int
        The length of the trajectory the false-turn rate is controlled over (at least K: the
        training probe passes its whole schedule, so a turn seen online is one the whole run
        would call).
    """

    values: np.ndarray
    se: np.ndarray
    df: float
    n_steps: int
    rate: float = FALSE_TURN_RATE
    seed_level: float = SEED_LEVEL
    pooled: bool = False
    """Whether one variance estimate enters every point's ``se`` (`critical`'s ``pooled``);
    `curve_test` no longer builds such curves (the seeds' variance is taken step by step)."""

    def __post_init__(self) -> None:
        self.mean = self.values.mean(axis=1) if len(self.values) else np.zeros(0)
        known = len(self.se) and np.isfinite(self.se).all()
        # df rounded down (a smaller df only raises c), and capped where c no longer moves, so
        # that curves share the cached critical values
        df = math.floor(min(self.df, MAX_DF)) if not np.isnan(self.df) else math.nan
        self.threshold = (critical(int(self.n_steps), df, self.rate, self.pooled) if known
                          else math.inf)
        """``c(n_steps, df)``; ``inf`` where the noise is unknown."""
        n_seeds = self.values.shape[1] if self.values.ndim == 2 else 1
        self._t = (float(stats.t.ppf(0.5 + self.seed_level / 2, n_seeds - 1)) if n_seeds > 1
                   else math.nan)

    def z(self, start: int, end: int) -> float:
        """The standardised change from point `start` to point `end`."""
        scale = math.sqrt(self.se[start] ** 2 + self.se[end] ** 2)
        return float((self.mean[end] - self.mean[start]) / scale) if scale > 0 else math.nan

    def beats(self, start: int, end: int) -> bool:
        """Whether the curve rose from `start` to `end` beyond the noise (module doc); call it with
        the points swapped for a fall."""
        z = self.z(start, end)
        if not (np.isfinite(z) and z > self.threshold):
            return False
        n_seeds = self.values.shape[1]
        if n_seeds < 2:
            return True
        change = self.values[end] - self.values[start]
        sd = float(change.std(ddof=1))
        if sd == 0:  # seeds that agree to the last bit were likely not seeded apart: no test
            return False
        return bool(change.mean() - self._t * sd / math.sqrt(n_seeds) > 0)


def _seed_noise(v: np.ndarray) -> tuple[np.ndarray | float, float]:
    """The standard error of a mean over seeds at each step from the seeds' own disagreement
    there, and its degrees of freedom.

    The residual of the two-way layout ``v[t, s] = m_t + a_s + e[t, s]`` (a step effect, a
    seed's offset, and the rest: batch noise and each seed's own wiggles along the curve). Its
    variance at step ``t``, ``Σ_s e[t, s]² · K / ((K − 1)(S − 1))`` (unbiased where the variance
    is one along the curve: the error term of a repeated-measures ANOVA, step by step), is
    averaged over the step and its neighbours (a window of ``SEED_WINDOW`` steps, two at the
    ends), so that ``se_t = √(σ_t² / S)`` follows a disagreement that changes along training
    (seeds that part only late, or more and more), which one variance pooled over the whole
    curve does not: it let false turns through in 8-13% of curves at 5 seeds (issue 49's
    review; benchmarks/README.md, "Phase calibration", the ``late`` and ``ramp`` wiggles). Its
    degrees of freedom are those of the ends' windows, ``2 (S − 1)`` (the smallest; the inner
    windows' are larger). A seed's constant offset cancels in every change, as in a paired test.
    NaN with one seed or one step."""
    n_steps, n_seeds = v.shape if v.ndim == 2 else (len(v), 1)
    if n_seeds < 2 or n_steps < 2:
        return math.nan, math.nan
    residual = v - v.mean(axis=1, keepdims=True) - v.mean(axis=0, keepdims=True) + v.mean()
    var = np.sum(residual**2, axis=1) * n_steps / ((n_steps - 1) * (n_seeds - 1))
    half = SEED_WINDOW // 2
    window = np.array([var[max(t - half, 0):t + half + 1].mean() for t in range(n_steps)])
    return np.sqrt(window / n_seeds), float(min(2, n_steps) * (n_seeds - 1))


def curve_test(v: np.ndarray, se: np.ndarray, df: np.ndarray, *,
               n_steps: int | None = None, level: float = SEED_LEVEL,
               rate: float = FALSE_TURN_RATE) -> CurveTest:
    """A `CurveTest` from (step, seed) arrays of values, standard errors and degrees of freedom
    (steps with a NaN value in any seed already left out by the caller)."""
    n_seeds = max(v.shape[1], 1)
    var = np.sum(se**2, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        welch = var**2 / np.sum(se**4 / np.minimum(df, MAX_DF), axis=1)  # Welch-Satterthwaite
    known = np.isfinite(se).all(axis=1) & np.isfinite(welch)
    mean_se = np.where(known, np.sqrt(var) / n_seeds, np.nan)
    curve_df = float(np.min(welch)) if len(welch) and known.all() else math.nan
    seed_se, seed_df = _seed_noise(v)
    if np.isfinite(seed_df):  # the seeds' residual and its df carry the test; the batch noise
        mean_se = np.fmax(mean_se, seed_se) if known.all() else seed_se  # is a floor
        curve_df = seed_df
    steps = len(v) if n_steps is None else max(int(n_steps), len(v))
    return CurveTest(v, mean_se, curve_df, steps, rate, level)
