"""The ID-against-scale profile and its plateau on synthetic sets whose dimension is known at
each scale (issue 28).

Each set has 8,192 points, the probe's states per layer, and goes through the probe's own entry
(`catalogue.BUILTIN["id_scales"]`, and ``intrinsic_dimension`` for GRIDE's IDs, with the default
`ProbeSettings`: TwoNN by decimation of the whole set, GRIDE k = 2..64 on two batches of 4,096,
the plateau over both). Printed: the profile
(scale = mean neighbour distance, ID, its noise), the plateau found, and the truth at each scale.

- ``plane+noise``: a unit square (2-D) in R^12 with Gaussian noise of std 0.003 in the 10 other
  directions. At the noise's own scale (two points differ by ~0.003 * sqrt(20) = 0.013 from the
  noise alone) and below, the set is 12-D; from ~5x that (0.06) up to the square's side it is
  2-D. The smallest scale of 8,192 points (0.014) sits in the crossover.
- ``sphere-curve``: a spherical spiral of 20 turns on the unit sphere in R^3 (a curve on a
  sphere). Along the curve neighbours are ~0.01 apart: 1-D below the spacing of the turns
  (pi / 20 = 0.16, so up to ~0.05); 2-D (the sphere) from ~0.2 to where curvature bends it (~1).
- ``clusters``: 16 Gaussian blobs, each 3-D (std 0.05 in a random 3-D subspace of R^30) around
  centres ~7.7 apart: 3-D below the blob size (0.05 * sqrt(3) = 0.09); above it the decimated
  subsets hold a point or two per blob and read the arrangement of 16 centres (no manifold).

    python benchmarks/bench_id_scales.py [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

from repgeom.probes.core import catalogue
from repgeom.probes.core.measure import ProbeSettings

N = 8192


def embed(Z: np.ndarray, D: int, rng: np.random.Generator) -> np.ndarray:
    """Z (n, k) isometrically into R^D with a random orthonormal frame."""
    Q, _ = np.linalg.qr(rng.normal(size=(D, Z.shape[1])))
    return Z @ Q.T


def plane_with_noise(rng: np.random.Generator) -> np.ndarray:
    X = np.zeros((N, 12))
    X[:, :2] = rng.uniform(size=(N, 2))
    X[:, 2:] = 0.003 * rng.normal(size=(N, 10))
    return X


def sphere_curve(rng: np.random.Generator) -> np.ndarray:
    t = rng.uniform(size=N)
    theta, phi = math.pi * t, 2 * math.pi * 20 * t
    return np.stack([np.sin(theta) * np.cos(phi), np.sin(theta) * np.sin(phi), np.cos(theta)], 1)


def clusters(rng: np.random.Generator) -> np.ndarray:
    centres = rng.normal(size=(16, 30))
    parts = [c + embed(0.05 * rng.normal(size=(N // 16, 3)), 30, rng) for c in centres]
    return np.concatenate(parts)


SETS = {
    "plane+noise": (plane_with_noise, "12 up to ~0.013 (the noise), 2 from ~0.06 to ~0.3 (the "
                                      "square)"),
    "sphere-curve": (sphere_curve, "1 below ~0.05 (along the curve), 2 from ~0.2 to ~1 (the "
                                   "sphere)"),
    "clusters": (clusters, "3 below ~0.09 (inside a blob), none above (16 centres)"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    settings = ProbeSettings(metrics=["id_scales"])
    entries = [catalogue.BUILTIN[name] for name in ("intrinsic_dimension", "id_scales")]
    summary = []
    for name, (make, truth) in SETS.items():
        X = torch.tensor(make(np.random.default_rng(args.seed)), dtype=torch.float32)
        start = time.perf_counter()
        rows = {r[0]: r[1:] for entry in entries for r in entry.fn(X, settings)}
        seconds = time.perf_counter() - start
        print(f"\n{name} ({X.shape[0]} x {X.shape[1]}, {seconds:.1f} s); truth: {truth}")
        print(f"  {'estimate':<14}{'scale':>10}{'ID':>8}{'noise':>8}")
        points = []
        for key in rows:
            if key.endswith("_scale"):
                estimate = key.removesuffix("_scale")
                points.append((rows[key][0], estimate, *rows[estimate][:2]))
        for scale, estimate, dim, noise in sorted(points):
            print(f"  {estimate:<14}{scale:>10.4f}{dim:>8.2f}{noise:>8.3f}")
        dim, lo, hi = (rows[k][0] for k in ("id_plateau", "id_plateau_lo", "id_plateau_hi"))
        reason = rows["id_plateau"][2] if len(rows["id_plateau"]) > 2 else ""
        found = (f"plateau ID {dim:.2f} over scales {lo:.4f} .. {hi:.4f}" if np.isfinite(dim)
                 else f"no plateau ({reason})")
        print(f"  found: {found}")
        summary.append((name, found, truth))
    print("\nsummary")
    for name, found, truth in summary:
        print(f"  {name:<13} {found}; truth: {truth}")


if __name__ == "__main__":
    main()
