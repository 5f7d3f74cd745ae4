"""The shuffled-text control's verdict (docs/results.md, section 10) on synthetic peaks.

Each draw plants, for both maskings and each seed, one TwoNN profile over 6 blocks per text:
a bump ``[4, 6, 8, 7.5, 6, 5]`` plus a per-seed shift ``N(0, 0.3²)`` shared by the two texts of a
seed (the seed is the unit, the texts are paired), plus per-block noise of the kind named. The
profiles go through `repgeom.experiments.report_shuffled` (`pair_columns`, then `_findings`: the
declared interior-peak height, real minus shuffled, one-sided t over seeds, Holm over the two
maskings, "agrees" at adjusted p <= 0.05; issue 49), and the share of draws reading "agrees" is
printed:

* ``null``: real and shuffled drawn from the same profile: the false-positive rate, per masking
  and over the section (either masking);
* ``flat real``: real text a plateau at 8 over every block, shuffled the bump (same true height
  8): the case where the earlier statistic, the max over blocks, favoured the flatter profile;
* ``effect <d>``: real text's interior blocks (2-5) raised by ``d`` TwoNN: the power (a shift
  of every block would leave the interior-peak height unchanged).

    python benchmarks/bench_shuffled_control_null.py --draws 4000
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from repgeom.experiments import report_shuffled

BUMP = np.array([4.0, 6.0, 8.0, 7.5, 6.0, 5.0])
FLAT = np.full(6, 8.0)
NOISE = {
    "normal": lambda rng: rng.normal(0.0, 0.5, 6),
    "lognormal": lambda rng: rng.lognormal(0.0, 0.8, 6) - np.exp(0.32),  # skewed, mean 0
    "t2": lambda rng: 0.5 * rng.standard_t(2, 6),  # heavy tails
}


def agrees(case: str, noise: str, n_seeds: int, draws: int, seed: int = 0) -> dict[str, float]:
    """The share of `draws` in which each masking's check, and either, reads "agrees"."""
    rng = np.random.default_rng(seed)
    draw = NOISE[noise]
    if case.startswith("effect"):
        real_mean = BUMP + float(case.split()[1]) * (np.arange(6) % 5 != 0)
        shuffled_mean = BUMP
    else:
        real_mean, shuffled_mean = {"null": (BUMP, BUMP), "flat real": (FLAT, BUMP)}[case]
    hits = {"causal": 0, "bidirectional": 0, "either": 0}
    for _ in range(draws):
        rows = []
        for masking in ("causal", "bidirectional"):
            for s in range(n_seeds):
                shift = rng.normal(0.0, 0.3)
                real, shuffled = (pd.Series(mean + shift + draw(rng), index=range(1, 7))
                                  for mean in (real_mean, shuffled_mean))
                rows.append({"masking": masking, "seed": s, "blocks": 6, "step": 1500,
                             **report_shuffled.pair_columns(real, shuffled)})
        found = report_shuffled._findings(pd.DataFrame(rows))
        for f in found:
            hits[f.claim.rsplit("(", 1)[1].rstrip(")")] += f.agrees
        hits["either"] += any(f.agrees for f in found)
    return {k: v / draws for k, v in hits.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=4000)
    args = parser.parse_args()
    se = 0.5 / np.sqrt(args.draws)  # the largest binomial standard error, at a share of 0.5
    print(f"{args.draws} draws per row; binomial standard error at most {se:.4f}")
    for case, noises in (("null", NOISE), ("flat real", ["normal"]), ("effect 1", ["normal"])):
        for noise in noises:
            for n_seeds in (3, 5):
                share = agrees(case, noise, n_seeds, args.draws)
                print(f"{case:9s} {noise:9s} seeds={n_seeds}: agrees causal "
                      f"{share['causal']:.4f}, bidirectional {share['bidirectional']:.4f}, "
                      f"either {share['either']:.4f}")


if __name__ == "__main__":
    main()
