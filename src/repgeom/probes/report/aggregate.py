"""Views of the probe table (`repgeom.probes.core.table`): the single-set rows, means over heads and
over layers, and the summary of a run.

Layer means average over blocks 1..L and leave out layer 0 (the embedding) by default: the
embedding is a lookup table, not a stage of the network, and at step 0 its random geometry would
dominate the mean. The final norm's layer is never part of a mean: it is a rescaled copy of block
L, not a stage of its own. Per-head metrics are averaged over heads first, so every layer weighs
the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from repgeom.probes.core.table import (
    COLUMNS,
    FINAL_NORM,
    NOISE_COLUMNS,
    NOTE,
    PAIR_COLUMNS,
    key_index,
    model_rows,
    rows_to_frame,
)


def is_pairwise(frame: pd.DataFrame) -> bool:
    """Whether `frame` holds rows of a pairwise metric (a second layer, step or run)."""
    return bool(pair_rows(frame).any()) if len(frame) else False


def pair_rows(frame: pd.DataFrame) -> pd.Series:
    """True at the rows of pairwise metrics (`PAIR_COLUMNS` set)."""
    mask = pd.Series(False, index=frame.index)
    for col in PAIR_COLUMNS[:2]:
        if col in frame.columns:
            mask |= frame[col] >= 0
    if "run_b" in frame.columns:
        mask |= frame["run_b"].fillna("").astype(str) != ""
    return mask


def single_set(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` without the pairwise rows and their columns: one value per layer of one set."""
    kept = frame.loc[~pair_rows(frame)] if len(frame) else frame
    return kept.drop(columns=[c for c in PAIR_COLUMNS if c in frame.columns])


def extra_columns(frame: pd.DataFrame) -> list[str]:
    """The columns of `frame` beyond the standard ones (``model``, ``revision``, ...) that name a
    set of rows; the ``note`` column (why a value is NaN) and the noise columns are not."""
    return [c for c in frame.columns if c not in COLUMNS and c != NOTE and c not in NOISE_COLUMNS]


