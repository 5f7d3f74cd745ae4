"""The intrinsic-dimension rows' noise batches (issue 37): what they cost, whether their standard
error is the value's, and TwoNN's bias on them.

`repgeom.probes.core.id_noise` gives each TwoNN, GRIDE and MLE row a standard error ``se`` from
``noise_splits`` (default 8) times as many batches of the same states, on the assumption that an
estimator's variance goes as one over its batch size. This prints, on states of a known
dimension (a ``d``-dimensional Gaussian pushed through a random smooth map into 128 dimensions,
8,192 states per set as the default probe):

1. cost: seconds of the probe's intrinsic-dimension entry per layer, without and with the noise
   batches (best of 3), and the ratio;
2. calibration: over ``--sets`` independent sets, the spread of the value itself (the mean over
   the 2 batches of 4,096: its sd over sets) against the root mean square of the ``se`` the
   noise batches give (a ratio near 1: the se is the value's), for TwoNN, the MLE and GRIDE k16
   (which the probe leaves without an se, since its ratio is well below 1);
3. bias: the mean of the noise batches' estimates against the value (TwoNN reads low on small
   batches: the noise batches' mean is not used, only their spread).

4. ``--probe``: instead, one whole training probe of an untrained gpt_tiny at the default
   probe config (`bench_probe_cost._probed_model`: 8,192 states of random windows, every metric,
   attention and Q/K), without and with the noise batches, alternated, best of 3 each: the
   probe's cost, from which the quickstart's probe share follows.

    python benchmarks/bench_id_noise.py               # d = 6 and 12, 24 sets
    python benchmarks/bench_id_noise.py --dims 8 --sets 40
    python benchmarks/bench_id_noise.py --probe
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import torch

from repgeom import metrics
from repgeom.probes.core import catalogue
from repgeom.probes.core.measure import ProbeSettings

N_STATES = 8192
WIDTH = 128


def states(d: int, seed: int, n: int = N_STATES) -> torch.Tensor:
    """``n`` points of a d-dimensional Gaussian through a fixed random smooth map to 128 dims."""
    maps = np.random.default_rng(1000 + d)  # the same manifold for every set of this d
    a, b = maps.standard_normal((d, WIDTH)), maps.standard_normal((d, WIDTH)) / np.sqrt(d)
    z = np.random.default_rng(seed).standard_normal((n, d))
    return torch.from_numpy(z @ a + np.tanh(z @ b)).float()


def rows(X: torch.Tensor, settings: ProbeSettings) -> dict[str, tuple]:
    out = {}
    for name, value, _std, *more in catalogue.BUILTIN["intrinsic_dimension"].fn(X, settings):
        out[name] = (value, (more[1] if more[1:] else {}).get("se", np.nan))
    return out


def noise_batch_ses(X: torch.Tensor, settings: ProbeSettings) -> dict[str, float]:
    """The noise batches' standard error of TwoNN, GRIDE k16 and the MLE, computed here from
    `metrics.intrinsic_dimension` on batches of 512 (GRIDE to order 16: the probe gives GRIDE
    rows no se, and this is why), as ``std / √(n − 1)`` over the n batches."""
    result = metrics.intrinsic_dimension(X, batch_size=settings.state_batch_size //
                                         settings.noise_splits, max_order=16)
    root = np.sqrt(result.twonn.n_batches - 1)
    return {"twonn": result.twonn.dimension_std / root,
            "gride_k16": result.gride.dimension_std[result.gride.orders.index(16)] / root,
            "mle_dimension": result.mle.dimension_std / root}


def probe_seconds() -> None:
    """Item 4 of the module doc."""
    from bench_probe_cost import _probed_model  # benchmarks/, beside this script

    best = {0: float("inf"), ProbeSettings().noise_splits: float("inf")}
    model, _, callback = _probed_model("gpt_tiny", torch.device("cpu"))
    probes = callback.probes
    for _ in range(3):
        for splits in best:
            callback.settings = dataclasses.replace(callback.settings, noise_splits=splits)
            callback.run(model)  # warm-up
            start = time.perf_counter()
            callback.run(model)
            best[splits] = min(best[splits], time.perf_counter() - start)
    off, on = best.values()
    print(f"one gpt_tiny probe ({probes.n_states} states, torch threads 1): {off:.2f} s without "
          f"noise batches, {on:.2f} s with ({on / off:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[6, 12])
    parser.add_argument("--sets", type=int, default=24)
    parser.add_argument("--probe", action="store_true", help="item 4 only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.probe:
        return probe_seconds()
    on, off = ProbeSettings(), ProbeSettings(noise_splits=0)
    print(f"torch threads 1; {N_STATES} states x {WIDTH} dims per set, batches of "
          f"{on.state_batch_size}, noise batches of {on.state_batch_size // on.noise_splits}")
    for d in args.dims:
        X = states(d, 0)
        seconds = {}
        for label, settings in (("off", off), ("on", on)):
            times = []
            for _ in range(3):
                start = time.perf_counter()
                rows(X, settings)
                times.append(time.perf_counter() - start)
            seconds[label] = min(times)
        print(f"d={d} cost: {seconds['off']:.2f} s per layer without noise batches, "
              f"{seconds['on']:.2f} s with ({seconds['on'] / seconds['off']:.2f}x)")
        found = [rows(states(d, 1 + s), off) for s in range(args.sets)]
        noise = [noise_batch_ses(states(d, 1 + s), on) for s in range(args.sets)]
        for metric in ("twonn", "gride_k16", "mle_dimension"):
            values = np.array([f[metric][0] for f in found])
            ses = np.array([n[metric] for n in noise])
            print(f"  {metric:>13}: value {values.mean():.3f}, its sd over {args.sets} sets "
                  f"{values.std(ddof=1):.4f}; root mean square se from the noise batches "
                  f"{np.sqrt(np.mean(ses**2)):.4f} (ratio "
                  f"{np.sqrt(np.mean(ses**2)) / values.std(ddof=1):.2f})")
        small = metrics.intrinsic_dimension(states(d, 1), batch_size=on.state_batch_size //
                                            on.noise_splits, max_order=on.max_order)
        value = found[0]["twonn"][0]
        print(f"  TwoNN bias: noise batches' mean {small.twonn.dimension:.3f} against the value "
              f"{value:.3f} ({small.twonn.dimension / value - 1:+.1%})")


if __name__ == "__main__":
    main()
