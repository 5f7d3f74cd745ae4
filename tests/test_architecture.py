"""The package's layers, read from its source with `ast`: imports run downwards only.

    console, resources, files, peak_flops  <  metrics  <  data, models, loggers, options,
    callbacks (Lightning's adapters)  <  probes  <  analyses  <  experiments  <
    train, dashboard  <  cli (commands)

and inside probes: core (what one probe is)  <  report (what a table says)  <  run (running
probes: probe.py, trajectories, the training callback).

A lower floor never imports a higher one (not even inside a function), and no two modules import
each other, directly or round a cycle. `probe.py` runs without the training stack.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from source_imports import from_module

SRC = Path(__file__).resolve().parents[1] / "src"
FLOORS = {
    "console": 0, "resources": 0, "files": 0, "peak_flops": 0,
    "metrics": 1,
    "data": 2, "models": 2, "loggers": 2, "options": 2, "callbacks": 2,
    "probes": 3,
    "analyses": 4,
    "experiments": 5,
    "train": 6, "dashboard": 6, "cli": 7,
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "repgeom").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every repgeom module `name` imports (module level or inside a function)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = from_module(node, package)
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("repgeom.") and target != name:
                found.add(target)
    return found


PROBE_FLOORS = {"core": 0.0, "report": 0.1, "run": 0.2}
"""The sub-floors of `repgeom.probes`, added to its floor."""


def _floor(module: str) -> float:
    parts = module.split(".")
    top = parts[1]
    if top not in FLOORS:
        raise AssertionError(f"{module}: no floor; add repgeom.{top} to FLOORS in this test")
    if top == "probes" and len(parts) > 2:
        if parts[2] not in PROBE_FLOORS:
            raise AssertionError(f"{module}: repgeom.probes holds only {sorted(PROBE_FLOORS)}")
        return FLOORS[top] + PROBE_FLOORS[parts[2]]
    return FLOORS[top]


GRAPH = {name: _imports(name, path, set(_modules())) for name, path in _modules().items()
         if name != "repgeom"}


def test_every_module_has_a_floor() -> None:
    for name in GRAPH:
        _floor(name)


def test_no_import_climbs_a_floor() -> None:
    upward = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets
                    if b != "repgeom" and _floor(b) > _floor(a))
    assert upward == []


def test_no_import_cycle() -> None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(GRAPH.get(node, ())):
            # A package's __init__ re-exporting its own modules is not a cycle of jobs.
            if nxt == "repgeom" or node.startswith(nxt + ".") or nxt.startswith(node + "."):
                continue
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_the_layer_check_sees_a_planted_upward_import(tmp_path) -> None:
    """The checker itself: a metrics module importing the probes is caught."""
    path = tmp_path / "bad.py"
    path.write_text("from repgeom.probes.core import table\n")
    targets = _imports("repgeom.metrics.bad", path, {*_modules(), "repgeom.metrics.bad"})
    assert "repgeom.probes.core.table" in targets
    assert _floor("repgeom.probes.core.table") > _floor("repgeom.metrics.bad")
    # and inside probes: core never reads report or run
    assert _floor("repgeom.probes.run.runner") > _floor("repgeom.probes.report.sink") > \
        _floor("repgeom.probes.core.table")


@pytest.mark.parametrize("module", ["repgeom.probes.run.runner", "repgeom.analyses.probe_extras"])
def test_probe_pipeline_loads_no_training_code(module) -> None:
    # Our checkpoints are read by models.checkpoints.load_gpt and their validation windows by
    # data.tokens: neither the training code nor Lightning's Trainer is imported.
    unwanted = ("repgeom.train", "lightning.pytorch.trainer", "lightning.pytorch")
    code = f"import sys, {module}; print([m for m in {unwanted!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"
