"""The probe worker's state read back from the run folder (``snapshots/worker.json``, written by
`repgeom.probes.run.offload.follow`, and ``snapshots/done.json``, written by
`repgeom.probes.run.offload.snapshots`), field by field.

A file that is not a JSON object reads as missing (`repgeom.files.read_json`),
and a field of the wrong type (a file edited by hand, cut, or written by another version) reads as
empty, with one warning naming the file and the field: a worker never crashes on it, and at worst
probes again what such a field recorded as probed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repgeom.files import read_json
from repgeom.probes.run.offload import starts
from repgeom.probes.run.offload.layout import DONE, DONE_FIELDS, problem


def _warn(path: Path, name: str, value: Any, wanted: str) -> None:
    print(f"warning: {path}: {name} is not {wanted} ({str(value)[:80]!r}); read as empty",
          flush=True)


def _by_step(path: Path, name: str, raw: Any, convert: Callable[[Any], Any],
             wanted: str) -> dict[int, Any]:
    """`raw` (``{"<step>": value}``) as step -> ``convert(value)``; a bad entry is left out, and
    anything but an object reads as empty (warned)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        _warn(path, name, raw, "an object of steps")
        return {}
    steps = {}
    for key, value in raw.items():
        try:
            steps[int(key)] = convert(value)
        except (TypeError, ValueError, KeyError):
            _warn(path, f"{name}[{key!r}]", value, wanted)
    return steps


def _quarantine_entry(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(k in value for k in ("generation", "file",
                                                                       "reason")):
        raise ValueError(value)
    return value


def _finite(raw: Any) -> float:
    """`raw` as a finite float; a ValueError for NaN, an infinity, a bool or a text."""
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        raise ValueError(raw)
    return float(raw)


def _number(path: Path, name: str, raw: Any, default: float) -> float:
    try:
        return _finite(raw)
    except ValueError:
        _warn(path, name, raw, "a number")
        return default


def _step(path: Path, name: str, raw: Any) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int):
        _warn(path, name, raw, "a step")
        return None
    return raw


@dataclass
class WorkerState:
    """``worker.json``: the steps probed (step -> the ``time`` of the snapshot probed), seconds
    spent, the recorder's phase alerts, the probe spec and options, the final step whose
    end-of-run work is done, and the quarantined steps (step -> generation, file, reason)."""

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
    spec, options = raw.get("spec"), raw.get("options") or {}
    if spec is not None and not isinstance(spec, dict):
        _warn(path, "spec", spec, "an object")
        spec = None
    if not isinstance(options, dict):
        _warn(path, "options", options, "an object")
        options = {}
    return WorkerState(
        done=_by_step(path, "done", raw.get("done"), _finite, "a time"),
        seconds=_number(path, "seconds", raw.get("seconds", 0.0), 0.0),
        phase_alerts=raw.get("phase_alerts", []), spec=spec, options=options,
        finished=_step(path, "finished", raw.get("finished")),
        quarantined=_by_step(path, "quarantined", raw.get("quarantined"), _quarantine_entry,
                             "an object with generation, file and reason"))


_SAID: set[tuple[str, str]] = set()


def read_done(path: Path) -> tuple[int | None, dict[int, str]] | None:
    """``done.json`` at `path`: the final step and the steps training skipped for lack of space
    (step -> why); None when it is missing, malformed (`DONE_FIELDS`; warned), or written by a
    start older than the newest (a superseded start's end is not the run's)."""
    raw = read_json(path)
    if raw is None:
        return None
    bad = problem(raw, DONE_FIELDS)
    if bad is not None:
        if (str(path), bad) not in _SAID:  # once, not at every look
            _SAID.add((str(path), bad))
            print(f"warning: {path} is malformed ({bad}); the run is not taken for done",
                  flush=True)
        return None
    if raw["number"] < starts.newest(path.parent):
        return None
    return (_step(path, "step", raw.get("step")),
            _by_step(path, "skipped_for_space", raw.get("skipped_for_space"), str, "a reason"))


def run_done(folder: Path) -> bool:
    """Whether the run of the snapshot folder `folder` is done: its newest start's ``done.json``."""
    return (folder / DONE).is_file() and read_done(folder / DONE) is not None
