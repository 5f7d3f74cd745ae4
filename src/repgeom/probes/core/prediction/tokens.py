"""Per-token values of a probe step: each probed state's surprisal and local intrinsic
dimension, with its window, position and token; and their rank correlation per layer.

Viswanathan et al. (2025, arXiv 2501.10573) find that a token's local intrinsic dimension
tracks its cross-entropy. With ``settings.per_token=true`` every probe step writes

- ``probes/tokens/step_<n>.parquet``: one row per (state, layer): ``step``, ``layer``,
  ``layer_name``, ``state`` (the state's row in the probe set), ``window``, ``position``,
  ``token`` (its id), ``surprisal`` (nats, `repgeom.probes.core.prediction.lm_loss`: the next
  token's
  under a decoder; NaN without one, and for encoders, whose loss is not read at the probed
  states) and ``local_id`` (the Levina-Bickel MLE on the state's k = 20 nearest neighbours of
  the probe's own search, `repgeom.metrics.intrinsic_dimension.mle.local_mle`; NaN for a state
  merged as a duplicate), plus the ``model``/``revision`` columns of probe.py;
- ``probes/token_id_surprisal.csv``: per step and layer, ``n`` and Spearman's ``rho`` and ``p``
  of surprisal against local ID (`correlation`), beside ``drift_cosine.csv``.

Bounded: float32 values and int32 ids, about 10 bytes per (state, layer) row compressed, so
the quickstart's 8,192 states x 7 layers take about 0.5 MB a step (40 steps: 20 MB). Off by
default (`ProbeSettings.per_token`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from repgeom.files import atomic_write

TOKENS_DIR = "tokens"
CSV_NAME = "token_id_surprisal.csv"
"""The correlation table's file name, in the probe folder (next to ``probes.csv``)."""


@dataclass
class TokenStates:
    """The per-token values of one probe step (see the module docstring), ``S`` states."""

    window: np.ndarray
    position: np.ndarray
    token: np.ndarray
    surprisal: np.ndarray
    local_id: list
    layer_names: list

    @classmethod
    def of(cls, positions, windows, surprisal: np.ndarray | None, local_ids: Sequence,
           layer_names: Sequence[str]) -> TokenStates:
        """From the probe set's marked `positions` (window order, then position order: the
        order of the states) in `windows`, the states' surprisals (None: NaN) and each layer's
        local IDs (None for a layer without: NaN)."""
        window, position = (np.asarray(a) for a in positions.cpu().nonzero(as_tuple=True))
        n = len(window)
        surprisal = np.full(n, np.nan) if surprisal is None else np.asarray(surprisal)
        ids = [np.full(n, np.nan) if v is None else np.asarray(v) for v in local_ids]
        return cls(window, position, windows.cpu().numpy()[window, position], surprisal, ids,
                   list(layer_names))

    def frame(self, step: int, id_columns: Mapping[str, Any] | None = None) -> pd.DataFrame:
        """The long table: one row per (state, layer)."""
        n = len(self.window)
        parts = []
        for layer, ids in enumerate(self.local_id):
            parts.append(pd.DataFrame({
                "step": np.full(n, step, dtype=np.int64), "layer": np.full(n, layer, np.int16),
                "layer_name": self.layer_names[layer], "state": np.arange(n, dtype=np.int32),
                "window": self.window.astype(np.int32), "position": self.position.astype(np.int32),
                "token": self.token.astype(np.int32),
                "surprisal": self.surprisal.astype(np.float32), "local_id": ids.astype(np.float32),
            }))
        out = pd.concat(parts, ignore_index=True)
        out["layer_name"] = out["layer_name"].astype("category")
        for key, value in (id_columns or {}).items():
            out[key] = "" if value is None else str(value)
        return out


def correlation(frame: pd.DataFrame) -> pd.DataFrame:
    """Spearman's rank correlation of ``surprisal`` and ``local_id`` per step and layer (and
    ``model``/``revision``), over the states where both are finite: columns ``n``, ``rho``,
    ``p`` (NaN with fewer than 3 such states)."""
    keys = ["step", *[c for c in ("model", "revision") if c in frame.columns], "layer",
            "layer_name"]
    rows = []
    for key, part in frame.groupby(keys, sort=True, observed=True):
        both = part[["surprisal", "local_id"]].astype(np.float64)
        both = both[np.isfinite(both).all(axis=1)]
        rho = p = np.nan
        if len(both) >= 3:
            result = stats.spearmanr(both["surprisal"], both["local_id"])
            rho, p = float(result.statistic), float(result.pvalue)
        rows.append({**dict(zip(keys, key, strict=True)), "n": len(both), "rho": rho, "p": p})
    return pd.DataFrame(rows, columns=[*keys, "n", "rho", "p"])


def save_step(probe_folder: str | os.PathLike, step: int, tokens: TokenStates,
              id_columns: Mapping[str, Any] | None = None) -> Path:
    """Write one step's ``tokens/step_<n>.parquet`` and its rows of ``token_id_surprisal.csv``
    (a step probed again replaces its rows); returns the parquet file."""
    folder = Path(probe_folder)
    (folder / TOKENS_DIR).mkdir(parents=True, exist_ok=True)
    frame = tokens.frame(step, id_columns)
    suffix = "".join(f"_{str(v).replace('/', '_')}" for v in (id_columns or {}).values() if v)
    path = folder / TOKENS_DIR / f"step_{int(step)}{suffix}.parquet"
    atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))  # fenced, fsynced
    table = correlation(frame)
    csv = folder / CSV_NAME
    if csv.is_file():
        old = pd.read_csv(csv, dtype={c: str for c in ("model", "revision")})
        same = old["step"] == step
        for key, value in (id_columns or {}).items():
            if key in old.columns:
                same = same & (old[key].fillna("").astype(str) == ("" if value is None
                                                                   else str(value)))
        table = pd.concat([old.loc[~same], table], ignore_index=True)
    atomic_write(csv, lambda tmp: table.to_csv(tmp, index=False))
    return path
