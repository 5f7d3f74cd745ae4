"""The commands (`pyproject.toml` [project.scripts] -> `repgeom.cli`): one layer, one style."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from repgeom.cli import command
from repgeom.cli.scripts import SCRIPTS

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]
DECLARED = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
PACKAGE = ROOT / "src" / "repgeom"


def test_every_script_names_a_command_module_with_main() -> None:
    assert set(DECLARED) == set(SCRIPTS)
    for name, target in DECLARED.items():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), name
        assert callable(importlib.import_module(f"repgeom.cli.{SCRIPTS[name]}").main), name


def test_no_module_outside_the_command_layer_defines_main() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "main":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_every_script_answers_help_without_loading_the_training_stack(tmp_path) -> None:
    # One process for all: each command's --help through its console-script function, as
    # installed. Hydra prints the config and exits 0; no command reads data or loads a model.
    # "Quickly" is asserted by what is imported, not by a clock (a timed test fails on a loaded
    # machine): Lightning and transformers (~10 s cold) stay out of every --help.
    code = (
        "import sys\n"
        "from repgeom.cli import scripts\n"
        "for name, function in scripts.SCRIPTS.items():\n"
        "    sys.argv = [name, '--help']\n"
        "    try:\n"
        "        getattr(scripts, function)()\n"
        "    except SystemExit as e:\n"
        "        assert e.code in (0, None), (name, e.code)\n"
        "    heavy = sorted(m for m in ('lightning', 'transformers') if m in sys.modules)\n"
        "    print(f'@@ {name} {\",\".join(heavy) or \"-\"}', file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600)  # a hang guard only
    assert done.returncode == 0, done.stderr[-3000:]
    seen = dict(line.split()[1:] for line in done.stderr.splitlines() if line.startswith("@@"))
    assert set(seen) == set(SCRIPTS)
    assert all(heavy == "-" for heavy in seen.values()), seen
    assert "== Config ==" in done.stdout and "protocol: repgeom" in done.stdout
    assert not any(tmp_path.iterdir())  # no outputs/ folder, no .hydra/ left behind


@pytest.mark.parametrize("name", ["repgeom-probe", "repgeom-example-data"])
def test_a_command_runs_and_exits_zero(name, tmp_path) -> None:
    module, function = DECLARED[name].split(":")
    args = ["--cfg", "job"] if name == "repgeom-probe" else [str(tmp_path / "data.csv")]
    code = (f"import sys; sys.argv = [{name!r}, *{args!r}]; "
            f"from {module} import {function}; sys.exit({function}())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    if name == "repgeom-probe":
        assert "protocol: repgeom" in done.stdout  # conf/probe.yaml, found from anywhere
    else:
        assert (tmp_path / "data.csv").stat().st_size > 0
        assert sorted(p.name for p in tmp_path.iterdir()) == ["data.csv"]


def test_a_wrong_path_is_one_line_and_exit_status_1(tmp_path) -> None:
    code = ("import sys; sys.argv = ['repgeom-shards', 'no-such-sweep']; "
            "from repgeom.cli.scripts import shards; sys.exit(shards())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().startswith("error: no-such-sweep holds no shard jobs")
    assert "Traceback" not in done.stderr


@pytest.fixture
def config():
    from dataclasses import dataclass, field

    @dataclass
    class Config:
        runs: list[str] = field(default_factory=list)
        labels: list[str] | None = None
        text: str | None = None
        group_by: str = ""
        figures: bool = True
        step: int = 0
        dry_run: str | None = None

    return Config


def test_old_words_become_hydra_overrides(config) -> None:
    words = command.hydra_words(
        ["a", "b", "--labels", "x", "y", "--step", "3", "--no-figures", "--group-by=masking",
         "--cfg", "job"], config, positional=("runs",))
    assert words == ["--cfg", "job", "runs=['a','b']", "labels=['x','y']", "step=3",
                     "figures=false", "group_by='masking'"]


def test_free_text_and_comma_lists_arrive_as_typed(config) -> None:
    words = command.hydra_words(["text=it's a, b: c", "group_by=subject,attribute"], config)
    assert words == ["text='it\\'s a, b: c'", "group_by='subject,attribute'"]
    # ...and Hydra reads them back as typed
    seen = command.run_command("words_test", config, lambda cfg: (cfg.text, cfg.group_by),
                               ["text=it's a, b: c", "group_by=subject,attribute"])
    assert seen == ("it's a, b: c", "subject,attribute")
    # with --multirun a comma sweeps, as everywhere in Hydra
    assert command.hydra_words(["text=a,b", "-m"], config) == ["-m", "text=a,b"]


def test_a_flag_alone_takes_its_default_value_and_unknown_words_fail(config) -> None:
    words = command.hydra_words(["--dry-run"], config, flag_values={"dry_run": "d.json"})
    assert words == ["dry_run='d.json'"]
    with pytest.raises(ValueError, match="unknown option --colour"):
        command.hydra_words(["--colour", "red"], config)
    with pytest.raises(ValueError, match="unexpected word 'stray'"):
        command.hydra_words(["stray"], config)
    with pytest.raises(ValueError, match="unknown option lables="):
        command.hydra_words(["lables=x"], config, positional=("runs",))  # not taken for a run


def test_added_overrides_join_the_users_run_of_overrides() -> None:
    # argparse (Hydra's parser) fails on overrides on both sides of a flag
    defaults = ["hydra.job.name=train", "hydra.run.dir=."]
    assert command.with_defaults(["-m", "a=1", "--cfg", "job"], defaults) == [
        "-m", "hydra.job.name=train", "hydra.run.dir=.", "a=1", "--cfg", "job"]
    assert command.with_defaults(["--help"], defaults) == ["--help", *defaults]
    assert command.with_defaults(["hydra.run.dir=out"], defaults) == [
        "hydra.job.name=train", "hydra.run.dir=out"]
