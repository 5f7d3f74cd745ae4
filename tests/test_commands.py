"""The declared commands (`pyproject.toml` [project.scripts] -> `repgeom.commands`)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from repgeom import commands

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_every_script_names_a_command_and_every_module_has_main() -> None:
    for name, target in SCRIPTS.items():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), name
    assert set(commands.COMMANDS) | {"repgeom-train", "repgeom-probe"} == set(SCRIPTS)
    for module in commands.COMMANDS.values():
        assert callable(importlib.import_module(module).main), module


@pytest.mark.parametrize("name", ["repgeom-probe", "repgeom-example-data"])
def test_a_command_runs_and_exits_zero(name, tmp_path) -> None:
    function = SCRIPTS[name].split(":")[1]
    args = ["--cfg", "job"] if name == "repgeom-probe" else [str(tmp_path / "data.csv")]
    code = (f"import sys; sys.argv = [{name!r}, *{args!r}]; "
            f"from repgeom.commands import {function}; sys.exit({function}())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    if name == "repgeom-probe":
        assert "protocol: repgeom" in done.stdout  # conf/probe.yaml, found from anywhere
    else:
        assert (tmp_path / "data.csv").stat().st_size > 0
