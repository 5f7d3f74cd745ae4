"""The tidy results table of every probe: one row per (step, layer, head, metric).

Both the training callback and ``probe.py`` write their numbers in this one format, and every plot
in `repgeom.probes.report.plots` reads it:

=========  =======  ===============================================================================
column     dtype    meaning
=========  =======  ===============================================================================
step       int64    training step of the probe (or checkpoint step / revision index)
layer      int64    0 = the state after the embedding, i = the residual stream after block i
                    (1..L), before any final norm; L + 1 = the final norm's output, for models
                    that have one; for per-head attention metrics the block index 1..L
layer_name str      ``embedding``, ``block_<i>`` or ``final_norm`` (tables written before this
                    column existed get it from ``layer``: they hold no final-norm layer)
head       int64    attention head, or -1 when the metric is not per head
metric     str      metric name, e.g. ``anisotropy``, ``twonn``, ``qk_cosine``
value      float64  the number
std        float64  its standard deviation (bootstrap, across windows, ...), NaN when there is none
=========  =======  ===============================================================================

Rows of the whole model rather than of one layer (the language-model loss on the probe's
windows, ``lm_loss`` and ``bpc``: `repgeom.probes.core.prediction.lm_loss`) have ``layer`` -1
(`MODEL_LAYER`) and ``layer_name`` ``model`` (`MODEL_LAYER_NAME`); they are told apart by their
metric (`MODEL_METRICS`, `model_rows`, `layer_rows`), not by that number.

A probe of shuffled text (``texts=shuffled``, `repgeom.probes.core.sampling.shuffle_tokens`)
adds the column ``texts`` (`TEXTS_COLUMN`), ``shuffled`` on its rows; tables of real text have
none. A table never mixes the two (`append_rows`), so a resumed probe cannot either.

Any further columns (``probe.py`` adds ``model`` and ``revision``, a comparison may add ``run``)
are kept, after these seven, and every function here and in `plots` can group by them.

The noise columns are not grouping keys (`NOISE_COLUMNS`: ``n_batches``, ``se``, ``se_df``,
float64, NaN on rows without them, absent from tables written before issue 37). Nor is
``note`` (str, `NOTE`) says why a row's value is NaN
where a guard set it so (e.g. ``copies: 64% of the states are copies or near-copies (limit
50%)`` on every intrinsic-dimension row of a layer, `repgeom.probes.core.catalogue`); it is empty on
every other row, and absent from tables in which no value was guarded.

Pairwise metrics (``reads="pair"`` in `repgeom.probes.core.catalogue`: ``linear_cka``,
``mutual_knn``) compare two sets of states; their rows add the columns that name the second set
(`PAIR_COLUMNS`), which hold -1 (or are empty) on every other row:

=========  =======  ===============================================================================
layer_b    int64    the second layer: ``layer`` x ``layer_b`` at one step (a <= b, the diagonal is
                    1 for CKA), or ``layer`` itself when the second set is another step or run
step_b     int64    the second step (the final probe step, for "how far does each layer still
                    move"), -1 when both sets are from ``step``
run_b      str      the second run (``compare_runs``: run against run on the same windows), empty
                    when both are from this run
=========  =======  ===============================================================================

These rows are left out of layer means, summaries and the standard per-metric figures
(`single_set`); `plots.save_figures` draws them as layer x layer and layer x step maps.

On-disk layout of a run (``<run_dir>`` is the Hydra run folder)::

    <run_dir>/probes/probes.parquet   the table, exact dtypes (read first when present)
    <run_dir>/probes/probes.csv       the same table, for a person or a spreadsheet
    <run_dir>/probes/report/plots/*.png      the standard figures (`plots.save_figures`)

``pd.read_csv("<run_dir>/probes/probes.csv")`` reads it in one line; `read_table` does the same
with the dtypes above, given the run folder, the ``probes`` folder or either file.

Means over heads and layers and the run summary: `repgeom.probes.report.aggregate`.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from repgeom.files import atomic_write_many, stale_temporaries
from repgeom.models.capture import FINAL_NORM  # noqa: F401 - the table names the final norm so

COLUMNS: tuple[str, ...] = ("step", "layer", "layer_name", "head", "metric", "value", "std")


REQUIRED: tuple[str, ...] = ("step", "layer", "metric", "value")
"""`head` defaults to -1, `std` to NaN and `layer_name` to the block's name when a row leaves
them out."""


ID_COLUMNS: tuple[str, ...] = ("model", "revision", "run")


NOTE = "note"
"""Column saying why a value is NaN (see the module docstring); empty elsewhere."""


NOISE_COLUMNS: tuple[str, ...] = ("n_batches", "se", "se_df")
"""Columns of a row's noise, not grouping keys either (NaN where a row has none): ``n_batches``,
the estimator batches ``value`` is the mean of and ``std`` the population std over (a table
without the column was written with the default 2); ``se`` and ``se_df``, the standard error of
``value`` from the probe's noise batches and its degrees of freedom
(`repgeom.probes.core.id_noise`). The phase finder reads them
(`repgeom.probes.report.turn_test`)."""


PAIR_COLUMNS: tuple[str, ...] = ("layer_b", "step_b", "run_b")
"""Columns that name the second state set of a pairwise row (see the module docstring)."""


MODEL_LAYER = -1
"""``layer`` of a row of the whole model (its output), not of one layer: the LM loss. A storage
marker only: the rows are told apart by their metric (`MODEL_METRICS`, `model_rows`), never by
this number, which the phase tables use for the layer mean."""


MODEL_LAYER_NAME = "model"
"""``layer_name`` of `MODEL_LAYER`."""


MODEL_METRICS: tuple[str, ...] = ("lm_loss", "bpc")
"""The metrics of the whole model (`repgeom.probes.core.prediction.lm_loss`): no layer has them."""


def model_rows(frame: pd.DataFrame) -> pd.Series:
    """Which rows of `frame` are the whole model's (the LM loss, `MODEL_METRICS`), a bool mask.

    Every reader of layers (layer means, phases, profiles, the console, W&B) leaves these out
    through this one test, which reads the metric: a number in ``layer`` could be taken for a
    layer, or for the layer mean (``layer`` -1 of `repgeom.probes.report.phases`)."""
    if "metric" not in frame.columns:
        return pd.Series(False, index=frame.index)
    return frame["metric"].isin(MODEL_METRICS)


def layer_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` without the whole model's rows (`model_rows`): the layers' rows only."""
    return frame.loc[~model_rows(frame)] if len(frame) else frame


