"""What a researcher sees outside the code: the interactive W&B tables of a real offline run,
the dashboard specification checked against that run, and a quiet console."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from cli_runs import ROOT, subprocess_env, tiny_overrides
from hydra_configs import compose_train
from wandb_records import logged_keys, wandb_config, wandb_history, wandb_records

from repgeom.dashboard import missing_keys
from repgeom.probes.core import table
from repgeom.probes.report import wandb_charts
from repgeom.train import train

SHORT = ["trainer.max_steps=6", "trainer.val_check_interval=3", "probe.every_n_steps=3",
         "probe.log_spaced_until=2", "probe.n_log_spaced=2"]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny training run with the real config: (run folder, its offline W&B run folder)."""
    out = tmp_path_factory.mktemp("run")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        mp.delenv("WANDB_API_KEY", raising=False)
        result = train(compose_train(out, SHORT))
    return out, result.wandb_dir


def _table(wandb_run: Path, key: str) -> pd.DataFrame:
    """The last version of table `key` logged to the run, read from its file as W&B stores it."""
    rows = [r for r in wandb_history(wandb_run) if f"{key}._type" in r]
    assert rows, f"{key} was never logged"
    assert rows[-1][f"{key}._type"] == "table-file"
    stored = json.loads((wandb_run / "files" / rows[-1][f"{key}.path"]).read_text())
    return pd.DataFrame(stored["data"], columns=stored["columns"])


@pytest.mark.slow
def test_run_logs_profile_and_layer_step_tables(run: tuple[Path, Path]) -> None:
    run_dir, wandb_run = run
    probes = table.read_table(run_dir)
    steps = sorted(probes["step"].unique())
    for metric in ("anisotropy", "twonn"):
        expected = wandb_charts.layer_values(probes, metric)
        profile = _table(wandb_run, f"probe/tables/profile_{metric}")
        assert list(profile.columns) == ["step", "layer", "layer_name", "value"]
        assert sorted(profile["step"].unique()) == steps
        assert profile["value"].to_numpy() == pytest.approx(expected["value"].to_numpy())
        layer_step = _table(wandb_run, f"probe/tables/layer_step_{metric}")
        # the layers' rows only: the loss rows (lm_loss, bpc) are the whole model's, no layer
        assert len(layer_step) == len(steps) * table.layer_rows(probes)["layer"].nunique()
    # the chart's own table: one line per probe step, x = layer
    lines = _table(wandb_run, "probe/charts/profile_anisotropy_table")
    assert sorted(lines["lineKey"].unique()) == sorted(f"step {s}" for s in steps)
    # the run config says how W&B draws the chart (line series, and the matrix preset)
    config = wandb_config(wandb_run)
    chart = config["_wandb.visualize.probe/charts/profile_anisotropy"]["panel_config"]
    assert chart["panelDefId"] == "wandb/lineseries/v0"
    chart = config["_wandb.visualize.probe/charts/layer_step_twonn"]["panel_config"]
    assert chart["panelDefId"] == "wandb/confusion_matrix/v1"


def _summary(wandb_run: Path) -> dict:
    summary: dict = {}
    for record in wandb_records(wandb_run, "summary"):
        summary.update(record.get("update", {}))
    return summary


@pytest.mark.slow
def test_run_summary_has_each_layers_id_peak_and_final_anisotropy(run: tuple[Path, Path]) -> None:
    run_dir, wandb_run = run
    summary = _summary(wandb_run)
    probes = table.read_table(run_dir)
    twonn = probes.loc[probes["metric"] == "twonn"].pivot(index="step", columns="layer",
                                                         values="value")  # fmt: skip
    for layer in twonn.columns:
        assert summary[f"probe_summary/twonn_peak_step/layer_{layer:02d}"] == twonn[layer].idxmax()
        # define_metric(summary="max"): W&B's own summary of the series is the same peak
        assert summary[f"probe/twonn/layer_{layer:02d}"]["max"] == pytest.approx(twonn[layer].max())
    last = probes["step"] == probes["step"].max()
    aniso = probes.loc[(probes["metric"] == "anisotropy") & last]
    for row in aniso.itertuples():
        key = f"probe_summary/final_anisotropy/layer_{row.layer:02d}"
        assert summary[key] == pytest.approx(row.value)


