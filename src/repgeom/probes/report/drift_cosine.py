"""Drift norm against mean cosine across layers (Godey et al. 2024, papers/003).

Section 3.3, "To drift or not to drift?": "We study the correlation between the uniformly
measured cosine-similarity, and the norm of the average hidden representation ||x̄||_2 for each
layer. If anisotropy could be directly explained by the drift effect, we would expect a
monotonic relation [...] we apply a Spearman correlation test on these two metrics" (Figure 5);
Appendix A repeats it with Pearson's test (Figure 16), since the rank test "is not robust to
fluctuations [...] when working with such small samples" (one point per layer).

`drift_cosine_correlation` does both on a tidy probe table (`repgeom.probes.core.table`): per probe
step (and per ``model``/``revision``/``run`` when those columns exist), the ``drift_norm`` and
``mean_cosine`` rows of blocks 1..L, paired by layer. The embedding (layer 0, a lookup table)
and the ``final_norm`` layer (a rescaled copy of block L) are left out, as in the table's layer
means; the paper's "for each layer" counts the model's layers.

``probe.py`` writes the result next to its table (`save_drift_cosine`: ``probes/drift_cosine.csv``)
and prints it; the report (`repgeom.experiments.report`) states it per masking in Godey's section.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

__all__ = ["CSV_NAME", "drift_cosine_correlation", "save_drift_cosine", "spearman_p"]

_EXTRA_KEYS = ("model", "revision", "run")
CSV_NAME = "drift_cosine.csv"
"""File name of the correlation table in a probe folder (next to ``probes.csv``)."""


# Up to this many layers Spearman's p is exact: all n! orderings (40,320 at 8) are enumerated.
EXACT_SPEARMAN_MAX_N = 8


def spearman_p(x: np.ndarray, y: np.ndarray) -> float:
    """Two-sided p of Spearman's rho under independence: exact (every ordering of `x` against
    `y`, ties by average ranks) for at most `EXACT_SPEARMAN_MAX_N` points, else scipy's t
    approximation.

    With one point per layer the samples are tiny, and there the t approximation fails:
    for 4 layers it gives p = 0 at rho = 1, where only 2 of the 24 orderings reach |rho| = 1
    (exact p = 1/12), so a 4-layer Spearman test can never reach p < 0.05.

    >>> round(spearman_p(np.arange(4.0), np.arange(4.0)), 4), round(1 / 12, 4)
    (0.0833, 0.0833)
    """
    n = len(x)
    if n > EXACT_SPEARMAN_MAX_N:
        return float(stats.spearmanr(x, y).pvalue)
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    orderings = np.array(list(itertools.permutations(range(n))))
    rhos = (ry[orderings] @ rx) / np.sqrt((rx @ rx) * (ry @ ry))
    observed = abs(float(rx @ ry) / np.sqrt((rx @ rx) * (ry @ ry)))
    return float(np.mean(np.abs(rhos) >= observed - 1e-12))


def drift_cosine_correlation(table: pd.DataFrame, *, include_embedding: bool = False
                             ) -> pd.DataFrame:
    """Spearman and Pearson correlation of drift norm and mean cosine across layers.

    Parameters
    ----------
    table : DataFrame
        Tidy probe table with at least ``step, layer, layer_name, metric, value`` (``head``,
        when present, must be -1 for these per-layer metrics; other heads are ignored).
    include_embedding : bool, keyword-only
        Also use layer 0 (the paper's models count only their layers; off by default).

    Returns
    -------
    DataFrame, one row per step (and model/revision/run when present): ``n_layers``,
    ``spearman_rho``, ``spearman_p`` (exact for few layers: `spearman_p`), ``pearson_r``,
    ``pearson_p``. With fewer than 3 layers or
    a constant series the statistics are NaN.

    Examples
    --------
    >>> rows = [{"step": 0, "layer": i, "layer_name": f"block_{i}", "metric": m, "value": v}
    ...         for i in range(1, 6) for m, v in (("drift_norm", i), ("mean_cosine", i * i))]
    >>> drift_cosine_correlation(pd.DataFrame(rows))[["step", "n_layers", "spearman_rho"]]
       step  n_layers  spearman_rho
    0     0         5           1.0
    """
    need = {"step", "layer", "metric", "value"}
    missing = need - set(table.columns)
    if missing:
        raise ValueError(f"table lacks column(s) {sorted(missing)}")
    t = table[table["metric"].isin(["drift_norm", "mean_cosine"])]
    if "layer_name" in t.columns:
        t = t[t["layer_name"] != "final_norm"]
    if "head" in t.columns:
        t = t[t["head"] == -1]
    t = t[t["layer"] >= (0 if include_embedding else 1)]
    keys = ["step"] + [k for k in _EXTRA_KEYS if k in t.columns]
    rows = []
    for key, g in t.groupby(keys, sort=True, dropna=False):
        wide = g.pivot_table(index="layer", columns="metric", values="value", aggfunc="mean")
        wide = wide.dropna()
        row = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
        n = len(wide) if {"drift_norm", "mean_cosine"} <= set(wide.columns) else 0
        row["n_layers"] = n
        nan = float("nan")
        row.update(spearman_rho=nan, spearman_p=nan, pearson_r=nan, pearson_p=nan)
        if n >= 3:
            x, y = wide["drift_norm"].to_numpy(), wide["mean_cosine"].to_numpy()
            if np.ptp(x) > 0 and np.ptp(y) > 0:
                s = stats.spearmanr(x, y)
                p = stats.pearsonr(x, y)
                row.update(spearman_rho=float(s.statistic), spearman_p=spearman_p(x, y),
                           pearson_r=float(p.statistic), pearson_p=float(p.pvalue))
        rows.append(row)
    return pd.DataFrame(rows, columns=[*keys, "n_layers", "spearman_rho", "spearman_p",
                                       "pearson_r", "pearson_p"])


def save_drift_cosine(table: pd.DataFrame, folder: str | os.PathLike) -> pd.DataFrame:
    """`drift_cosine_correlation` of `table`, written as `CSV_NAME` in `folder` when the table has
    both metrics (``drift`` and ``mean_cosine`` probed); returns it (empty when not written)."""
    metrics = set(table["metric"]) if "metric" in table.columns else set()
    if not {"drift_norm", "mean_cosine"} <= metrics:
        return pd.DataFrame()
    result = drift_cosine_correlation(table)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    result.to_csv(folder / CSV_NAME, index=False)
    return result
