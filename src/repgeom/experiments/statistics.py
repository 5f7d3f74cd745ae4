"""The report's tests of significance: the seed is the unit, and what the data chose is corrected.

Every verdict of `docs/results.md` (experiments 1-3) reduces the runs to one number per seed (a
difference between two steps or two blocks, paired over the blocks present at both) and asks
whether its mean over seeds is above 0:

* `t_test`: the one-sided one-sample Student t test over seeds (``t = mean / (s/√n)``, ``n − 1``
  degrees of freedom); `welch_test` for the difference of two independent groups of seeds
  (Welch 1947); `sign_test` where the numbers sit on a bound (Dixon and Mood 1946).
* `iut`: a compound claim ("above both ends", "every block grows") is the intersection of its
  parts, so it holds when every part holds: the intersection-union test (Berger 1982,
  *Technometrics* 24:295) rejects at level α when every part rejects at α, i.e. its p is the
  largest part's p.
* `peak_test`: "rises, then falls" compares a peak with both ends, and the peak's step is
  chosen on the data; tested at that step as if fixed, a flat curve would read as a peak far more
  often than α. The claim is a union over the K candidate steps of intersections ("some candidate
  is above the start *and* above the end"), tested as such: the peak is the candidate most above
  both ends (the largest smaller-of-the-two mean contrasts), and its intersection-union p of the
  two one-sided t tests (Berger 1982) times K is the verdict's p (Bonferroni over the candidates).
  Valid whatever the rule that chose the peak and whatever the correlation of the candidates'
  contrasts (Bonferroni's inequality needs none), wherever each one-sided t test holds its
  level: under the null every candidate has a contrast whose mean is at most 0, and the IUT p of
  that candidate is at least that contrast's p, so ``P(K · p_peak ≤ α) ≤ P(∃c: K · p_c ≤ α) ≤
  α``. The t tests assume the seeds' contrasts are normal (or near it); with 3-5 seeds and
  skewed contrasts they are not exact: a null where each seed's end is 4 sds high with chance 1/5
  (1 sd low otherwise) gives a single check p ≤ 0.05 in 6.6% of draws at 5 seeds and 9.8% at 8,
  and a family of 7 checks a false "agrees" after Holm in 10.6% and 22.8% (benchmarks/README.md,
  "Report calibration", the skewed row; issue 49's review measured 8.5% per check).
  From `SIGN_FLIP_FROM` seeds the sign-flip max-T of Westfall and Young (1993,
  *Resampling-Based Multiple Testing*, §2.6) over both contrasts at every candidate is printed
  beside it as a check, never the verdict: its smallest p is 2^-n (1/32 at 5 seeds), so with Holm
  over a family it cannot reach α below 7 seeds. (The sign flip of ``max_c min(t_start, t_end)``
  is no valid test: its flips are not the null's distribution of an intersection, and its size
  was 27-33% in the review of issue 49.)
* `holm`: the step-down correction of Holm (1979, *Scand. J. Statist.* 6:65) over one family of
  verdicts (the report's families: one per experiment, `report_findings.adjust`); a verdict
  **agrees** when its adjusted p is at most `ALPHA`.

With no spread over seeds (every seed gives the same number) the t statistic is infinite: its p
is 0 when the mean is on the claimed side and 1 otherwise.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

ALPHA = 0.05
"""Family-wise level of the report: a verdict agrees when its Holm-adjusted p is at most this."""
MIN_SEEDS = 3
"""Fewer seeds than this: the verdict is "not testable" (no spread worth a t test)."""
SIGN_FLIP_FROM = 5
"""From this many seeds `peak_test` prints the sign-flip max-T beside its verdict (a check: its
smallest p, 2^-n, is too coarse to decide below about 7 seeds)."""
EXACT_FLIPS_UP_TO = 10
"""Up to this many seeds every one of the 2^n sign flips is enumerated; above, `N_FLIPS` drawn."""
N_FLIPS = 10_000
"""Sign flips drawn (the identity among them) when there are too many seeds to enumerate."""


def _finite(values) -> np.ndarray:
    arr = np.asarray(values, dtype=float).ravel()
    return arr[np.isfinite(arr)]


def t_test(values: Sequence[float] | np.ndarray) -> float:
    """One-sided p of the one-sample Student t test that the mean of `values` is above 0.

    Parameters
    ----------
    values : array-like of float
        One number per seed; NaNs are left out.

    Returns
    -------
    float
        ``P(T_{n−1} ≥ mean / (s/√n))``; NaN with fewer than 2 finite values. With ``s = 0``: 0 when
        the mean is above 0, else 1.

    Examples
    --------
    >>> round(t_test([1.0, 2.0, 3.0]), 4)  # t = 2 / (1/√3) = 3.464 on 2 degrees of freedom
    0.0371
    """
    arr = _finite(values)
    if arr.size < 2:
        return math.nan
    mean, sd = float(arr.mean()), float(arr.std(ddof=1))
    if sd == 0 or not np.isfinite(sd):
        return 0.0 if mean > 0 else 1.0
    return float(stats.t.sf(mean / (sd / math.sqrt(arr.size)), arr.size - 1))


def welch_test(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """One-sided p of Welch's t test that ``mean(a) > mean(b)`` (two independent groups of seeds).

    Standard error ``√(s_a²/n_a + s_b²/n_b)``, Welch–Satterthwaite degrees of freedom; NaN when a
    group has fewer than 2 finite values; with no spread in either group, 0 or 1 as `t_test`.
    """
    x, y = _finite(a), _finite(b)
    if x.size < 2 or y.size < 2:
        return math.nan
    va, vb = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    diff = float(x.mean() - y.mean())
    if va + vb == 0:
        return 0.0 if diff > 0 else 1.0
    df = (va + vb) ** 2 / (va**2 / (x.size - 1) + vb**2 / (y.size - 1))
    return float(stats.t.sf(diff / math.sqrt(va + vb), df))


def sign_test(values: Sequence[float] | np.ndarray) -> float:
    """One-sided exact sign test (Dixon and Mood 1946, *JASA* 41:557) that `values` are more
    often above 0 than below: ``P(Binomial(m, 1/2) ≥ k)`` for k of the m non-zero finite values
    above 0 (1 when none is non-zero). For numbers that sit on a bound (a share that is 0 in every
    run), where the t test's normal model fails; its smallest p with n values is 2^-n.

    Examples
    --------
    >>> sign_test([0.01, 0.01, 0.01, 0.01, 0.01, 0.01])  # 6 of 6 above: 2^-6
    0.015625
    """
    arr = _finite(values)
    arr = arr[arr != 0]
    if arr.size == 0:
        return 1.0
    return float(stats.binom.sf(int((arr > 0).sum()) - 1, arr.size, 0.5))


def iut(ps: Sequence[float]) -> float:
    """The intersection-union test's p (Berger 1982): the largest part's p; NaN if any is NaN."""
    arr = np.asarray(ps, dtype=float)
    if arr.size == 0:
        raise ValueError("ps: an intersection-union test needs at least one part")
    return math.nan if np.isnan(arr).any() else float(arr.max())


def holm(ps: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm's (1979) step-down adjusted p values; NaN entries are no test and stay NaN.

    The i-th smallest of the m finite p's becomes ``max_{k ≤ i} min(1, (m − k + 1) p_(k))``.

    Examples
    --------
    >>> holm([0.01, 0.04, 0.03, float("nan")]).round(2).tolist()
    [0.03, 0.06, 0.06, nan]
    """
    arr = np.asarray(ps, dtype=float)
    out = np.full(arr.shape, np.nan)
    idx = np.flatnonzero(np.isfinite(arr))
    order = idx[np.argsort(arr[idx], kind="stable")]
    m = order.size
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * arr[i]))
        out[i] = running
    return out