def head_means(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (step, layer, metric, extra columns): per-head values averaged over heads.

    Where a (step, layer, metric) has a row with ``head == -1`` (the metric is not per head, or
    was also reported for the whole layer) that row is kept as it is; otherwise the heads are
    averaged, ``std`` becoming the spread across heads. Output rows have ``head == -1``.
    """
    keys = ["step", "layer", "layer_name", "metric", *extra_columns(frame)]
    if frame.empty:
        return frame.copy()
    whole = frame["head"] == -1
    if whole.all():
        return frame.copy()
    has_whole = key_index(frame, keys).isin(key_index(frame.loc[whole], keys))
    heads = frame.loc[~whole & ~has_whole]
    averaged = _mean_std(heads, keys)
    averaged["head"] = -1
    return rows_to_frame(pd.concat([frame.loc[whole], averaged], ignore_index=True))


def _mean_std(frame: pd.DataFrame, keys: list[str], *, sort: bool = False) -> pd.DataFrame:
    """Per group of `keys`: mean, population std (NaN for a group of one) and count of `value`."""
    grouped = frame.groupby(keys, dropna=False, sort=sort)["value"]
    out = pd.DataFrame(
        {"value": grouped.mean(), "std": grouped.std(ddof=0), "count": grouped.count()}
    )
    out.loc[out["count"] < 2, "std"] = np.nan
    return out.reset_index()


def layer_means(frame: pd.DataFrame, *, include_embedding: bool = False) -> pd.DataFrame:
    """The mean over layers of every metric at every step (per value of any extra column).

    Per-head metrics are first averaged over heads (`head_means`). Layer 0, the embedding, is left
    out unless `include_embedding` (see the module docstring for why).

    Returns
    -------
    DataFrame
        Columns ``step, metric, value, std, n_layers`` and the extra columns; ``std`` is the
        spread across layers (population std), ``n_layers`` how many layers went into the mean.
    """
    frame = single_set(frame)
    per_layer = blocks(head_means(frame), include_embedding=include_embedding)
    keys = ["step", "metric", *extra_columns(frame)]
    if per_layer.empty:
        return pd.DataFrame(columns=[*keys[:2], "value", "std", "n_layers", *keys[2:]])
    means = _mean_std(per_layer, keys, sort=True).rename(columns={"count": "n_layers"})
    return means[["step", "metric", "value", "std", "n_layers", *keys[2:]]]


def blocks(frame: pd.DataFrame, *, include_embedding: bool = False) -> pd.DataFrame:
    """The rows of the transformer blocks (and the embedding if asked): no final-norm layer,
    no rows of the whole model (the LM loss, `table.model_rows`)."""
    keep = (frame["layer_name"] != FINAL_NORM) & ~model_rows(frame)
    if not include_embedding:
        keep &= frame["layer"] >= 1
    return frame.loc[keep]


def _check_one_run(frame: pd.DataFrame, what: str) -> None:
    """Raise when `frame` holds several runs/models at the same step (their rows would mix)."""
    dup = frame.duplicated(["step", "layer", "head", "metric"], keep=False)
    if dup.any():
        varying = [c for c in extra_columns(frame) if frame.loc[dup, c].nunique(dropna=False) > 1]
        hint = (
            "; ".join(f"column {c!r} has {sorted(map(str, frame[c].unique()))}" for c in varying)
            or "the same (step, layer, head, metric) appears twice"
        )
        raise ValueError(f"{what}: the table holds several runs ({hint}); pass one at a time")


def summary(frame: pd.DataFrame) -> dict[str, Any]:
    """The end-of-run summary: peak of the mean intrinsic dimension, final anisotropy profile.

    Parameters
    ----------
    frame : DataFrame
        A tidy table of one run (one model).

    Returns
    -------
    dict
        ``final_step`` (int): the last probed step;
        ``id_peak_step`` (int), ``id_peak_value`` (float): the step at which the layer mean
        (blocks 1..L) of ``twonn`` was largest, and that mean (the earliest such step on ties);
        ``final_anisotropy_step`` (int), ``final_anisotropy_profile`` (list of float, one per
        layer from layer 0 to block L) and ``final_anisotropy_layers`` (list of int): anisotropy
        per layer at the last step it was probed; ``most_anisotropic_layer`` (int) and
        ``most_anisotropic_value`` (float): the argmax of that profile;
        ``final_norm_anisotropy`` (float): the final norm's output at that step, for models
        with one. Keys whose metric (or layer) is absent hold None.

    Raises
    ------
    ValueError
        If the table holds several runs or models at the same step.
    """
    frame = single_set(frame)
    _check_one_run(frame, "summary")
    out: dict[str, Any] = dict.fromkeys(
        [
            "final_step",
            "id_peak_step",
            "id_peak_value",
            "final_anisotropy_step",
            "final_anisotropy_profile",
            "final_anisotropy_layers",
            "most_anisotropic_layer",
            "most_anisotropic_value",
            "final_norm_anisotropy",
        ]
    )
    if frame.empty:
        return out
    out["final_step"] = int(frame["step"].max())

    twonn = layer_means(frame.loc[frame["metric"] == "twonn"]).dropna(subset=["value"])
    if not twonn.empty:
        peak = twonn.sort_values("step").loc[lambda f: f["value"].idxmax()]
        out["id_peak_step"], out["id_peak_value"] = int(peak["step"]), float(peak["value"])

    every = head_means(frame.loc[frame["metric"] == "anisotropy"]).dropna(subset=["value"])
    aniso = blocks(every, include_embedding=True)
    if not aniso.empty:
        out["final_anisotropy_step"] = int(aniso["step"].max())
        final_norm = every.loc[
            (every["layer_name"] == FINAL_NORM) & (every["step"] == aniso["step"].max())
        ]
        if not final_norm.empty:
            out["final_norm_anisotropy"] = float(final_norm["value"].iloc[0])
        last = aniso.loc[aniso["step"] == aniso["step"].max()].sort_values("layer")
        out["final_anisotropy_profile"] = [float(v) for v in last["value"]]
        out["final_anisotropy_layers"] = [int(v) for v in last["layer"]]
        top = last.loc[last["value"].idxmax()]
        out["most_anisotropic_layer"] = int(top["layer"])
        out["most_anisotropic_value"] = float(top["value"])
    return out


def format_summary(result: Mapping[str, Any]) -> str:
    """The `summary` as a few lines for the console."""
    lines = []
    if result.get("id_peak_step") is not None:
        lines.append(
            f"mean intrinsic dimension (TwoNN, blocks 1..L) peaked at step {result['id_peak_step']}"
            f": {result['id_peak_value']:.2f}"
        )
    else:
        lines.append("mean intrinsic dimension: not measured (no 'twonn' rows)")
    if result.get("final_anisotropy_profile") is not None:
        profile = ", ".join(
            f"{layer}: {v:.3f}"
            for layer, v in zip(
                result["final_anisotropy_layers"], result["final_anisotropy_profile"], strict=True
            )
        )
        if result.get("final_norm_anisotropy") is not None:
            profile += f", final norm: {result['final_norm_anisotropy']:.3f}"
        lines.append(f"anisotropy per layer at step {result['final_anisotropy_step']}: {profile}")
        lines.append(
            f"most anisotropic layer: {result['most_anisotropic_layer']} "
            f"({result['most_anisotropic_value']:.3f})"
        )
    else:
        lines.append("anisotropy: not measured (no 'anisotropy' rows)")
    return "\n".join(lines)
