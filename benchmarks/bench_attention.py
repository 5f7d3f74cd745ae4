"""The attention-entropy and Q/K path of a probe: this version against an earlier commit's.

The gpt_small row of `bench_metrics.py` (12 layers of 16 windows x 8 heads x 512 x 512, causal:
`attention_entropy` on the probabilities and `qk_alignment` on the queries and keys), on a few
layers: the earlier commit's `repgeom/metrics/attention.py` (and `qk.py`, where the Q/K half
lives since it was split off) is read from git and timed in the same process, alternating with
the current one, so both see the same machine load. Prints the minimum over repetitions per
layer and the largest relative difference of every number.

    python benchmarks/bench_attention.py --before <commit> [--layers 3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

import repgeom.metrics as current

ROOT = Path(__file__).resolve().parents[1]
FILES = ("src/repgeom/metrics/attention.py", "src/repgeom/metrics/qk.py",
         "src/repgeom/metrics/attention/entropy.py", "src/repgeom/metrics/attention/qk.py")
"""Where the two halves have lived: one file, two files, then the attention/ folder."""


def load_version(commit: str):
    """`attention_entropy` and `qk_alignment` as they were at `commit`, in one module: the
    files of `FILES` that the commit has, run one after the other (relative imports resolve)."""
    name = "repgeom.metrics._attention_before"
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "repgeom.metrics"
    sys.modules[name] = module
    for file in FILES:
        shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{file}"],
                               capture_output=True, text=True)
        if shown.returncode == 0:  # each layout has its own files of these; the rest are absent
            exec(compile(shown.stdout, f"{commit}:{file}", "exec"), module.__dict__)
    return module


def layer(seed: int, B: int, H: int, T: int, D: int):
    """Queries, keys and the causal attention they make (float32, as the probe captures them)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=g)
    k = torch.randn(B, H, T, D, generator=g) + 0.3  # a common drift: scores with a mean
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    probs = (q @ k.transpose(-1, -2) / D**0.5).masked_fill(~mask, -torch.inf).softmax(-1)
    return q, k, probs


def run(module, q, k, probs):
    start = time.perf_counter()
    entropy = module.attention_entropy(probs, causal=True)
    qk = module.qk_alignment(q, k, causal=True)
    return time.perf_counter() - start, entropy, qk


def numbers(entropy, qk) -> dict[str, np.ndarray]:
    fields = ("entropy", "normalized_entropy", "max_prob", "median_prob", "min_prob")
    out = {f: getattr(entropy, f) for f in fields}
    out.update({f: getattr(qk, f) for f in ("cosine", "dot", "score_mean", "score_std",
                                            "score_max_abs")})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="commit of the version to compare with")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shape", type=int, nargs=4, default=(16, 8, 512, 64),
                        metavar=("B", "H", "T", "D"))
    args = parser.parse_args()
    before = load_version(args.before)
    B, H, T, D = args.shape
    print(f"torch threads {torch.get_num_threads()}; {args.layers} layers of "
          f"({B},{H},{T},{T}) causal attention + Q/K of ({B},{H},{T},{D}); "
          f"min of {args.repeats} per layer")
    t_old = t_new = 0.0
    worst: dict[str, float] = {}
    for i in range(args.layers):
        q, k, probs = layer(i, B, H, T, D)
        old_times, new_times = [], []
        for _ in range(args.repeats):
            t, *old = run(before, q, k, probs)
            old_times.append(t)
            t, *new = run(current, q, k, probs)
            new_times.append(t)
        t_old += min(old_times)
        t_new += min(new_times)
        for name, a in numbers(*old).items():
            b = numbers(*new)[name]
            rel = float(np.max(np.abs(a - b) / np.maximum(np.abs(a), 1e-30)))
            worst[name] = max(worst.get(name, 0.0), rel)
    print(f"before ({args.before[:10]}): {t_old:7.2f} s   ({t_old / args.layers:.2f} s per layer)")
    print(f"now:                {t_new:7.2f} s   ({t_new / args.layers:.2f} s per layer)")
    print(f"speed-up: {t_old / t_new:.2f}x")
    print("largest relative difference: "
          + ", ".join(f"{name} {value:.1e}" for name, value in worst.items()))


if __name__ == "__main__":
    main()
