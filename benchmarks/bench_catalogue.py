"""Cost of every catalogue entry per layer and probe: seconds on 4096 x 128 and 4096 x 512 states.

Each entry is timed as the probe runs it (`repgeom.probes.core.measure`): a state metric on one
batch
of ``state_batch_size`` = 4096 states (the default probe holds two such batches per layer, so a
layer costs about twice this), a pairwise one on one pair of layers (a probe of L + 2 layers
computes (L + 2)(L + 3)/2 pairs). Attention and Q/K entries read whole windows, not states, and
are timed by `bench_probe_cost.py` with the rest of the probe. States are Gaussian with a
decaying spectrum (an anisotropic cloud like a trained layer's); the times hardly depend on it.

    python benchmarks/bench_catalogue.py [--repeats 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import torch

from repgeom.probes.core import catalogue
from repgeom.probes.core.measure import ProbeSettings, pair_value, per_batch

SHAPES = ((4096, 128), (4096, 512))


def states(n: int, d: int, seed: int, device: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    scale = torch.linspace(1.0, 0.05, d)
    return (torch.randn(n, d, generator=generator) * scale).to(device)


def seconds(fn, repeats: int) -> float:
    fn()  # warm-up (caches, FAISS index set-up)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    settings = ProbeSettings(metrics=["all"], distributions=True)
    split = [torch.arange(4096)]
    print(f"{'metric':<22}{'reads':<8}{'training':<10}"
          + "".join(f"{f'{n}x{d} (s)':>16}" for n, d in SHAPES))
    for entry in catalogue.BUILTIN.values():
        if entry.reads in ("attention", "qk"):
            continue
        cells = []
        for n, d in SHAPES:
            X, Y = states(n, d, 0, args.device), states(n, d, 1, args.device)
            if entry.reads == "pair":
                run = lambda e=entry, X=X, Y=Y: pair_value(e, X, Y, split)  # noqa: E731
            elif entry.batched:
                run = lambda e=entry, X=X: per_batch(e, [X])  # noqa: E731
            else:
                run = lambda e=entry, X=X: e.fn(X, settings)  # noqa: E731
            cells.append(seconds(run, args.repeats))
        training = "default" if entry.training else "all only"
        print(f"{entry.name:<22}{entry.reads:<8}{training:<10}"
              + "".join(f"{c:>16.4f}" for c in cells))


if __name__ == "__main__":
    main()
