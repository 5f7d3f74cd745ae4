"""The worker's records, read field by field (a bad field reads as empty, warned): ``worker.json``,
``done.json`` and ``probes/skipped.json`` (docs/probing.md, "Quarantine")."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repgeom.files import read_json
from repgeom.probes.core import table
from repgeom.probes.run import resume
from repgeom.probes.run.offload import starts
from repgeom.probes.run.offload.layout import (
    COMPLETE,
    DONE,
    DONE_FIELDS,
    NUMBER,
    OBJECT,
    TEXT,
    WEIGHTS,
    is_a,
    problem,
    snapshot_time,
)
from repgeom.probes.run.resume import SKIPPED

_SAID: set[tuple[str, str]] = set()  # (file, problem) warned once, not at every look


def _warn(path: Path, name: str, value: Any, wanted: str) -> None:
    if (str(path), name) not in _SAID:
        _SAID.add((str(path), name))
        print(f"warning: {path}: {name} is not {wanted} ({str(value)[:80]!r}); read as empty",
              flush=True)


def _field(path: Path, record: dict, name: str, ok: Callable[[Any], bool], wanted: str,
           empty: Any) -> Any:
    """``record[name]`` when ``ok`` (or None: absent), else `empty`, warned."""
    raw = record.get(name)
    if raw is None or ok(raw):
        return empty if raw is None else raw
    _warn(path, name, raw, wanted)
    return empty


def _by_step(path: Path, record: dict, name: str, ok: Callable[[Any], bool],
             wanted: str) -> dict[int, Any]:
    """``record[name]`` (``{"<step>": value}``) as step -> value; a bad entry left out, warned."""
    steps = {}
    for key, value in _field(path, record, name, is_a[OBJECT], "an object of steps",
                             {}).items():
        if str(key).isascii() and str(key).isdigit() and ok(value):
            steps[int(key)] = value
        else:
            _warn(path, f"{name}[{key!r}]", value, wanted)
    return steps


@dataclass
class WorkerState:
    """``worker.json``: the steps probed (step -> snapshot time), the end of run, quarantine."""

    done: dict[int, float] = field(default_factory=dict)
    seconds: float = 0.0
    phase_alerts: Any = field(default_factory=list)
    spec: dict | None = None
    options: dict = field(default_factory=dict)
    finished: int | None = None
    quarantined: dict[int, dict[str, Any]] = field(default_factory=dict)


def read_worker_state(path: Path) -> WorkerState:
    """``worker.json`` at `path` (missing or not an object: the empty state)."""
    raw = read_json(path) or {}
    entry = ("generation", "file", "reason")
    return WorkerState(
        done={k: float(v) for k, v in _by_step(path, raw, "done", is_a[NUMBER], "a time").items()},
        seconds=float(_field(path, raw, "seconds", is_a[NUMBER], "a number", 0.0)),
        phase_alerts=raw.get("phase_alerts", []),
        spec=_field(path, raw, "spec", is_a[OBJECT], "an object", None),
        options=_field(path, raw, "options", is_a[OBJECT], "an object", {}),
        finished=_field(path, raw, "finished",
                        lambda v: isinstance(v, int) and not isinstance(v, bool), "a step", None),
        quarantined=_by_step(path, raw, "quarantined",
                             lambda v: is_a[OBJECT](v) and all(k in v for k in entry),
                             "an object with generation, file and reason"))


def read_done(path: Path) -> tuple[int, dict[int, str]] | None:
    """``done.json``: (final step, steps skipped for space); None: missing, bad or superseded."""
    raw = read_json(path)
    if raw is None:
        return None
    bad = problem(raw, DONE_FIELDS)
    if bad is not None:
        _warn(path, "it", bad, "a done marker (the run is not taken for done)")
        return None
    if raw["number"] < starts.newest(path.parent):
        return None
    return raw["step"], _by_step(path, raw, "skipped_for_space", is_a[TEXT], "a reason")


def run_done(folder: Path) -> bool:
    """Whether the run of the snapshot folder `folder` is done: its newest start's done.json."""
    return read_done(folder / DONE) is not None


def generation(path: Path) -> str:
    """What names the snapshot in `path` now (marker time, stats): tried once per generation."""
    parts = [str(snapshot_time(path))]
    for name in (COMPLETE, WEIGHTS):
        try:
            info = os.stat(path / name)
            parts.append(f"{info.st_ino}:{info.st_size}:{info.st_mtime_ns}:{info.st_ctime_ns}")
        except OSError:
            parts.append("-")
    return "|".join(parts)


def write_skipped(run_dir: Path, steps: dict[int, dict[str, Any]]) -> None:
    """``probes/skipped.json`` as for hub revisions (`resume.write_skipped`): step -> why."""
    if steps or (table.probe_dir(run_dir) / SKIPPED).exists():
        resume.write_skipped(run_dir, {f"step {step}": {"step": int(step), "revision": None, **why}
                                       for step, why in sorted(steps.items())})
