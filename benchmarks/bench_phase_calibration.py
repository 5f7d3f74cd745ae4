"""Calibration of the phase finder: its false-turn rate on null curves and its power on true turns.

Synthetic probe tables are drawn the way the probe writes them, then passed through
`repgeom.probes.report.phases.find_phases`, and the share of curves given an
``expansion_to_compression`` turn is printed, per layer and for the layer mean (issue 37).

Each table has 4 blocks and the 16 steps of experiment=shape_of_learning's schedule; at each step
and block the estimator reads, with ``sigma = 1`` the standard deviation of one estimator batch of
the value (4,096 states):

* ``--protocol 2-batch`` (today's tables, and the papers' reading): 2 batches read
  ``N(mu, 1)``; ``value`` is their mean, ``std`` their numpy std (ddof 0), ``n_batches`` 2;
* ``--protocol default`` (the probe's default since issue 37): the same 8,192 states also cut into
  16 noise batches of 512, each reading ``N(mu, 8)`` (an estimator's variance goes as one over its
  batch size); ``value`` is their mean (variance 1/2, as the 2 batches'), ``se`` their standard
  error ``sd / √16`` and ``se_df`` 15 (`repgeom.probes.core.measure`).

Seeds are independent tables of the same curve, or (``--taus``) of curves that differ: each seed
adds wiggles of its own, ``N(0, tau²)`` at each step, as trained seeds do, or with ``--walk`` a
random walk of such steps (a training wiggle that wanders; with one seed too), or with
``--shape late`` only in the second half of the steps (seeds that part late in training) or
``--shape ramp`` scaled by ``t / (K − 1)`` (a disagreement that grows along training): the
nulls where one residual variance pooled over the curve let false turns through (issue 49's
review; the seeds' variance is now taken step by step). Three ways the
noise departs from independent points (issue 49):

* ``--rhos``: the probe reads the same states at every step, so each batch's error is
  correlated along the steps (TwoNN's at 0.86-1.00 on the stored runs): here an AR(1) with
  lag-one correlation ``rho``, the same for every batch (2 value batches, or 16 noise batches);
* ``--growth g``: the batch sd grows with the curve, from 1 at its lowest to ``1 + g`` at its
  top (TwoNN's sd goes as the dimension);
* the last column counts a trajectory as a false alarm when any of its 5 curves (4 blocks and
  the layer mean) turns: the run-wide rate with no correction across curves.

The curves (``mu`` over the 16 steps):

* ``flat``: 0 everywhere;
* ``rise_flat``: a rise of 20 over the first 5 steps, then flat (the null a trained run looks like
  once its dimension has settled);
* ``monotone``: a steady rise of 10 over the 16 steps;
* ``rise_fall_<h>``: a rise of ``h`` to a peak at step 6 of 16, then a fall of ``h`` to the end:
  the true turn, at ``h`` = 3, 4, 5 batch standard deviations.

On the null curves the printed share is the false-turn rate (issue 37 asks for 5% or less); on
``rise_fall_<h>`` it is the power. Run:

    python benchmarks/bench_phase_calibration.py                 # 1,000 draws per cell
    python benchmarks/bench_phase_calibration.py --draws 300 --seeds 1 3
    python benchmarks/bench_phase_calibration.py --seeds 3 5 --taus 1 3 --protocols default
    python benchmarks/bench_phase_calibration.py --draws 600 --rhos 0.5 0.9
    python benchmarks/bench_phase_calibration.py --draws 600 --walk --taus 0.25 0.5 \
        --curves flat rise_flat monotone
    python benchmarks/bench_phase_calibration.py --draws 600 --seeds 3 5 --protocols 2-batch \
        --shape late ramp --taus 1 2 6 --curves flat rise_flat
    python benchmarks/bench_phase_calibration.py --draws 600 --growth 2 \
        --curves rise_flat monotone rise_fall_4

tests/probes/report/test_phase_calibration.py runs a fast version (300 draws) of the null rows,
the correlated and growing noise's among them, and of the 3-seed 2-batch power.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from repgeom.probes.report import phases, turn_test

STEPS = (0, 2, 7, 14, 52, 100, 200, 300, 400, 500, 700, 800, 1000, 1200, 1300, 1500)
"""The 16 probe steps of experiment=shape_of_learning (its stored runs' tables)."""
N_BLOCKS = 4
NOISE_SPLITS = 8
"""Noise batches per value batch in the default protocol (16 of 512 states from 2 of 4,096)."""
NULL_CURVES = ("flat", "rise_flat", "monotone")
TRUE_CURVES = ("rise_fall_3", "rise_fall_4", "rise_fall_5")


def curve(name: str) -> np.ndarray:
    """``mu`` at the 16 steps (module doc)."""
    t = np.arange(len(STEPS), dtype=float)
    if name == "flat":
        return np.zeros_like(t)
    if name == "rise_flat":
        return 20.0 * np.minimum(t / 4, 1)
    if name == "monotone":
        return 10.0 * t / (len(t) - 1)
    if name.startswith("rise_fall_"):
        h, peak = float(name.rsplit("_", 1)[1]), 6
        return np.where(t <= peak, h * t / peak, h * (1 - (t - peak) / (len(t) - 1 - peak)))
    raise ValueError(f"curve: unknown {name!r}; one of {NULL_CURVES + TRUE_CURVES}")


def wiggle_shape(shape: str) -> np.ndarray:
    """The seeds' wiggle sd along the 16 steps, relative to `tau` (module doc)."""
    t = np.arange(len(STEPS), dtype=float)
    if shape == "iid":
        return np.ones_like(t)
    if shape == "late":
        return (t >= len(t) // 2).astype(float)
    if shape == "ramp":
        return t / (len(t) - 1)
    raise ValueError(f"shape: unknown {shape!r}; one of iid, late, ramp")


def step_noise(rng: np.random.Generator, shape: tuple, rho: float = 0.0) -> np.ndarray:
    """Standard normal draws of `shape` (draws, steps, ...), each series along the steps an
    AR(1) with lag-one correlation `rho` (0: independent steps): the error of one batch of the
    same states read at every step (module doc)."""
    u = rng.standard_normal(shape)
    if rho == 0:
        return u
    out = np.empty_like(u)
    out[:, 0] = u[:, 0]
    for t in range(1, shape[1]):
        out[:, t] = rho * out[:, t - 1] + np.sqrt(1 - rho**2) * u[:, t]
    return out


def draw_tables(name: str, protocol: str, n_seeds: int, draws: int,
                rng: np.random.Generator, tau: float = 0.0, *, rho: float = 0.0,
                walk: bool = False, growth: float = 0.0,
                wiggles: str = "iid") -> list[pd.DataFrame]:
    """One probe table per seed, each holding `draws` trajectories (column ``run``); with `tau`,
    each seed's curve has wiggles of its own, ``N(0, tau²)`` at each step (shared by its blocks),
    or with `walk` a random walk of such steps (centred on the first step), or with `wiggles`
    ``late`` only from the middle step on, ``ramp`` scaled by ``t / (K − 1)``; with `rho`, each
    estimator or noise batch's error is an AR(1) along the steps (`step_noise`); with `growth`,
    the batch sd grows with the curve, from 1 at its lowest to ``1 + growth`` at its highest (an
    estimator's noise goes with the dimension: TwoNN's sd is about ``d / √N``)."""
    shape = (draws, len(STEPS), N_BLOCKS)
    level = curve(name)
    span = float(np.ptp(level))
    scale = (1 + growth * (level - level.min()) / span if span > 0
             else np.ones_like(level))[None, :, None, None]
    index = np.indices(shape).reshape(3, -1)
    tables = []
    for _ in range(n_seeds):
        wiggle = tau * rng.standard_normal((draws, len(STEPS), 1, 1))
        if walk:
            wiggle = np.cumsum(wiggle, axis=1) - wiggle[:, :1]
        wiggle = wiggle * wiggle_shape(wiggles)[None, :, None, None]
        mu = curve(name)[None, :, None, None] + wiggle
        frame = pd.DataFrame({"run": index[0].astype(str), "step": np.asarray(STEPS)[index[1]],
                              "layer": index[2] + 1, "metric": "twonn"})
        if protocol == "2-batch":
            batches = mu + scale * step_noise(rng, (*shape, 2), rho)
            frame["value"] = batches.mean(axis=-1).ravel()
            frame["std"] = batches.std(axis=-1).ravel()
            frame["n_batches"] = 2
        elif protocol == "default":
            n = 2 * NOISE_SPLITS
            noise = mu + scale * np.sqrt(NOISE_SPLITS) * step_noise(rng, (*shape, n), rho)
            frame["value"] = noise.mean(axis=-1).ravel()
            frame["std"] = np.nan  # the 2 value batches' std: not what the finder reads here
            frame["n_batches"] = 2
            frame["se"] = (noise.std(axis=-1, ddof=1) / np.sqrt(n)).ravel()
            frame["se_df"] = n - 1
        else:
            raise ValueError(f"protocol: {protocol!r}; one of default, 2-batch")
        tables.append(frame)
    return tables


def turn_shares(tables: list[pd.DataFrame], draws: int, *, run: bool = False) -> tuple:
    """Share of (trajectory, block) curves, and of layer-mean curves, with at least one
    ``expansion_to_compression`` turn: `find_phases`'s decisions (`fast_turns`); with `run`,
    also the share of trajectories with a turn in any of their curves (blocks and mean)."""
    turns = fast_turns(tables, draws)
    shares = (float(turns[:, :N_BLOCKS].mean()), float(turns[:, N_BLOCKS].mean()))
    return (*shares, float(turns.any(axis=1).mean())) if run else shares


def fast_turns(tables: list[pd.DataFrame], draws: int) -> np.ndarray:
    """(draws, blocks + 1) booleans: whether each block's curve, and the layer mean's (last
    column), has an ``expansion_to_compression`` turn.

    The same decisions as `phases.find_phases` (tests/probes/report/test_phase_calibration.py
    checks it on a few draws): the table's standard errors from `turn_test.standard_errors`, the
    layer mean as `find_phases` forms it, and `phases.follow_arrays` on each curve, without
    pandas' cost per curve (a pivot per curve makes 1,000 draws take an hour)."""
    shape = (draws, len(STEPS), N_BLOCKS)
    grids = []
    for frame in tables:  # the rows are in (draw, step, block) order (draw_tables)
        se, df = turn_test.standard_errors(frame)
        grids.append([np.asarray(x, dtype=float).reshape(shape)
                      for x in (frame["value"], se, df)])
    v, se, df = (np.stack([g[i] for g in grids], axis=-1) for i in range(3))  # (..., seeds)
    mean_v = v.mean(axis=2)
    mean_se = np.sqrt((se**2).mean(axis=2))
    mean_df = df.min(axis=2)
    out = np.zeros((draws, N_BLOCKS + 1), dtype=bool)
    for d in range(draws):
        for b in range(N_BLOCKS + 1):
            curve = ((v[d, :, b], se[d, :, b], df[d, :, b]) if b < N_BLOCKS
                     else (mean_v[d], mean_se[d], mean_df[d]))
            followed = phases.follow_arrays(list(STEPS), *curve)
            out[d, b] = any(t[0] == phases.TO_COMPRESSION for t in followed.turns)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 3, 5])
    parser.add_argument("--protocols", nargs="+", default=["default", "2-batch"])
    parser.add_argument("--curves", nargs="+", default=list(NULL_CURVES + TRUE_CURVES))
    parser.add_argument("--taus", type=float, nargs="+", default=[0.0],
                        help="the seeds' own wiggles (module doc); several seeds only, unless "
                             "--walk")
    parser.add_argument("--walk", action="store_true",
                        help="the wiggles are a random walk along the steps (one seed too)")
    parser.add_argument("--shape", nargs="+", default=["iid"], choices=["iid", "late", "ramp"],
                        help="how the seeds' wiggle sd changes along the steps (module doc)")
    parser.add_argument("--rhos", type=float, nargs="+", default=[0.0],
                        help="lag-one correlation of each batch's error along the steps")
    parser.add_argument("--growth", type=float, default=0.0,
                        help="the batch sd grows with the curve to 1 + growth at its top")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"{args.draws} trajectories per cell, {len(STEPS)} steps, {N_BLOCKS} blocks; share "
          "with an expansion_to_compression turn (null curves: the false-turn rate; "
          "rise_fall_h: the power)")
    wiggle = "walk" if args.walk else "iid"
    if args.shape != ["iid"]:
        wiggle = "shape, tau"
    if args.growth:
        print(f"the batch sd grows with the curve, to {1 + args.growth:g} at its top")
    print(f"| curve | protocol | seeds | seed wiggle ({wiggle}) | rho | per layer | layer mean | "
          f"any of the {N_BLOCKS + 1} curves |")
    print("|---|---|---|---|---|---|---|---|")
    start = time.perf_counter()
    for name in args.curves:
        for protocol in args.protocols:
            for n_seeds in args.seeds:
                for tau in args.taus if n_seeds > 1 or args.walk else [0.0]:
                    for shape, rho in [(sh, r) for sh in args.shape for r in args.rhos]:
                        tables = draw_tables(name, protocol, n_seeds, args.draws, rng, tau,
                                             rho=rho, walk=args.walk, growth=args.growth,
                                             wiggles=shape)
                        per_layer, mean, any_curve = turn_shares(tables, args.draws, run=True)
                        label = f"{tau:g}" if shape == "iid" else f"{shape} {tau:g}"
                        print(f"| {name} | {protocol} | {n_seeds} | {label} | {rho:g} | "
                              f"{per_layer:.1%} | {mean:.1%} | {any_curve:.1%} |", flush=True)
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
