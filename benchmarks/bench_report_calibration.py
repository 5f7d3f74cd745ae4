"""The report's tests under their null and at the stored effect sizes (issue 49): synthetic
per-seed curves run through the report's own functions, false "agrees" and power after Holm.

**Rise then falls** (experiment 2's family, `repgeom.experiments.statistics.peak_test`, then
`statistics.holm` over the family). Per seed, a layer-mean curve over T probe steps (16 or 30; the
stored runs have 16) is a mean curve plus noise of sd ``SIGMA`` at every step, independent over
steps and seeds: the peak − end contrast then has a seed sd of 0.16, the stored TwoNN-causal
runs' (docs/results.md: peak − end 1.25 [1.05, 1.46] over 5 seeds). Mean curves, with x = the
step's place in the run, 0 to 1:

* nulls (no step above both ends): ``flat`` (0); ``rise then flat`` (up by ``RISE`` = 7.9, the
  stored peak − start, over the first quarter, then flat: the least favourable null, every late
  step's peak − end has mean 0 while its peak − start is huge); ``monotone`` (0 to 7.9 in a
  line); ``random walk`` (0, and each seed's curve a random walk whose increments have sd
  ``SIGMA``, a training wiggle of its own); ``skewed end`` (rise then flat, and each seed's last
  step moved by a skewed amount of mean 0: with chance 1/5 up by 4 seed sds of the peak − end
  contrast, 4 × 0.16, otherwise down by 0.16: the t tests assume normal seed contrasts, and
  this null measures what a skew costs them);
* alternatives: ``rise then fall <h>``: the rise to 7.9 at x = 0.27 (the stored peak, step 400 of
  1500), then a straight fall by h to the last step; h = 1.25 is the stored effect.

The check's family is experiment 2's ``FAMILY`` checks. A null row draws every check of the
family from its curve and counts the draws in which any reads "agrees" (Holm-adjusted p ≤ 0.05):
the family-wise false-positive rate; ``per check`` is the share of single checks whose own p is
≤ 0.05 before Holm. An alternative row draws the first check from its curve and the others from
``rise then flat`` (the null whose p's are smallest, so Holm costs the most) and counts the draws in
which the first check agrees: the power.

**Shuffled-text control** (its own family of 2 checks, `repgeom.experiments.report_shuffled`):
per seed and masking, a TwoNN profile over 6 blocks per text, a per-seed shift N(0, 0.3²) shared
by the two texts, and noise N(0, 0.5²) per block; the rows go through
`report_shuffled.pair_columns` and `_findings` (the declared interior-peak contrast, "not
testable" where no probe run peaks inside the profile). ``null bump``: both texts the bump
``[4, 6, 8, 7.5, 6, 5]``; ``null rising``: both texts rising to the last block
``[4, 5, 6, 7, 8, 9]`` (no interior peak: mostly not testable); ``flat real``: real text a
plateau at 8, shuffled the bump (the old statistic's bias case: it read "agrees" 26-46%);
``effect <d>``: real text's interior blocks raised by d.

    python benchmarks/bench_report_calibration.py --draws 2000
    python benchmarks/bench_report_calibration.py --draws 1000 --cases "skewed end" --steps 16 \
        --shuffled-cases
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from repgeom.experiments import report_shuffled
from repgeom.experiments import statistics as st

SIGMA = 0.16 / np.sqrt(2)
"""Noise sd per step and seed: a contrast of two steps has the stored seed sd, 0.16."""
RISE = 7.9
"""The stored TwoNN-causal peak − start."""
PEAK_AT = 0.27
"""The stored peak's place in the run (step 400 of 1500)."""
FAMILY = 7
"""Experiment 2's checks: rise then falls at 3 scales × 2 maskings, and the near-duplicate check."""
NULLS = ("flat", "rise then flat", "monotone", "random walk", "skewed end")
SEED_SD = 0.16
"""The stored seed sd of a contrast of two steps (``SIGMA · √2``)."""
HEIGHTS = (0.5, 0.8, 1.25)


def mean_curve(case: str, steps: int) -> np.ndarray:
    x = np.linspace(0.0, 1.0, steps)
    if case in ("flat", "random walk"):
        return np.zeros(steps)
    if case in ("rise then flat", "skewed end"):
        return RISE * np.minimum(x / 0.25, 1.0)
    if case == "monotone":
        return RISE * x
    height = float(case.rsplit(" ", 1)[1])
    rise = RISE * np.minimum(x / PEAK_AT, 1.0)
    return rise - height * np.clip((x - PEAK_AT) / (1 - PEAK_AT), 0.0, 1.0)


