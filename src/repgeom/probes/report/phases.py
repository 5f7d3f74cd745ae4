"""Phases of a trajectory: when the intrinsic dimension expands, peaks and compresses.

Razzhigaev et al. 2023 (Figs. 2-4) and Godey et al. 2024 (section 5) read the same story off
every training trajectory: the intrinsic dimension of the hidden states rises early in training
(expansion), peaks, then falls (compression). This module finds those phases in any probe table
with several steps (the training probe's, or ``probe.py``'s over checkpoints or hub revisions),
per layer and for the layer mean (blocks 1..L, as `repgeom.probes.report.aggregate.layer_means`;
the final
norm and the embedding are left out of the mean, and kept as layers of their own).

A turn is decided by `repgeom.probes.report.turn_test`: a change from step a to step b counts
when it beats the points' standard errors by a threshold taken from the largest fall (or rise)
anywhere along a flat curve of the trajectory's length, so a curve whose true mean never falls
gets a false ``expansion_to_compression`` turn in at most 5% of trajectories, whatever its length
(that module's doc says how, and where the standard errors come from: the table's ``se`` column,
or its ``std`` over ``n_batches`` batches). With several seeds the seeds' own disagreement (the
residual of the step × seed layout) carries the test, the batch noise a floor, and the change
must also clear the seed interval. Where the noise is unknown (one seed, no std) or has less
than one degree of freedom, nothing is decided. The 5% is per curve, with no correction across
the curves of a run (its W&B alerts have one: `repgeom.probes.report.phase_report.PhaseWatch`);
with one seed a turn is one of that run's curve, its training wiggles included.

The curve is followed step by step, as one watching a run would (a zigzag with that tolerance):

- *undecided* (phase 0) until it has risen from its lowest point so far, or fallen from its
  highest, by more than the noise; then *expanding* (+1) or *compressing* (−1);
- while expanding, the highest point since the rise is tracked; when the curve has fallen from it
  by more than the noise, that point is an ``expansion_to_compression`` turn (confirmed at the
  step where the fall was seen) and the phase becomes −1; the same the other way round
  (``compression_to_expansion``, at the lowest point).

So a turn's step is that of the extreme point, and the online phase at a step uses only the
steps up to it (the training callback logs it at each probe): it stays +1 past a peak until the
fall is beyond the noise. Every curve also has one ``peak`` row: the step of the largest mean
over seeds (the earliest on ties), whether or not it is a turn.

`find_phases` returns the events, `phase_by_step` the online phase at every step; both take one
table, or a list of tables of the same trajectory in several seeds (the mean over seeds is
followed, with the seed interval in the noise).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from repgeom.probes.core import catalogue, table
from repgeom.probes.report import aggregate, noise, turn_test

EXPANDING, COMPRESSING, UNDECIDED = 1, -1, 0
"""The phase values: rising beyond the noise, falling beyond the noise, not decided yet."""
PEAK = "peak"
TO_COMPRESSION = "expansion_to_compression"
TO_EXPANSION = "compression_to_expansion"
MEAN_LAYER = -1
MEAN_NAME = "mean"
"""`layer` and `layer_name` of the layer mean (blocks 1..L) in the phase tables."""
PHASE_METRICS = catalogue.wandb_metrics("peak")
"""The intrinsic dimensions followed (twonn, the catalogue's GRIDE member and, where the table has
the scale profile, the plateau's ID ``id_plateau``), where present."""
GROUP_COLUMNS = ("model", "run")
"""Columns that name one trajectory in a table (``revision`` changes along it: not one)."""

EVENT_COLUMNS = ("metric", "layer", "layer_name", "event", "step", "value", "confirmed_step",
                 "n_seeds")
STEP_COLUMNS = ("metric", "layer", "layer_name", "step", "value", "phase")


@dataclass
class Followed:
    """One curve followed step by step (`follow`)."""

    steps: list[int]
    mean: np.ndarray  # (n_steps,) the mean over seeds
    phase: np.ndarray  # (n_steps,) the online phase after each step
    turns: list[tuple[str, int, int]] = field(default_factory=list)
    """(event, position of the extreme point, position where the turn was confirmed)."""
    peak: int = 0
    n_seeds: int = 1


def follow(values: pd.DataFrame, ses: pd.DataFrame, dfs: pd.DataFrame, *,
           n_steps: int | None = None, level: float = noise.LEVEL,
           rate: float = turn_test.FALSE_TURN_RATE) -> Followed:
    """Follow one curve (index: the steps, sorted; one column per seed) as the module doc says.

    Parameters
    ----------
    values, ses, dfs : DataFrame, shape (n_steps, n_seeds)
        Values, standard errors and their degrees of freedom (`turn_test.standard_errors`); a step
        with a NaN value in any seed is left out.
    n_steps : int, optional
        The trajectory's length the false-turn rate is controlled over (default: the steps here).
    level : float
        Coverage of the seed interval a change must also clear.
    rate : float
        The false-turn rate per curve.
    """
    keep = values.notna().all(axis=1).to_numpy()
    grids = [frame.reindex_like(values).to_numpy(dtype=float)[keep]
             for frame in (values, ses, dfs)]
    steps = [int(x) for x in values.index[keep]]
    return follow_arrays(steps, *grids, n_steps=n_steps, level=level, rate=rate)


def follow_arrays(steps: list[int], v: np.ndarray, se: np.ndarray, df: np.ndarray, *,
                  n_steps: int | None = None, level: float = noise.LEVEL,
                  rate: float = turn_test.FALSE_TURN_RATE) -> Followed:
    """`follow` on (K, n_seeds) arrays without NaN values (the calibration benchmark's fast
    path: the same decisions)."""
    test = turn_test.curve_test(v, se, df, n_steps=n_steps, level=level, rate=rate)
    mean = test.mean
    out = Followed(steps, mean, np.zeros(len(v), dtype=int), n_seeds=int(v.shape[1]))
    if not len(v):
        return out
    out.peak = int(np.argmax(mean))
    beats = test.beats  # v(end) − v(start) beats the noise

    state, low, high, extreme = UNDECIDED, 0, 0, 0
    for j in range(1, len(v)):
        if state == UNDECIDED:
            rose, fell = beats(low, j), beats(j, high)
            if rose and fell:  # both at once: the earlier extreme came first
                turn = (TO_COMPRESSION, high) if low < high else (TO_EXPANSION, low)
                out.turns.append((turn[0], turn[1], j))
                state, extreme = (COMPRESSING if turn[0] == TO_COMPRESSION else EXPANDING), j
            elif rose:
                state, extreme = EXPANDING, low + int(np.argmax(mean[low:j + 1]))
            elif fell:
                state, extreme = COMPRESSING, high + int(np.argmin(mean[high:j + 1]))
            else:
                low = j if mean[j] < mean[low] else low
                high = j if mean[j] > mean[high] else high
        elif state == EXPANDING:
            if mean[j] >= mean[extreme]:
                extreme = j
            elif beats(j, extreme):
                out.turns.append((TO_COMPRESSION, extreme, j))
                state, extreme = COMPRESSING, extreme + int(np.argmin(mean[extreme:j + 1]))
        else:
            if mean[j] <= mean[extreme]:
                extreme = j
            elif beats(extreme, j):
                out.turns.append((TO_EXPANSION, extreme, j))
                state, extreme = EXPANDING, extreme + int(np.argmax(mean[extreme:j + 1]))
        out.phase[j] = state
    return out


def _as_tables(frame: pd.DataFrame | Sequence[pd.DataFrame]) -> list[pd.DataFrame]:
    tables = [frame] if isinstance(frame, pd.DataFrame) else list(frame)
    if not tables:
        raise ValueError("frame: no table given")
    # the layers' rows only: the LM loss rows are no layer, nor the layer mean (MEAN_LAYER)
    return [_without_copies(table.layer_rows(aggregate.single_set(table.rows_to_frame(t))))
            for t in tables]


def _without_copies(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of revisions that serve another revision's weights left out
    (``weights_copy_of``, `repgeom.probes.run.copies.mark_copies`): a stretch of copies is
    flat, and a flat stretch between real steps would read as a phase."""
    if COPY_COLUMN not in frame.columns:
        return frame
    copied = frame[COPY_COLUMN].fillna("").astype(str) != ""
    return frame.loc[~copied]


COPY_COLUMN = "weights_copy_of"
"""The table column that marks a copy (written by `repgeom.probes.run.copies`)."""


def _curves(frame, metrics, level, n_steps, rate=turn_test.FALSE_TURN_RATE, mean_only=False
            ) -> Iterator[tuple[dict, str, int, str, Followed]]:
    """(trajectory ids, metric, layer, layer_name, followed curve) of every curve (of the layer
    means only, with `mean_only`)."""
    tables = _as_tables(frame)
    ids = [c for c in GROUP_COLUMNS if c in tables[0].columns]
    keys = tables[0][ids].drop_duplicates().to_dict("records") if ids else [{}]
    wanted = PHASE_METRICS if metrics is None else tuple(metrics)
    for key in keys:
        group = [t.loc[np.logical_and.reduce([t[c] == v for c, v in key.items()])] if key else t
                 for t in tables]
        noise.check_steps({str(key) or "table": group})
        for metric in wanted:
            if not all((t["metric"] == metric).any() for t in group):
                continue
            stacked = _per_seed(group, metric)
            blocks = stacked.loc[(stacked["layer_name"] != table.FINAL_NORM)
                                 & (stacked["layer"] >= 1)]
            if len(blocks):
                grids = _layer_mean_grids(blocks)
                yield key, metric, MEAN_LAYER, MEAN_NAME, follow(*grids, n_steps=n_steps,
                                                                 level=level, rate=rate)
            if mean_only:
                continue
            for (layer, name), part in stacked.groupby(["layer", "layer_name"], sort=True):
                grids = [part.pivot(index="step", columns=noise.SEED, values=column)
                         .sort_index() for column in ("value", "se", "df")]
                yield key, metric, int(layer), str(name), follow(*grids, n_steps=n_steps,
                                                                 level=level, rate=rate)


def _per_seed(tables: list[pd.DataFrame], metric: str) -> pd.DataFrame:
    """`noise.per_seed`'s rows of `metric` with each row's standard error and degrees of freedom
    (`turn_test.standard_errors`) as columns ``se`` and ``df`` (over heads: the root mean square
    of the heads' se, the smallest df)."""
    parts = []
    for seed, frame in enumerate(tables):
        rows = frame.loc[frame["metric"] == metric].copy()
        rows["se"], rows["df"] = turn_test.standard_errors(rows)
        keys = ["step", "layer", "layer_name"]
        whole = rows.loc[rows["head"] == -1, [*keys, "value", "se", "df"]]
        heads = rows.loc[rows["head"] >= 0]
        if not heads.empty and whole.empty:
            grouped = heads.groupby(keys)
            whole = pd.DataFrame({"value": grouped["value"].mean(),
                                  "se": grouped["se"].agg(_rms_or_nan),
                                  "df": grouped["df"].min(skipna=False)}).reset_index()
        parts.append(whole.assign(**{noise.SEED: seed}))
    return pd.concat(parts, ignore_index=True).sort_values([noise.SEED, "step", "layer"],
                                                           ignore_index=True)


def _rms_or_nan(values: pd.Series) -> float:
    """Root mean square; NaN when any value is unknown (the noise of the whole is unknown)."""
    return float(np.sqrt(np.mean(values.to_numpy(dtype=float) ** 2)))


def _layer_mean_grids(blocks: pd.DataFrame) -> list[pd.DataFrame]:
    """(step, seed) grids of the layer mean: its value (the mean over a fixed set of blocks:
    those read at every step in every seed), standard error (the root mean square of theirs: an
    upper bound whatever the blocks' correlation; unknown if any has none) and degrees of freedom
    (the smallest). A mean over whichever blocks are read at each step would jump where one
    goes missing, and read as a turn; with no block read throughout, the grids are empty."""
    steps = blocks.groupby("step").ngroups
    seeds = blocks[noise.SEED].nunique()
    finite = blocks.loc[blocks["value"].notna()].groupby("layer").size()
    always = finite.index[finite == steps * seeds]
    read = blocks.loc[blocks["layer"].isin(always)]
    grouped = read.groupby(["step", noise.SEED])
    values = grouped["value"].mean().unstack(noise.SEED).sort_index()
    ses = grouped["se"].agg(_rms_or_nan).unstack(noise.SEED).reindex_like(values)
    dfs = grouped["df"].min(skipna=False).unstack(noise.SEED).reindex_like(values)
    return [values, ses, dfs]


def find_phases(
    frame: pd.DataFrame | Sequence[pd.DataFrame],
    *,
    metrics: Sequence[str] | None = None,
    level: float = noise.LEVEL,
    n_steps: int | None = None,
    rate: float = turn_test.FALSE_TURN_RATE,
    mean_only: bool = False,
) -> pd.DataFrame:
    """The peak and the turns of the intrinsic dimension, per layer and for the layer mean.

    Parameters
    ----------
    frame : DataFrame, or list of DataFrame
        A probe table (`repgeom.probes.core.table`) with several steps, or one table per seed of the
        same trajectory (probed at the same steps). Tables with several models or runs (a
        ``model``/``run`` column) give each its own rows.
    metrics : list of str, optional
        Default `PHASE_METRICS` (twonn, gride_k16, id_plateau), those present.
    level : float
        Coverage of the seed interval a change must also clear (several seeds).
    n_steps : int, optional
        The length of the whole trajectory, over which the false-turn rate is controlled
        (`turn_test`); default the steps in the table. The training probe passes its schedule's
        length, so the turns it sees online are the ones the finished run will show.
    rate : float
        The false-turn rate per curve (`turn_test`); lower it to control a family of curves
        (`repgeom.probes.report.phase_report.PhaseWatch` does, for its alerts).
    mean_only : bool
        Follow the layer means only.

    Returns
    -------
    DataFrame
        One row per event: the ``model``/``run`` columns where the table has them, then
        ``metric``, ``layer`` (-1 for the mean), ``layer_name`` (``mean`` for it), ``event``
        (``peak``, ``expansion_to_compression``, ``compression_to_expansion``), ``step`` (the
        extreme point), ``value`` (the mean over seeds there), ``confirmed_step`` (the step at
        which the turn was beyond the noise; missing for a peak), ``n_seeds``. Sorted by
        trajectory, metric, layer (the mean first) and step.

    Examples
    --------
    >>> rows = [dict(step=s, layer=1, metric="twonn", value=v, std=0.1)
    ...         for s, v in zip([0, 10, 20, 30, 40], [2.0, 5.0, 9.0, 6.0, 3.0])]
    >>> found = find_phases(pd.DataFrame(rows))
    >>> found.loc[found["layer"] == -1, ["event", "step", "confirmed_step"]].to_numpy().tolist()
    [['peak', 20, <NA>], ['expansion_to_compression', 20, 30]]
    """
    return _tidy(_event_rows(_curves(frame, metrics, level, n_steps, rate, mean_only)),
                 EVENT_COLUMNS, frame)


def phase_by_step(
    frame: pd.DataFrame | Sequence[pd.DataFrame],
    *,
    metrics: Sequence[str] | None = None,
    level: float = noise.LEVEL,
    n_steps: int | None = None,
) -> pd.DataFrame:
    """The online phase at every step: +1 expanding, −1 compressing, 0 undecided.

    What one would have said at that step, from the steps up to it (see the module doc). Same
    input as `find_phases`; columns: the ``model``/``run`` columns where present, ``metric``,
    ``layer`` (-1: the mean), ``layer_name``, ``step``, ``value`` (mean over seeds), ``phase``.
    """
    return _tidy(_step_rows(_curves(frame, metrics, level, n_steps)), STEP_COLUMNS, frame)


def phases_and_events(
    frame: pd.DataFrame | Sequence[pd.DataFrame],
    *,
    metrics: Sequence[str] | None = None,
    level: float = noise.LEVEL,
    n_steps: int | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`phase_by_step` and `find_phases` of one table from one pass over its curves."""
    curves = list(_curves(frame, metrics, level, n_steps))
    return (_tidy(_step_rows(curves), STEP_COLUMNS, frame),
            _tidy(_event_rows(curves), EVENT_COLUMNS, frame))


def _event_rows(curves) -> list[dict]:
    rows = []
    for key, metric, layer, name, curve in curves:
        if not curve.steps:
            continue
        common = {**key, "metric": metric, "layer": layer, "layer_name": name,
                  "n_seeds": curve.n_seeds}
        rows.append({**common, "event": PEAK, "step": curve.steps[curve.peak],
                     "value": float(curve.mean[curve.peak]), "confirmed_step": pd.NA})
        for event, at, confirmed in curve.turns:
            rows.append({**common, "event": event, "step": curve.steps[at],
                         "value": float(curve.mean[at]), "confirmed_step": curve.steps[confirmed]})
    return rows


def _step_rows(curves) -> list[dict]:
    rows = []
    for key, metric, layer, name, curve in curves:
        for i, step in enumerate(curve.steps):
            rows.append({**key, "metric": metric, "layer": layer, "layer_name": name,
                         "step": step, "value": float(curve.mean[i]), "phase": int(curve.phase[i])})
    return rows


def _tidy(rows: list[dict], columns: Sequence[str], frame) -> pd.DataFrame:
    first = frame if isinstance(frame, pd.DataFrame) else list(frame)[0]
    ids = [c for c in GROUP_COLUMNS if c in first.columns]
    out = pd.DataFrame(rows, columns=[*ids, *columns])
    for column in ("layer", "step", "n_seeds", "phase"):
        if column in out.columns:
            out[column] = out[column].astype("int64")
    if "confirmed_step" in out.columns:
        out["confirmed_step"] = out["confirmed_step"].astype("Int64")
    order = [*ids, "metric", "layer", "step"]
    return out.sort_values(order, kind="stable").reset_index(drop=True)
