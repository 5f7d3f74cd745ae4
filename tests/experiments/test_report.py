"""Experiments 1-3 in miniature: the sweep preset runs and the report is rebuilt from its files."""

import re
import subprocess
from pathlib import Path

import pytest
from cli_runs import PYTHON, run_train, subprocess_env, tiny_overrides
from hydra_configs import ROOT

from repgeom.experiments.report import _fmt, _profile
from repgeom.experiments.report import main as report
from repgeom.probes.table import read_table

pytestmark = pytest.mark.slow


def run_probe(args: list[str]) -> None:
    """`python probe.py ARGS` as a user runs it."""
    proc = subprocess.run(
        [PYTHON, "probe.py", *args],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("shape_of_learning")
    run_train(
        [
            "-m",
            "experiment=shape_of_learning",
            "masking=causal,bidirectional",
            *tiny_overrides(),
            "trainer.max_steps=12",
            "trainer.val_check_interval=6",
            "probe.every_n_steps=4",
            "probe.log_spaced_until=4",
            "probe.n_log_spaced=3",
            f"hydra.sweep.dir={folder}",
        ]
    )
    return folder


def test_the_preset_writes_one_run_per_masking(sweep: Path) -> None:
    for masking in ("causal", "bidirectional"):
        frame = read_table(sweep / masking)
        assert sorted(frame["step"].unique()) == [0, 1, 2, 4, 8, 12]
        assert {"anisotropy", "twonn", "attention_entropy", "qk_cosine"} <= set(frame["metric"])


def test_report_has_every_experiment_with_figures_and_numbers_from_the_tables(
    sweep: Path, tmp_path: Path
) -> None:
    path = report(["--shape-of-learning", str(sweep), "--out", str(tmp_path)])
    text = path.read_text()
    for title in ("1. Decoder vs encoder", "2. Intrinsic dimension", "3. Attention sharpening"):
        assert f"## {title}" in text
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(images) >= 7
    for image in images:
        assert (tmp_path / image).stat().st_size > 5_000, image
    verdicts = re.findall(r"→ \*\*(agrees|does not agree)\*\*", text)
    assert len(verdicts) >= 10
    # The numbers in the report are the tables' numbers.
    causal = read_table(sweep / "causal")
    final = _profile(causal, "anisotropy", int(causal["step"].max()))
    assert _fmt(final) in text
    assert "gpt_tiny (2 layers, d=32), data=sample, 12 steps" in text


def test_distributions_experiment_reports_the_best_family_per_layer(
    sweep: Path, tmp_path: Path
) -> None:
    # Experiment 5: probe.py on the decoder's last checkpoint (distribution fits on by default).
    run_probe(
        [
            f"ckpt={sweep / 'causal' / 'checkpoints' / 'last.ckpt'}",
            "settings.distribution_samples=500",
            f"hydra.run.dir={tmp_path / 'probe'}",
        ]
    )
    path = report(["--distributions", str(tmp_path / "probe"), "--out", str(tmp_path / "docs")])
    text = path.read_text()
    assert "## 5. Activation distributions" in text
    table = [line for line in text.splitlines() if line.startswith("| ") and "layer" not in line]
    assert len(table) == 3  # embedding + 2 blocks of the tiny model
    families = {"normal", "logistic", "t", "gennorm", "hypsecant"}
    for line in table:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1] in families and cells[2] in families
        assert int(cells[4]) >= 1
