"""What each step of a trajectory (`repgeom.probes.run.trajectory`) costs, and keeping its
memory flat.

``probes/timings.csv`` (`TIMINGS`) has one row per probed step: seconds downloading, waiting,
loading, in the forward passes and in the metrics, the bytes downloaded, the resident memory
after the step (and the GPU's peak), and the weights files' sha256 (read by
`repgeom.probes.run.copies`). It is appended to (and fsynced), and rewritten in place once when a
column is added; the same numbers go to W&B as ``probe/cost/*``.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pandas as pd

from repgeom.probes.core import table

TIMINGS = "timings.csv"
"""Per step costs, in the probe folder."""


def trim_heap() -> None:
    """Give freed memory back to the system (glibc ``malloc_trim``): a model's tensors and the
    table's frames are freed after each step, and without it the heap keeps growing by the
    fragments between them (issue 25: +1.5 MB per revision)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def system_arrow_pool() -> None:
    """Parquet reads and writes through the system allocator: pyarrow's default pool
    (mimalloc) keeps what each step's table read and write used, and the table grows every
    step, so the resident memory grew ~0.8 MB per revision over a trajectory; with the system
    pool and `trim_heap` it stays flat (benchmarks/README.md, "Trajectory")."""
    try:
        import pyarrow
    except ImportError:  # CSV only: nothing to set
        return
    pyarrow.set_memory_pool(pyarrow.system_memory_pool())


def resident_mb() -> float:
    """This process's resident memory in MB (Linux ``/proc``; NaN elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def write_costs(output_dir: Path, costs: dict, loggers: list) -> None:
    """Append one step's `costs` to ``timings.csv`` (fsynced) and log them to each W&B run."""
    path = table.probe_dir(output_dir) / TIMINGS
    path.parent.mkdir(parents=True, exist_ok=True)
    row = pd.DataFrame([costs])
    header = not path.is_file()
    if not header:  # the header alone, not the whole file, at each step
        columns = list(pd.read_csv(path, nrows=0).columns)
        if set(row.columns) - set(columns):  # a column added since: rewrite once
            old = pd.read_csv(path, dtype={"revision": str, "weights_sha256": str})
            row = pd.concat([old, row], ignore_index=True)
            header = True
        else:  # appended in the file's own column order
            row = row.reindex(columns=columns)
    with open(path, "w" if header else "a") as f:
        row.to_csv(f, header=header, index=False)
        f.flush()
        os.fsync(f.fileno())
    for run in loggers:
        run.log({"probe/step": costs["step"],
                 **{f"probe/cost/{k}": v for k, v in costs.items()
                    if isinstance(v, (int, float)) and k != "step" and v == v}})


def timings(output_dir: str | os.PathLike) -> pd.DataFrame:
    """``probes/timings.csv``: one row per probed step (a resumed run appends its own)."""
    return pd.read_csv(table.probe_dir(output_dir) / TIMINGS)
