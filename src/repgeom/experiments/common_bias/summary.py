"""What the sweep of experiment 4 says: the drift's fixed point N* and the per-stage summary.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
import pandas as pd

from repgeom.experiments.common_bias.sweep import COLUMNS


@dataclass(frozen=True)
class FixedPoint:
    """Where the drift gain crosses 1 (see the module docstring and `drift_fixed_point`).

    value : N* (the first clear crossing), or None when the sweep brackets no clear crossing.
    stable : True when g > 1 below N* and g < 1 above (drift pulled towards N*); None if no N*.
    crossings : every crossing of g = 1 found, clear or not, in increasing N.
    reason : why ``value`` is None; None otherwise.
    transparent_from : smallest swept N from which |g - 1| <= tol for every larger swept N
        (the block then passes the common bias on almost unchanged); None if never.
    """

    value: float | None
    stable: bool | None
    crossings: tuple[float, ...]
    reason: str | None
    transparent_from: float | None


def drift_fixed_point(norms, gains, *, tol: float = 0.01) -> FixedPoint:
    """N* where the drift gain ``g(N) = D_out / D_in`` crosses 1, interpolated in log-log.

    Between swept norms ``N_i < N_{i+1}`` (both > 0) where ``log g`` changes sign,
    ``log N* = log N_i - log g_i * (log N_{i+1} - log N_i) / (log g_{i+1} - log g_i)``; a swept
    norm with ``g = 1`` exactly is a crossing itself. N* is the first *clear* crossing: one with
    ``|g - 1| > tol`` at some swept norm on each side of it, so that the block really amplifies
    the bias below N* and really shrinks (or amplifies) it above. A pre-LN block adds a small
    bias-independent vector ``c`` to the residual stream, so ``g = ||N u + c|| / N -> 1`` with a
    sign of ``g - 1`` that depends on ``c . u``, i.e. on the seed: such crossings, within ``tol``
    of 1 on one side, are listed in ``crossings`` but do not make an N*.

    Parameters
    ----------
    norms, gains : sequences of float, same length
        Swept bias norms (any order; N = 0 is ignored) and the drift gain at each (> 0).
    tol : float, keyword-only
        Relative departure of ``g`` from 1 that counts as amplifying or shrinking (0.01).

    Returns
    -------
    FixedPoint

    Examples
    --------
    >>> fp = drift_fixed_point([1.0, 10.0, 100.0], [4.0, 2.0, 0.5])
    >>> round(fp.value, 3), fp.stable
    (31.623, True)
    >>> drift_fixed_point([1.0, 10.0], [3.0, 2.0]).value is None
    True
    >>> drift_fixed_point([1.0, 10.0, 100.0], [3.0, 0.999, 0.9999]).value is None  # marginal
    True
    """
    N = np.asarray(list(norms), dtype=np.float64)
    g = np.asarray(list(gains), dtype=np.float64)
    if N.ndim != 1 or g.shape != N.shape:
        raise ValueError(
            f"norms and gains must be 1-D of the same length, got {N.shape} and {g.shape}"
        )
    if not (np.all(np.isfinite(g)) and np.all(g > 0)):
        raise ValueError(f"gains must be finite and > 0, got {g.tolist()}")
    if not (isinstance(tol, numbers.Real) and 0 < tol < 1):
        raise ValueError(f"tol must be in (0, 1), got {tol!r}")
    keep = N > 0
    N, g = N[keep], g[keep]
    order = np.argsort(N)
    N, g = N[order], g[order]
    if N.size < 2:
        return FixedPoint(None, None, (), "needs at least two swept norms > 0", None)
    x, y = np.log(N), np.log(g)
    off = np.abs(g - 1.0) > tol  # swept norms where the block clearly changes the drift norm
    crossings = []  # (N*, index of the last swept norm below or at it, stable)
    for i in range(N.size):
        if y[i] == 0.0:
            below = y[i - 1] > 0 if i > 0 else y[i + 1] < 0
            crossings.append((float(N[i]), i, bool(below)))
        elif i + 1 < N.size and y[i] * y[i + 1] < 0:
            n_star = float(np.exp(x[i] - y[i] * (x[i + 1] - x[i]) / (y[i + 1] - y[i])))
            crossings.append((n_star, i, bool(y[i] > 0)))
    transparent = None
    close = ~off
    if close[-1]:
        start = N.size - 1
        while start > 0 and close[start - 1]:
            start -= 1
        transparent = float(N[start])
    all_crossings = tuple(c[0] for c in crossings)
    for n_star, i, stable in crossings:
        lower = off[: i + 1] & (N[: i + 1] < n_star)
        if lower.any() and off[i + 1 :].any():
            return FixedPoint(n_star, stable, all_crossings, None, transparent)
    side = "amplifies" if y[0] > 0 else "shrinks"
    if crossings:
        reason = (
            f"the drift gain crosses 1 only marginally (at N = "
            f"{', '.join(f'{c:.3g}' for c in all_crossings)}, with |g - 1| <= {tol:.0%} on one "
            f"side over the sweep [{N[0]:.3g}, {N[-1]:.3g}]): no clear fixed point"
        )
    else:
        reason = (
            f"the block {side} the common component at every swept N in [{N[0]:.3g}, "
            f"{N[-1]:.3g}] (drift gain from {g.min():.4g} to {g.max():.4g}), so the sweep "
            "brackets no N*"
        )
    if transparent is not None:
        reason += (
            f"; from N = {transparent:.3g} on the gain stays within {tol:.0%} of 1 "
            "(the block passes the bias on almost unchanged)"
        )
    return FixedPoint(None, None, all_crossings, reason, transparent)


STAGES = {"one_block": "one block", "all_blocks": "through all blocks"}


_HEADLINE = [
    "cos_in", "cos_out", "norm_in", "norm_out", "norm_ratio", "drift_in", "drift_out",
    "drift_gain", "score_std", "score_max_abs", "prob_max", "prob_median", "prob_min",
    "normalized_entropy",
]


def stage_layers(frame: pd.DataFrame) -> dict[str, int]:
    n_layer = int(frame["n_layer"].iloc[0])
    present = set(frame["layer"].unique())
    stages = {}
    if 0 in present:
        stages["one_block"] = 0
    if n_layer - 1 in present:
        stages["all_blocks"] = n_layer - 1
    return stages


def per_norm(frame: pd.DataFrame, layer: int) -> pd.DataFrame:
    """One row per norm for `layer`, attention columns averaged over heads."""
    return (
        frame[frame["layer"] == layer]
        .groupby("norm", sort=True)[_HEADLINE + ["cos_baseline"]]
        .mean()
        .reset_index()
    )


def summarize(frame: pd.DataFrame) -> dict:
    """N* and the headline numbers of a `common_bias_sweep` table, as a JSON-ready dict.

    For each stage ("one_block": output of block 0; "all_blocks": output of the last block)
    present in the table: the `FixedPoint` of the drift gain, and the head-averaged measures
    at the smallest and the largest swept N. Also the attention trend across the sweep (does
    the softmax row max grow, the row min fall, the score spread grow from the smallest to the
    largest N?).
    """
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"frame lacks columns {missing}; pass a common_bias_sweep table")
    if frame.empty:
        raise ValueError("frame is empty")
    first = frame.iloc[0]
    out = {
        "model": str(first["model"]),
        "norm_position": str(first["norm_position"]),
        "causal": bool(first["causal"]),
        "n_embd": int(first["n_embd"]),
        "n_layer": int(first["n_layer"]),
        "n_head": int(first["n_head"]),
        "norms": sorted(float(v) for v in frame["norm"].unique()),
        "cos_baseline": float(first["cos_baseline"]),
        "stages": {},
    }
    for stage, layer in stage_layers(frame).items():
        per = per_norm(frame, layer)
        fp = drift_fixed_point(per["norm"], per["drift_gain"])
        lo, hi = per.iloc[0], per.iloc[-1]
        out["stages"][stage] = {
            "label": STAGES[stage],
            "layer": layer,
            "n_star": fp.value,
            "n_star_stable": fp.stable,
            "n_star_crossings": list(fp.crossings),
            "n_star_reason": fp.reason,
            "transparent_from": fp.transparent_from,
            "max_abs_cos_change": float((per["cos_out"] - per["cos_in"]).abs().max()),
            "at_min_norm": {"norm": float(lo["norm"]), **{k: float(lo[k]) for k in _HEADLINE}},
            "at_max_norm": {"norm": float(hi["norm"]), **{k: float(hi[k]) for k in _HEADLINE}},
            "attention_sharpens": bool(
                hi["prob_max"] > lo["prob_max"] and hi["prob_min"] < lo["prob_min"]
            ),
            "score_std_grows": bool(hi["score_std"] > lo["score_std"]),
        }
    return out
