"""`pip install .` (not editable) in a fresh virtual environment gives a working train.py.

The venv sees no site packages of this one, so a runtime dependency missing from
pyproject.toml fails here; the project is installed from a copy of its files (what a clone
holds), and the run starts in another folder, so nothing is found through the source tree.
Needs the package index (or pip's cache) and takes about 2.5 minutes: marked slow.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from cli_runs import ROOT, subprocess_env

TORCH = "torch==2.13.0"  # the tested pin (requirements.txt): pip must keep it, not upgrade it


def _copy_project(dest: Path) -> Path:
    """The files of the project a clone would hold (tracked and not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
        text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    for name in listed:
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


@pytest.mark.slow
@pytest.mark.timeout(2400)  # a hang guard: beside two CPU-bound processes pip took over 900 s
def test_non_editable_install_in_a_fresh_venv_trains(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("needs git to list the project's files")
    project = _copy_project(tmp_path / "clone")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)  # no --system-site-packages: nothing leaks in
    python = str(env_dir / "bin" / "python")
    env = {k: v for k, v in subprocess_env().items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    env.pop("REPGEOM_DATA", None)
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run([*pip, TORCH], env=env)
    _run([*pip, str(project)], env=env)
    versions = _run([python, "-m", "pip", "list", "--format=freeze"], env=env).stdout
    assert "torch==2.13.0" in versions  # the pin survived (no CUDA torch pulled in)
    assert "repgeom==" in versions and "-e " not in versions

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run(
        [python, "-c", "import repgeom.data.enwik8 as e, repgeom.resources as r;"
         "print(e.SAMPLE_PATH); print(r.conf_dir()); print(e.default_cache_dir())"],
        env=env, cwd=elsewhere,
    ).stdout.split()  # fmt: skip
    site = str(env_dir)
    assert where[0].startswith(site) and Path(where[0]).is_file()  # the sample ships with it
    assert where[1].startswith(site) and (Path(where[1]) / "train.yaml").is_file()
    assert where[2] == str(tmp_path / "xdg" / "repgeom")  # not inside site-packages

    run_dir = elsewhere / "run"
    _run(
        [python, str(project / "train.py"), "experiment=quickstart", "trainer.max_steps=2",
         "trainer.val_check_interval=2", "trainer.limit_val_batches=1", "probe.n_states=256",
         "model.block_size=64", "~callbacks.progress_bar", f"hydra.run.dir={run_dir}"],
        env=env, cwd=elsewhere, timeout=900,
    )  # fmt: skip
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert (run_dir / "probes" / "probes.csv").is_file()
    _run(
        [python, str(project / "probe.py"), f"ckpt={run_dir / 'checkpoints' / 'last.ckpt'}",
         f"hydra.run.dir={elsewhere / 'probe'}", "logger=none"],
        env=env, cwd=elsewhere, timeout=600,
    )  # fmt: skip
    assert (elsewhere / "probe" / "probes" / "probes.csv").is_file()
    assert sys.executable not in where  # sanity: it ran in the fresh venv, not this one
