"""The synthetic point sets the intrinsic-dimension tests share (known dimensions)."""

import numpy as np
from sklearn.datasets import make_swiss_roll


def embed(Z: np.ndarray, D: int, rng: np.random.Generator) -> np.ndarray:
    """Embed (n, k) points isometrically into R^D with a random orthonormal frame."""
    Q, _ = np.linalg.qr(rng.normal(size=(D, Z.shape[1])))  # (D, k), orthonormal columns
    return Z @ Q.T


N = 2000  # points per synthetic set: seconds for every reference, big enough for ID ~ 20


def _data(name: str) -> np.ndarray:
    rng = np.random.default_rng(len(name))
    if name == "cube10_in_768":
        return embed(rng.uniform(size=(N, 10)), 768, rng)
    if name == "gauss5":
        return rng.normal(size=(N, 5))
    if name == "gauss5_in_20":
        return embed(rng.normal(size=(N, 5)), 20, rng)
    if name == "gauss20":
        return rng.normal(size=(N, 20))
    if name == "swissroll_in_100":
        Z, _ = make_swiss_roll(N, noise=0.0, random_state=0)
        return embed(Z, 100, rng)
    if name == "gauss64_offset100":
        off = rng.normal(size=64)
        return rng.normal(size=(N, 64)) + 100.0 * off / np.linalg.norm(off)
    raise KeyError(name)


DATASETS = ["cube10_in_768", "gauss5", "gauss20", "swissroll_in_100", "gauss64_offset100"]