@pytest.mark.slow
def test_dashboard_dry_run_plots_only_keys_the_run_has(
    run: tuple[Path, Path], tmp_path: Path
) -> None:
    _, wandb_run = run
    out = tmp_path / "dashboard.json"
    proc = subprocess.run(
        [sys.executable, "-m", "repgeom.cli.dashboard", "--entity", "me", "--project", "repgeom",
         "--dry-run", str(out)],
        capture_output=True, text=True, env=subprocess_env(), cwd=tmp_path, check=True,
    )  # fmt: skip
    assert "6 sections" in proc.stdout
    spec = json.loads(out.read_text())
    names = [s["name"] for s in spec["sections"]]
    assert names == [
        "Loss and bpc", "Anisotropy per layer", "Intrinsic dimension (TwoNN, GRIDE) per layer",
        "Attention entropy", "Q\u0304/K\u0304 alignment",
        "Interactive profiles and layer x step maps",
    ]  # fmt: skip
    assert missing_keys(spec, logged_keys(wandb_run), set(_summary(wandb_run))) == []
    # W&B's serialised view has the same sections and panels, and groups by masking and seed
    sections = spec["viewspec"]["spec"]["section"]["panelBankConfig"]["sections"]
    assert [s["name"] for s in sections] == names
    assert [len(s["panels"]) for s in sections] == [len(s["panels"]) for s in spec["sections"]]
    assert spec["group_by"] == ["masking.name", "seed"]
    config = wandb_config(wandb_run)
    assert config["masking"]["name"] == "causal" and config["seed"] == 0
    # the check itself catches a key the run does not have
    spec["sections"][0]["panels"][0]["y"] = ["train/no_such_key"]
    assert missing_keys(spec, logged_keys(wandb_run), set()) != []


@pytest.mark.slow
def test_dashboard_save_needs_a_login(tmp_path: Path) -> None:
    env = subprocess_env(HOME=str(tmp_path), NETRC=str(tmp_path / "none"))
    proc = subprocess.run(
        [sys.executable, "-m", "repgeom.cli.dashboard", "--entity", "me", "--project", "p"],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "needs a W&B login" in proc.stderr and "--dry-run" in proc.stderr


NOISE = (
    "faiss.loader",  # "Loading faiss with AVX512 support", "Could not load library ..."
    "Could not load library",
    "Tip:",  # Lightning's litlogger / litmodels advertising
    "anonymous setting",  # W&B
    "LeafSpec",  # torch/Lightning pytree deprecation
    "Epoch 0/-2",  # Lightning's bar in a run bounded by max_steps (max_epochs = -1)
    "FLOPs",  # Lightning's model summary column and `Total FLOPs: 0` (no example input)
    "GPU available:",  # Lightning's device lines; ours says the device once
    "TPU available:",
    "Trainer already configured with model summary",  # Lightning keeping ours
    "Seed set to",  # Lightning's seed_everything; the seed is in the config
    "Run history:",  # W&B's end-of-run block, after our Done: line
    "Run summary:",
    "You can sync this run",  # (our Done: line gives the sync command)
    "Find logs at:",
    "`srun` command is available",  # Lightning's hint wherever srun exists, outside a job
)


@pytest.mark.slow
def test_quickstart_console_is_quiet(tmp_path: Path) -> None:
    """The quickstart preset, shrunk, as a user runs it: none of the noise, the final line."""
    env = subprocess_env()
    env.pop("WANDB_SILENT")  # what a user sees
    # On a cluster's login node (or CI, which installs SLURM) `srun` is on the PATH: a stand-in
    # makes Lightning's srun hint appear on any machine unless we drop it.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "srun").write_text("#!/bin/sh\nexit 0\n")
    (fake_bin / "srun").chmod(0o755)
    env["PATH"] = f"{fake_bin}{os.pathsep}{env['PATH']}"
    for name in [n for n in env if n.startswith("SLURM_")]:
        env.pop(name)  # a user outside any job
    args = ["experiment=quickstart", *tiny_overrides(), f"hydra.run.dir={tmp_path / 'run'}",
            "trainer.max_steps=4", "trainer.val_check_interval=2"]  # fmt: skip
    args = [a for a in args if a != "~callbacks.progress_bar"]
    proc = subprocess.run(
        [sys.executable, "train.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console[-4000:]
    for noise in NOISE:
        assert noise not in console, f"{noise!r} in the console:\n{console}"
    assert "Probe summary" in console
    assert "val/bpc" in console  # the progress bar's last render
    final = [line for line in proc.stdout.splitlines() if line.startswith("Done: 4 steps")]
    assert final and f"checkpoints {tmp_path / 'run' / 'checkpoints'}" in final[0]
    assert "wandb sync" in final[0]
    assert proc.stdout.rstrip().endswith(final[0])  # our line is the last
    assert console.count("device: cpu") == 1  # the device, said once in our own line
    assert "Training" in console and "Total params" in console  # the bar, the summary
    lines = console.splitlines()
    for i, line in enumerate(lines[:-1]):  # a warning is one line, no source line under it
        if "Warning: " in line:
            assert not lines[i + 1].startswith("  "), lines[i : i + 2]


def test_our_warnings_are_one_line_without_source(tmp_path: Path) -> None:
    """The probe's sample-size warning as a user sees it (Python's own display, not pytest's):
    one line, ``UserWarning: <message>``, without the line of code under it."""
    code = ("from repgeom.console import quiet_console; quiet_console()\n"
            "from repgeom.probes.core.sampling import fit_to_text\n"
            "fit_to_text(8192, 4, 811, 256)\n")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=subprocess_env(), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("UserWarning: the text holds 811 windows of 256")
    assert proc.stderr.count("\n") == 1, proc.stderr