def draw_p(case: str, steps: int, n_seeds: int, rng: np.random.Generator) -> float:
    """One check: n_seeds curves of `case`, the report's `peak_test` p (its contrasts are the
    report's: every interior step against the first and the last)."""
    curves = mean_curve(case, steps) + rng.normal(0.0, SIGMA, (n_seeds, steps))
    if case == "random walk":
        curves += np.cumsum(rng.normal(0.0, SIGMA, (n_seeds, steps)), axis=1)
    if case == "skewed end":  # mean 0: 0.2 · 4 sd − 0.8 · 1 sd
        curves[:, -1] += np.where(rng.random(n_seeds) < 0.2, 4 * SEED_SD, -SEED_SD)
    start = curves[:, 1:-1] - curves[:, [0]]
    end = curves[:, 1:-1] - curves[:, [-1]]
    return st.peak_test(start, end).p


def rise_then_fall_row(case: str, steps: int, n_seeds: int, draws: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    hits = single = 0
    null = case in NULLS
    for _ in range(draws):
        first = draw_p(case, steps, n_seeds, rng)
        others = [draw_p(case if null else "rise then flat", steps, n_seeds, rng)
                  for _ in range(FAMILY - 1)]
        adjusted = st.holm([first, *others])
        hits += bool((adjusted <= st.ALPHA).any()) if null else bool(adjusted[0] <= st.ALPHA)
        single += first <= st.ALPHA
    return {"rate": hits / draws, "per check": single / draws}


BUMP = np.array([4.0, 6.0, 8.0, 7.5, 6.0, 5.0])
RISING = np.array([4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
FLAT = np.full(6, 8.0)
SHUFFLED_CASES = ("null bump", "null rising", "flat real", "effect 1", "effect 2")


def shuffled_row(case: str, n_seeds: int, draws: int, seed: int) -> dict:
    """Share of draws in which the causal check (the first), either check, agrees; and in which
    the causal check is not testable."""
    rng = np.random.default_rng(seed)
    if case.startswith("effect"):
        real, shuffled = BUMP + float(case.split()[1]) * (np.arange(6) % 5 != 0), BUMP
    else:
        real, shuffled = {"null bump": (BUMP, BUMP), "null rising": (RISING, RISING),
                          "flat real": (FLAT, BUMP)}[case]
    first = either = untestable = 0
    blocks = pd.RangeIndex(1, 7)
    for _ in range(draws):
        rows = []
        for masking in ("causal", "bidirectional"):
            for s in range(n_seeds):
                shift = rng.normal(0.0, 0.3)
                a, b = (pd.Series(mean + shift + rng.normal(0.0, 0.5, 6), index=blocks)
                        for mean in (real, shuffled))
                rows.append({"masking": masking, "seed": s, "blocks": 6, "step": 1500,
                             **report_shuffled.pair_columns(a, b)})
        found = report_shuffled._findings(pd.DataFrame(rows))
        first += found[0].agrees
        either += any(f.agrees for f in found)
        untestable += found[0].verdict == "not testable"
    return {"causal": first / draws, "either": either / draws, "untestable": untestable / draws}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[3, 5, 8])
    parser.add_argument("--steps", type=int, nargs="+", default=[16, 30])
    parser.add_argument("--cases", nargs="+", default=None,
                        help="only these rise-then-fall curves (default: every one)")
    parser.add_argument("--shuffled-cases", nargs="*", default=list(SHUFFLED_CASES),
                        choices=SHUFFLED_CASES)
    parser.add_argument("--no-rise-then-fall", action="store_true",
                        help="only the shuffled-text control's rows")
    args = parser.parse_args()
    se = 0.5 / np.sqrt(args.draws)
    print(f"{args.draws} draws per row; binomial standard error at most {se:.4f}")
    print(f"rise then falls: family of {FAMILY} checks, Holm; null rows: any check agrees "
          "(per check: its own p <= 0.05 before Holm); alternative rows: the check agrees")
    cases = args.cases or [*NULLS, *(f"rise then fall {h}" for h in HEIGHTS)]
    for steps in [] if args.no_rise_then_fall else args.steps:
        for case in cases:
            cells = []
            for n in args.seeds:
                row = rise_then_fall_row(case, steps, n, args.draws, seed=1000 * n + steps)
                cells.append(f"{n} seeds {row['rate']:.4f}"
                             + (f" (per check {row['per check']:.4f})" if case in NULLS else ""))
            print(f"T={steps:2d} {case:20s} " + "; ".join(cells))
    print("shuffled-text control: family of 2 checks, Holm; agrees causal / either masking, "
          "and the share of causal checks not testable")
    for case in args.shuffled_cases:
        cells = []
        for n in args.seeds:
            row = shuffled_row(case, n, args.draws, seed=7 * n)
            cells.append(f"{n} seeds {row['causal']:.4f}/{row['either']:.4f} "
                         f"(not testable {row['untestable']:.2f})")
        print(f"{case:12s} " + "; ".join(cells))


if __name__ == "__main__":
    main()
