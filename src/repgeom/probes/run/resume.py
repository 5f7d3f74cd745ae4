"""What a rerun of a trajectory (`repgeom.probes.run.trajectory`) finds already done.

A step whose rows are all in the table is skipped (a hub revision is known by its name, a
checkpoint by its step, `step_key`), so the same command after a kill starts at the step that
was in flight and ends with the table an uninterrupted run writes. A table found empty or
unreadable on resume is set aside (``probes.csv.corrupt-<time>``), the other format is used when
it reads, and the steps missing from it are probed again; the console says which
(`read_for_resume`).

A step that could not be probed is named in ``probes/skipped.json`` (`SKIPPED`: revision, step
and reason), which a rerun reads to leave it out unless ``retry_skipped=true``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pandas as pd

from repgeom.console import first_line
from repgeom.files import atomic_write_text
from repgeom.probes.core import table

SKIPPED = "skipped.json"
"""The steps that could not be probed and why, in the probe folder."""


def step_key(subject) -> tuple[str, str]:
    """How resume knows a step: (model, revision name) for a hub revision, (model, step) for a
    checkpoint or a model without revisions."""
    revision = getattr(subject, "revision", None)
    return (subject.model, f"revision={revision}" if revision else f"step={int(subject.step)}")


def done_steps(output_dir: Path, texts: str | None = None) -> set[tuple[str, str]]:
    """`step_key` of every step already in the table (`read_for_resume`); a ValueError, before
    any work, when the table holds other `texts` than those asked (``texts=``; None: as the
    checkpoint's training probe, known once it is read: `table.append_rows` refuses then)."""
    frame = read_for_resume(output_dir)
    if frame.empty:
        return set()
    held = table.texts_of(frame)
    if texts is not None and held != {texts}:
        raise ValueError(
            f"{table.probe_dir(output_dir)} holds probes of {' and '.join(sorted(held))} text, "
            f"and texts={texts} was asked: one table never mixes them; give another output "
            "folder (output_dir=... or hydra.run.dir=...), or the texts it was probed with")
    index = frame.index
    models = frame["model"].fillna("") if "model" in frame.columns else pd.Series("", index)
    revisions = frame["revision"] if "revision" in frame.columns else pd.Series(None, index)
    keys = [f"revision={r}" if isinstance(r, str) and r and r != "nan" else f"step={int(s)}"
            for r, s in zip(revisions, frame["step"], strict=True)]
    return set(zip(models, keys, strict=True))


def read_for_resume(output_dir: Path) -> pd.DataFrame:
    """The table a resumed run continues, or an empty one.

    A table file that is empty or does not read (a node that crashed before the disk had it) is
    renamed ``<name>.corrupt-<time>`` and said in the console; the other format is read when it
    is sound, and the steps missing from what is read are probed again.
    """
    folder = table.probe_dir(output_dir)
    for name in (f"{table.TABLE_STEM}.parquet", f"{table.TABLE_STEM}.csv"):
        path = folder / name
        if not path.is_file():
            continue
        try:
            frame = table.read_table(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow, pandas and parser errors alike
            aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
            os.replace(path, aside)
            reason = first_line(exc, 120)
            print(f"Resuming: {path} is unreadable ({reason}); set aside as {aside.name}, the "
                  "steps it held are probed again unless the other table file has them")
            continue
        return frame
    return table.rows_to_frame([])


def read_skipped(output_dir: Path) -> dict[str, dict]:
    """``skipped.json``: a step's label -> {step, revision, model, reason}; empty when absent or
    unreadable."""
    path = table.probe_dir(output_dir) / SKIPPED
    try:
        return {str(k): v for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError):
        return {}


def write_skipped(output_dir: Path, skipped: dict[str, dict]) -> None:
    """Write ``skipped.json`` in one atomic replace."""
    folder = table.probe_dir(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / SKIPPED, json.dumps(skipped, indent=2))
