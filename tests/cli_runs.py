"""Run `train.py` as a user does (a subprocess), and read back what a run folder holds.

DDP, multirun and SLURM runs need the real command line: Lightning's DDP launcher re-executes
the script, Hydra's multirun and the submitit launcher are entered through `@hydra.main`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
from hydra_configs import ROOT, TINY
from wandb_records import wandb_history

PYTHON = sys.executable


def tiny_overrides(*, trainer: str = "cpu") -> list[str]:
    """`TINY` (the test-sized config) as command-line overrides, with another trainer option."""
    return [f"trainer={trainer}" if o == "trainer=cpu" else o for o in TINY]


def subprocess_env(**extra: str) -> dict[str, str]:
    """This environment with the venv's bin first on PATH and W&B kept offline and quiet."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", **extra}
    env["PATH"] = f"{Path(PYTHON).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("WANDB_API_KEY", None)
    # An in-process W&B run in this pytest process exports its service's address; a job that
    # inherited it would share that service (and, requeued, find its run id still "in use").
    env.pop("WANDB_SERVICE", None)
    return env


def run_train(args: list[str], *, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python train.py ARGS` in the project root; fails the test with the output on error."""
    proc = subprocess.run(
        [PYTHON, "train.py", *args], cwd=ROOT, env=subprocess_env(), capture_output=True,
        text=True, timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"train.py {' '.join(args)} exited with {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-8000:]}"
        )
    return proc


def run_probe_py(args: list[str], *, timeout: float | None = None,
                 **env: str) -> subprocess.CompletedProcess:
    """`python probe.py ARGS` as a user runs it, in a fresh process with `env` added (the hub
    endpoint, HF_ENDPOINT, is read when huggingface_hub is imported: only a new process sees
    it); hub offline mode only where `env` asks for it. `timeout`: seconds before
    ``subprocess.TimeoutExpired`` (a run that should end by itself)."""
    environment = subprocess_env(**env)
    for offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if offline not in env:
            environment.pop(offline, None)
    command = [PYTHON, "probe.py", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=environment,
                          timeout=timeout)


def wandb_runs(run_dir: Path) -> list[Path]:
    """The offline W&B run folders of a run folder (one per start: a resume adds one)."""
    return sorted((run_dir / "wandb").glob("offline-run-*"))


def wandb_run_id(wandb_run: Path) -> str:
    """`offline-run-20240501_120000-<id>` -> `<id>`."""
    return wandb_run.name.rsplit("-", 1)[-1]


def wandb_steps(wandb_run: Path, key: str = "train/loss") -> list[int]:
    """Global steps at which `key` was logged to this W&B run."""
    return [int(r["trainer/global_step"]) for r in wandb_history(wandb_run) if key in r]


def csv_metrics(run_dir: Path) -> pd.DataFrame:
    from repgeom.train import read_csv_metrics

    return read_csv_metrics(run_dir)


def probe_table(run_dir: Path) -> pd.DataFrame | None:
    """The run's probe table, or None where this checkout has no probe callback (conf/probe)."""
    if not (ROOT / "conf" / "probe").is_dir():
        return None
    from repgeom.probes.core.table import read_table

    return read_table(run_dir)


def assert_complete_run(run_dir: Path, *, max_steps: int) -> None:
    """What every finished run leaves: checkpoints at `max_steps`, one W&B run, its CSV, probes."""
    import torch

    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    assert last["global_step"] == max_steps
    assert len(wandb_runs(run_dir)) >= 1
    frame = csv_metrics(run_dir)
    assert frame["step"].max() == max_steps - 1
    probes = probe_table(run_dir)
    if probes is not None:
        assert {0, max_steps} <= set(probes["step"]), sorted(set(probes["step"]))