TEXTS_COLUMN = "texts"
"""Column of a probe of shuffled text (``probe.texts=shuffled``): ``shuffled`` on each of its
rows. Absent (or empty) means the text as it is (``real``), so tables of real text are as
before. A table holds one kind only (`append_rows` refuses to mix them)."""


def texts_of(frame: pd.DataFrame) -> set[str]:
    """The texts (``real``, ``shuffled``) the rows of `frame` were probed on; empty: no rows."""
    if frame.empty:
        return set()
    if TEXTS_COLUMN not in frame.columns:
        return {"real"}
    values = frame[TEXTS_COLUMN].fillna("").astype(str).replace({"": "real", "nan": "real"})
    return set(values)


PROBE_DIR = "probes"


TABLE_STEM = "probes"


PLOT_DIR = "plots"


_INT_COLUMNS = ("step", "layer", "head")


_FLOAT_COLUMNS = ("value", "std", *NOISE_COLUMNS)


def rows_to_frame(rows: Iterable[Mapping[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    """Build a tidy table from rows (dicts) or coerce a DataFrame to the table's columns and dtypes.

    Parameters
    ----------
    rows : iterable of dict, or DataFrame
        Each row needs ``step``, ``layer``, ``metric`` and ``value``; ``head`` defaults to -1 and
        ``std`` to NaN. Other keys become extra columns, kept after the six standard ones.

    Returns
    -------
    DataFrame
        Columns ``step, layer, head`` (int64), ``metric`` (str), ``value, std`` (float64), then
        the extra columns; the ``model``/``revision``/``run`` columns are strings.

    Raises
    ------
    ValueError
        If a required column is missing, or ``step``/``layer``/``head`` hold missing or
        non-integer values.

    Examples
    --------
    >>> frame = rows_to_frame([{"step": 0, "layer": 1, "metric": "anisotropy", "value": 0.3}])
    >>> frame["head"].item(), frame["std"].isna().item()
    (-1, True)
    """
    frame = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame.from_records(list(rows))
    if frame.empty and len(frame.columns) == 0:
        frame = pd.DataFrame(columns=list(COLUMNS))
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise ValueError(
            f"rows: missing required column(s) {', '.join(missing)}; "
            f"got {', '.join(map(str, frame.columns)) or 'none'} "
            f"(required: {', '.join(REQUIRED)}; optional: head, std)"
        )
    # Rows that leave `head` out (not per head) are -1, also when other rows of the batch have one.
    frame["head"] = frame["head"].fillna(-1) if "head" in frame.columns else -1
    if "std" not in frame.columns:
        frame["std"] = np.nan
    for col in _INT_COLUMNS:
        frame[col] = _as_int(frame[col], col)
    for col in PAIR_COLUMNS[:2]:
        if col in frame.columns:
            frame[col] = _as_int(frame[col].fillna(-1), col)
    for col in ("run_b", NOTE, TEXTS_COLUMN):  # strings, empty where a row has none
        if col in frame.columns:
            frame[col] = frame[col].astype(object).where(frame[col].notna(), "").astype(str)
    derived = frame["layer"].map(block_name)
    if "layer_name" in frame.columns:
        given = frame["layer_name"].astype(object)
        frame["layer_name"] = given.where(given.notna() & (given != ""), derived).astype(str)
    else:
        frame["layer_name"] = derived.astype(str)
    for col in _FLOAT_COLUMNS:
        if col in frame.columns:  # value and std always are (above); the noise columns may not
            frame[col] = pd.to_numeric(frame[col], errors="raise").astype("float64")
    if frame["metric"].isna().any():
        raise ValueError("rows: column 'metric' has missing values")
    frame["metric"] = frame["metric"].astype(str)
    for col in ID_COLUMNS:
        if col in frame.columns:
            frame[col] = frame[col].astype(str).where(frame[col].notna())
    extra = [c for c in frame.columns if c not in COLUMNS]
    return frame[[*COLUMNS, *extra]].reset_index(drop=True)


def block_name(layer: int) -> str:
    """The name of layer `layer` in a model without a final norm: embedding or block_<i>
    (``model`` for `MODEL_LAYER`)."""
    if layer == MODEL_LAYER:
        return MODEL_LAYER_NAME
    return "embedding" if layer == 0 else f"block_{layer}"


def _as_int(column: pd.Series, name: str) -> pd.Series:
    if column.isna().any():
        raise ValueError(f"rows: column {name!r} has missing values")
    numbers = pd.to_numeric(column, errors="raise")
    as_int = numbers.astype("int64")
    if not np.array_equal(as_int.to_numpy(), numbers.to_numpy()):
        raise ValueError(f"rows: column {name!r} must hold integers, got {numbers.tolist()[:5]}...")
    return as_int


def probe_dir(run_dir: str | os.PathLike) -> Path:
    """The folder that holds a run's table: ``<run_dir>/probes``."""
    return Path(run_dir) / PROBE_DIR


def plot_dir(run_dir: str | os.PathLike) -> Path:
    """The folder that holds a run's figures: ``<run_dir>/probes/plots``."""
    return probe_dir(run_dir) / PLOT_DIR


def _has_parquet() -> bool:
    return importlib.util.find_spec("pyarrow") is not None


def append_rows(
    folder: str | os.PathLike, rows: Iterable[Mapping[str, Any]] | pd.DataFrame
) -> pd.DataFrame:
    """Add the rows of one probe step to the table in `folder` and write it back; return it all.

    Rows already on disk for the same step (and the same ``model``/``revision``/``run`` where the
    new rows have those columns) are replaced, so a resumed run that probes a step again does not
    duplicate it. Both files are written atomically (a temporary file in `folder`, then
    ``os.replace``): a crash or a failing writer leaves the previous table intact.

    Parameters
    ----------
    folder : path
        Where ``probes.parquet`` and ``probes.csv`` live, usually ``probe_dir(run_dir)``;
        created if missing. Only one process (rank 0) should write to it.
    rows : iterable of dict, or DataFrame
        As for `rows_to_frame`.
    """
    folder = Path(folder)
    new = rows_to_frame(rows)
    old = _read_folder(folder) if _table_file(folder) is not None else None
    if old is not None and not old.empty and not new.empty:
        if texts_of(old) != texts_of(new):  # a resumed probe must not mix real and shuffled
            raise ValueError(
                f"{folder} holds probes of {' and '.join(sorted(texts_of(old)))} text and "
                f"these rows are of {' and '.join(sorted(texts_of(new)))} text (texts= / "
                "probe.texts=): one table never mixes them; give another output folder "
                "(output_dir=... or hydra.run.dir=...), or the texts it was probed with")
        keys = ["step", *[c for c in (*ID_COLUMNS, "step_b", "run_b") if c in new.columns]]
        replaced = key_index(old, keys).isin(key_index(new, keys))
        old = old.loc[~replaced]
    parts = [f for f in (old, new) if f is not None and not f.empty]
    table = rows_to_frame(pd.concat(parts, ignore_index=True)) if parts else new
    table = table.sort_values(["step", "metric", "layer", "head"], kind="stable")
    table = table.reset_index(drop=True)
    write_table(table, folder)
    return table


def key_index(frame: pd.DataFrame, keys: Sequence[str]) -> pd.Index:
    """One hashable key per row; a missing id column (or value) counts as the empty string."""
    missing = {"step_b": -1}
    cols = [
        frame[k] if k in frame.columns else pd.Series(missing.get(k, ""), index=frame.index)
        for k in keys
    ]
    cols = [c.astype(str).where(c.notna(), "") if c.dtype == object else c for c in cols]
    return pd.MultiIndex.from_arrays(cols) if len(cols) > 1 else pd.Index(cols[0])


STALE_WRITE_S = 600.0
"""Seconds unchanged after which a temporary file of the table is a killed write's leftover."""


def write_table(frame: pd.DataFrame, folder: str | os.PathLike) -> list[Path]:
    """Write `frame` as ``probes.parquet`` (when pyarrow is installed) and ``probes.csv``.

    Both are written to temporary files in `folder` first and only then moved over the old ones
    with ``os.replace`` (atomic on POSIX): if either writer fails, both old files stay as they
    were. Parquet is moved first, so a process killed between the two moves leaves the file
    `read_table` prefers as the newer one. Temporaries of a killed write, unchanged for
    `STALE_WRITE_S`, are removed first (a younger one may be another writer's). Returns the
    paths written.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    frame = rows_to_frame(frame)
    writers: list[tuple[Path, Callable[[Path], None]]] = []
    if _has_parquet():
        writers.append(
            (folder / f"{TABLE_STEM}.parquet", lambda tmp: frame.to_parquet(tmp, index=False))
        )
    writers.append((folder / f"{TABLE_STEM}.csv", lambda tmp: frame.to_csv(tmp, index=False)))
    for path, _ in writers:  # a killed write's temporaries (a table is written in seconds)
        for stale in stale_temporaries(path, min_age_s=STALE_WRITE_S):
            stale.unlink(missing_ok=True)
    # fenced: a probe worker that lost its run raises before the first rename
    atomic_write_many(writers)
    return [path for path, _ in writers]


def _table_file(folder: Path) -> Path | None:
    for name in (f"{TABLE_STEM}.parquet", f"{TABLE_STEM}.csv"):
        if (folder / name).is_file():
            return folder / name
    return None


def _read_folder(folder: Path) -> pd.DataFrame:
    path = _table_file(folder)
    if path is None:
        raise FileNotFoundError(f"no {TABLE_STEM}.parquet or {TABLE_STEM}.csv in {folder}")
    return _read_file(path)


def _read_file(path: Path) -> pd.DataFrame:
    if path.suffix == ".parquet":
        return rows_to_frame(pd.read_parquet(path))
    header = pd.read_csv(path, nrows=0).columns
    as_str = {c: str for c in ("metric", NOTE, *ID_COLUMNS) if c in header}
    return rows_to_frame(pd.read_csv(path, dtype=as_str))


def _table_folder(path: Path) -> Path | None:
    """The folder `read_table` reads at `path` (its ``probes`` folder first, then itself)."""
    return next((f for f in (probe_dir(path), path) if _table_file(f) is not None), None)


def has_table(path: str | os.PathLike) -> bool:
    """Whether `read_table` finds a table at `path` (a run folder or its ``probes`` folder)."""
    path = Path(path)
    return path.is_file() or _table_folder(path) is not None


def read_table(path: str | os.PathLike) -> pd.DataFrame:
    """Read a probe table, given a run folder, its ``probes`` folder, or a .parquet/.csv file.

    In a folder, ``probes.parquet`` is preferred to ``probes.csv``.

    Raises
    ------
    FileNotFoundError
        Naming every place looked at, when none holds a table.
    """
    path = Path(path)
    if path.is_file():
        if path.suffix not in (".parquet", ".csv"):
            raise ValueError(f"path: expected a .parquet or .csv table, got {path}")
        return _read_file(path)
    folder = _table_folder(path)
    if folder is not None:
        return _read_folder(folder)
    candidates = [probe_dir(path), path]
    looked = ", ".join(str(f / f"{TABLE_STEM}.{{parquet,csv}}") for f in candidates)
    if not path.exists():
        raise FileNotFoundError(f"no probe table: {path} does not exist")
    raise FileNotFoundError(f"no probe table in {path}: looked for {looked}")