def _t_stats(x: np.ndarray) -> np.ndarray:
    """One-sample t statistics of the columns of ``x`` (flips, seeds, columns) over seeds; a
    column with no spread reads ±inf (or −inf at mean 0: it never reaches the maximum)."""
    n = x.shape[-2]
    mean = x.mean(axis=-2)
    sd = x.std(axis=-2, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = mean / (sd / math.sqrt(n))
    return np.where(sd > 0, t, np.where(mean > 0, np.inf, -np.inf))


def sign_flips(n: int, *, seed: int = 0) -> np.ndarray:
    """The sign flips of `n` seeds, shape (flips, n): all 2^n for n ≤ `EXACT_FLIPS_UP_TO`, else
    `N_FLIPS` drawn with `seed`, the identity first."""
    if n <= EXACT_FLIPS_UP_TO:
        return np.array(list(itertools.product((1.0, -1.0), repeat=n)))
    drawn = np.random.default_rng(seed).choice((1.0, -1.0), size=(N_FLIPS - 1, n))
    return np.vstack([np.ones((1, n)), drawn])


def sign_flip_max_t(diffs: np.ndarray, *, seed: int = 0) -> np.ndarray:
    """Westfall–Young single-step max-T adjusted p values, one per column (one-sided, above 0).

    Parameters
    ----------
    diffs : array, shape (n_seeds, n_columns)
        Per seed, every contrast of the family (e.g. peak − start and peak − end at each
        candidate step). Must be finite.

    Returns
    -------
    array, shape (n_columns,)
        ``p_j = #{flips f : max_c t_c(f) ≥ t_j} / #flips``, where ``t_c(f)`` is column c's
        one-sample t statistic after multiplying each seed's row by its sign in flip f.
    """
    d = np.asarray(diffs, dtype=float)
    if d.ndim != 2 or d.shape[0] < 2 or d.shape[1] < 1:
        raise ValueError(f"diffs: expected (seeds >= 2, columns >= 1), got shape {d.shape}")
    if not np.isfinite(d).all():
        raise ValueError("diffs: NaN or inf; keep only the contrasts every seed has")
    flips = sign_flips(d.shape[0], seed=seed)
    observed = _t_stats(d[None])[0]
    maxima = _t_stats(flips[:, :, None] * d[None]).max(axis=1)
    return (maxima[:, None] >= observed[None, :]).mean(axis=0)


@dataclass(frozen=True)
class PeakTest:
    """The test of "a peak above both ends" at a peak chosen on the data (`peak_test`)."""

    peak: int
    """Column of the candidate chosen on all seeds (`choose_peak`) and tested."""
    start: np.ndarray
    """Per seed, peak − start at that candidate."""
    end: np.ndarray
    """Per seed, peak − end at that candidate."""
    p: float
    """The verdict's p, corrected for the choice (Bonferroni over the candidates); NaN below
    `MIN_SEEDS` seeds."""
    detail: str
    """How the choice was corrected, with the simultaneous lower bounds and, from
    `SIGN_FLIP_FROM` seeds, the sign-flip check."""
    candidates: int = 1
    """How many candidates the peak was chosen among (K of the Bonferroni bound)."""

    @property
    def p_start(self) -> float:
        return t_test(self.start)

    @property
    def p_end(self) -> float:
        return t_test(self.end)

    def lower_bounds(self) -> tuple[float, float]:
        """One-sided lower confidence bounds of the mean peak − start and peak − end, together
        at level 1 − `ALPHA` whatever candidate was chosen: ``mean − t_{1−α/(2K), n−1} s/√n``
        (Bonferroni over the K candidates and the two contrasts); NaN below `MIN_SEEDS` seeds."""
        n = self.start.size
        if n < MIN_SEEDS:
            return math.nan, math.nan
        q = float(stats.t.isf(ALPHA / (2 * self.candidates), n - 1))
        low = [float(v.mean() - q * v.std(ddof=1) / math.sqrt(n)) for v in (self.start, self.end)]
        return low[0], low[1]


def _t_p(t: np.ndarray, n: int) -> np.ndarray:
    """One-sided p of t statistics on n − 1 degrees of freedom (±inf: 0 or 1)."""
    return stats.t.sf(t, n - 1)


def choose_peak(start: np.ndarray, end: np.ndarray) -> int:
    """The candidate most above both ends: the argmax of the smaller of the two mean contrasts
    (with every block read, the argmax of the mean curve). Chosen on the means, not on the p's, so
    that the peak reported is the curve's; the Bonferroni bound of `peak_test` holds for any
    choice."""
    score = np.minimum(np.asarray(start).mean(axis=0), np.asarray(end).mean(axis=0))
    return int(np.argmax(score))


def peak_test(start: np.ndarray, end: np.ndarray, *, seed: int = 0) -> PeakTest:
    """Is there a candidate above both ends, with the candidate chosen on the data?

    Parameters
    ----------
    start, end : array, shape (n_seeds, n_candidates)
        Per seed and candidate step (or block), ``v(candidate) − v(start)`` and
        ``v(candidate) − v(end)``, finite.

    Returns
    -------
    PeakTest
        Its p is ``min(1, K · p_IUT)`` at the candidate `choose_peak` picks, with
        ``p_IUT = max(p_start, p_end)`` the intersection-union p of its two one-sided t tests
        (Berger 1982) and K the number of candidates: the Bonferroni bound over the union of
        the candidates' intersections, valid whatever the correlation between candidates
        (module docstring). From
        `SIGN_FLIP_FROM` seeds, ``detail`` also gives the sign-flip max-T p over both contrasts
        at every candidate (Westfall and Young 1993), a check whose floor is 2^-n.
    """
    s, e = np.asarray(start, dtype=float), np.asarray(end, dtype=float)
    if s.shape != e.shape or s.ndim != 2 or s.shape[1] < 1:
        raise ValueError(f"start, end: expected equal (seeds, candidates) shapes, got {s.shape}, "
                         f"{e.shape}")
    if not (np.isfinite(s).all() and np.isfinite(e).all()):
        raise ValueError("start, end: NaN; keep only the candidates every seed reads")
    n, k = s.shape
    if n < 2:
        return PeakTest(0, s[:, 0], e[:, 0], math.nan, f"{n} seed: not testable", k)
    peak = choose_peak(s, e)
    if n < MIN_SEEDS:
        return PeakTest(peak, s[:, peak], e[:, peak], math.nan, f"{n} seeds: not testable", k)
    part = float(_t_p(min(_t_stats(s[None, :, [peak]])[0, 0],
                          _t_stats(e[None, :, [peak]])[0, 0]), n))
    p = min(1.0, k * part)
    plural = "s" if k > 1 else ""
    result = PeakTest(peak, s[:, peak], e[:, peak], p, "", k)
    low_start, low_end = result.lower_bounds()
    detail = (f"Bonferroni over {k} candidate{plural} of the intersection-union p at the peak: "
              f"{k} × {fmt_p(part)} = {fmt_p(p)}; lower bounds holding together at "
              f"{1 - ALPHA:.0%} over the {k} candidate{plural}: peak − start ≥ {low_start:.3f}, "
              f"peak − end ≥ {low_end:.3f}")
    if n >= SIGN_FLIP_FROM:
        adjusted = sign_flip_max_t(np.hstack([s, e]), seed=seed)
        flips = min(2**n, N_FLIPS) if n > EXACT_FLIPS_UP_TO else 2**n
        check = iut([adjusted[peak], adjusted[k + peak]])
        detail += (f"; check beside it, not the verdict: sign-flip max-T over both contrasts at "
                   f"the {k} candidate{plural} ({flips} flips, smallest possible p "
                   f"{fmt_p(1 / flips)}): p = {fmt_p(check)}")
    return PeakTest(peak, s[:, peak], e[:, peak], p, detail, k)


def fmt_p(p: float) -> str:
    """``0.012``, ``3.1e-05``, ``0`` or ``n/a`` (no test)."""
    if not np.isfinite(p):
        return "n/a"
    if p == 0:
        return "0"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"
