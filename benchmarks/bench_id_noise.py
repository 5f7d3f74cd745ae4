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
   the 2 batches of 4,096: its sd over sets) against the mean of the ``se`` the noise batches
   gave (a ratio near 1: the se is the value's);
3. bias: the mean of the noise batches' estimates against the value (TwoNN reads low on small
   batches: the noise batches' mean is not used, only their spread).

    python benchmarks/bench_id_noise.py               # d = 6 and 12, 24 sets
    python benchmarks/bench_id_noise.py --dims 8 --sets 40
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[6, 12])
    parser.add_argument("--sets", type=int, default=24)
    args = parser.parse_args()
    torch.set_num_threads(1)
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
        found = [rows(states(d, 1 + s), on) for s in range(args.sets)]
        for metric in ("twonn", "gride_k16", "mle_dimension"):
            values = np.array([f[metric][0] for f in found])
            ses = np.array([f[metric][1] for f in found])
            print(f"  {metric:>13}: value {values.mean():.3f}, its sd over {args.sets} sets "
                  f"{values.std(ddof=1):.4f}; mean se from the noise batches {ses.mean():.4f} "
                  f"(ratio {ses.mean() / values.std(ddof=1):.2f})")
        small = metrics.intrinsic_dimension(states(d, 1), batch_size=on.state_batch_size //
                                            on.noise_splits, max_order=on.max_order)
        value = found[0]["twonn"][0]
        print(f"  TwoNN bias: noise batches' mean {small.twonn.dimension:.3f} against the value "
              f"{value:.3f} ({small.twonn.dimension / value - 1:+.1%})")


if __name__ == "__main__":
    main()
