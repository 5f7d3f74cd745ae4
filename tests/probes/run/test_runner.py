"""probe.py's runner end to end: the command line, hub revisions, run folders, labels and
bad input."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from cli_runs import PYTHON, run_probe_py, subprocess_env
from hub_server import FakeHub, commit_of
from hydra_configs import compose_job, compose_probe
from probe_runs import SMALL, assert_every_metric_every_layer
from wandb_records import wandb_history, wandb_records

from repgeom.models.checkpoints import CheckpointFormatError, find_checkpoints
from repgeom.probes.core import table
from repgeom.probes.report import phase_report, phases
from repgeom.probes.run.costs import timings
from repgeom.probes.run.job import probe_job
from repgeom.probes.run.runner import probe


@pytest.mark.slow
def test_probe_py_command_line(tmp_path, tiny_hf_folder, text_file) -> None:
    """The entry point as a user runs it (one subprocess; every other test calls `probe`)."""
    folder = tiny_hf_folder("gpt2")
    out = tmp_path / "out"
    args = [f"hf={folder}", f"text_file={text_file}", "window=32", *SMALL,
            f"hydra.run.dir={out}"]  # fmt: skip
    done = run_probe_py(args, COLUMNS="160")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "decoder" in done.stdout and "anisotropy" in done.stdout
    assert "final norm" in done.stdout  # the console table names GPT-2's ln_f row
    frame = table.read_table(out)
    assert_every_metric_every_layer(frame, n_layers=2, n_heads=4)
    assert (out / "probes" / "probes.parquet").exists() and (out / "probes" / "probes.csv").exists()


# ---------------------------------------------------------------------------------------------
# Revisions


def test_each_hub_revision_is_downloaded_and_is_one_step(
    tmp_path, tiny_hf_folder, text_file
) -> None:
    """`hf=ORG/NAME hf_revisions=[...]` against a local stand-in for the hub: every revision is
    downloaded into the run's working folder, probed as one step, and deleted; a revision in the
    user's cache is read from there, offline too."""
    folders = {"step100": tiny_hf_folder("gpt2"), "step300": tiny_hf_folder("gpt2-scaled")}
    out, cache = tmp_path / "out", tmp_path / "hf_home"
    args = ["hf=org/pythia-like", "hf_revisions=[step100,step300]", f"text_file={text_file}",
            "window=32", *SMALL, "settings.distributions=false"]  # fmt: skip
    with FakeHub("org/pythia-like", folders) as hub:
        done = run_probe_py(
            [*args, f"hydra.run.dir={out}"], HF_ENDPOINT=hub.url, HF_HOME=str(cache)
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert {revision for revision, _ in hub.downloads()} == set(folders)
        # The user's cache holds no weights (the config a first look reads at most), and the
        # working folder is empty again.
        assert not any(cache.rglob("*.safetensors")) and not any((out / "work").rglob("*.*"))
        # Later the user downloads both revisions into their cache, as huggingface_hub does.
        code = ("import huggingface_hub as h; [h.snapshot_download('org/pythia-like', "
                "revision=r) for r in ('step100', 'step300')]")
        subprocess.run([PYTHON, "-c", code], check=True,
                       env=subprocess_env(HF_ENDPOINT=hub.url, HF_HOME=str(cache)))
    for revision, folder in folders.items():
        snapshot = cache / "hub" / "models--org--pythia-like" / "snapshots" / commit_of(revision)
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            assert (snapshot / name).read_bytes() == (Path(folder) / name).read_bytes()

    frame = table.read_table(out)
    assert sorted(frame["step"].unique()) == [100, 300]
    assert set(frame["revision"]) == {"step100", "step300"}
    assert set(frame["model"]) == {"org/pythia-like"}
    # The two revisions differ (another model), so their rows must too.
    a, b = (frame.query(f"step == {s} and metric == 'anisotropy'")["value"] for s in (100, 300))
    assert not np.allclose(a.to_numpy(), b.to_numpy())
    assert (out / "probes" / "plots" / "vs_step_anisotropy.png").exists()

    # Offline, with the hub gone, the same revisions come from the cache with the same numbers,
    # and the cache is left as it was.
    offline_out = tmp_path / "offline"
    before = sorted(cache.rglob("*"))
    done = run_probe_py(
        [*args, f"hydra.run.dir={offline_out}"], HF_HOME=str(cache), HF_HUB_OFFLINE="1"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    again = table.read_table(offline_out)
    pd.testing.assert_series_equal(again["value"], frame["value"])
    assert all(p.exists() for p in before)
    assert (timings(offline_out)["download_bytes"] == 0).all()


@pytest.mark.slow
def test_unknown_hub_revision_is_a_clear_error(tmp_path, tiny_hf_folder, text_file) -> None:
    args = ["hf=org/pythia-like", "hf_revisions=[step999]", f"text_file={text_file}",
            "window=32", *SMALL, f"hydra.run.dir={tmp_path / 'out'}"]  # fmt: skip
    with FakeHub("org/pythia-like", {"step100": tiny_hf_folder("gpt2")}) as hub:
        done = run_probe_py(args, HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf_home"))
    assert done.returncode != 0
    # Checked against the repository's branches and tags before anything is downloaded.
    assert ("hf_revisions: 'step999' (closest: step100) not a branch or tag of org/pythia-like"
            in done.stderr)
    assert hub.downloads() == set()


@pytest.mark.slow
def test_run_folder_is_a_trajectory_with_one_step_per_checkpoint(tmp_path, trained_run) -> None:
    assert [s for s, _ in find_checkpoints(trained_run)] == [10, 20]
    overrides = [f"run={trained_run}", "logger=wandb", "settings.distributions=false",
                 "plot_metrics=[anisotropy,twonn]"]  # fmt: skip
    os.environ.setdefault("WANDB_MODE", "offline")
    result = probe(compose_job(tmp_path, overrides))
    frame = table.read_table(tmp_path)
    assert sorted(frame["step"].unique()) == [10, 20]
    assert set(frame["model"]) == {trained_run.name}
    logged = table.read_table(trained_run)
    at10 = logged.loc[logged["step"] == 10].merge(
        frame, on=["step", "layer", "head", "metric"], suffixes=("_train", "_probe")
    )
    np.testing.assert_allclose(at10["value_probe"], at10["value_train"], rtol=1e-5, atol=1e-7)
    assert {"vs_step_twonn.png", "profile_anisotropy.png"} <= {p.name for p in result.plots}
    # W&B: the training probe's keys, on the probe/step axis.
    history = wandb_history(result.wandb_dir)
    rows = [row for row in history if "probe/anisotropy/layer_01" in row]
    assert sorted(row["probe/step"] for row in rows) == [10, 20]
    assert "probe/qk_cosine/layer_02/head_01" in rows[0] and "probe/twonn/mean" in rows[0]
    # An image is recorded as flattened fields ("probe/plots/<name>._type", ".path", ...).
    assert any(key.startswith("probe/plots/profile_anisotropy.") for row in history for key in row)
    # The phases of the trajectory: phases.csv beside probes.csv, and in the W&B summary.
    events = phase_report.read_phases(tmp_path)
    pd.testing.assert_frame_equal(events, phases.find_phases(frame), check_exact=False)
    # probe.py's `all` has the scale profile (id_scales): the plateau's phases too
    assert set(events["metric"]) == {"twonn", "gride_k16", "id_plateau"}
    assert -1 in set(events["layer"])
    summary = {k: v for r in wandb_records(result.wandb_dir, "summary") for k, v in
               r.get("update", {}).items()}
    assert "probe_summary/phases/twonn/mean/peak_step" in summary


# ---------------------------------------------------------------------------------------------
# Bad input


def test_missing_paths(tmp_path) -> None:
    for override, match in (
        ("ckpt=/nonexistent/last.ckpt", "ckpt='/nonexistent/last.ckpt': no such file"),
        ("run=/nonexistent/run", "run='/nonexistent/run': no such folder"),
        ("hf=/nonexistent/model", "no such local folder"),
    ):
        with pytest.raises(FileNotFoundError, match=match):
            probe(compose_job(tmp_path, [override]))
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        probe(compose_job(tmp_path, [f"run={tmp_path / 'empty_run'}"]))


def test_checkpoint_of_another_format(tmp_path, tiny_hf_folder) -> None:
    state_dict = tmp_path / "weights.pt"
    torch.save({"layer.weight": torch.zeros(2, 2)}, state_dict)
    with pytest.raises(CheckpointFormatError, match="plain state dict"):
        probe(compose_job(tmp_path, [f"ckpt={state_dict}"]))
    lightning_other = tmp_path / "other.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"lr": 0.1}}, lightning_other)
    with pytest.raises(CheckpointFormatError, match="not one of repgeom's CharLM"):
        probe(compose_job(tmp_path, [f"ckpt={lightning_other}"]))
    text = tmp_path / "notes.ckpt"
    text.write_text("not a checkpoint")
    with pytest.raises(CheckpointFormatError, match="torch.load cannot read it"):
        probe(compose_job(tmp_path, [f"ckpt={text}"]))
    with pytest.raises(ValueError, match="use ckpt= instead|not a Hugging Face model folder"):
        probe(compose_job(tmp_path, [f"hf={tmp_path}"]))


@pytest.mark.slow  # trains (the trained_run fixture)
def test_text_shorter_than_the_window(tmp_path, tiny_hf_folder, trained_run) -> None:
    short = tmp_path / "short.txt"
    short.write_text("too short")
    folder = tiny_hf_folder("gpt2")
    with pytest.raises(ValueError, match="one window of 32 tokens"):
        probe(compose_job(tmp_path, [f"hf={folder}", f"text_file={short}", "window=32"]))
    ckpt = trained_run / "checkpoints" / "last.ckpt"
    with pytest.raises(ValueError, match="block_size=32"):
        probe(compose_job(tmp_path, [f"ckpt={ckpt}", f"text_file={short}"]))


@pytest.mark.parametrize(
    "overrides, match",
    [
        ([], "give exactly one of run="),
        (["hf=gpt2", "ckpt=x.ckpt"], r"got ckpt=x.ckpt, hf=gpt2"),
        (["ckpt=x.ckpt", "hf_revisions=[a]"], "hf_revisions= needs hf="),
        (["ckpt=x.ckpt", "tokenizer=gpt2"], "tokenizer= needs hf="),
        (["hf=gpt2", "compare.text_a=a"], "compare needs both"),
        (["run=x", "compare.text_a=a", "compare.text_b=b"], "compare takes ckpt= or hf="),
        (["hf=gpt2", "+settings.bogus=1"], "unknown key"),
    ],
)
def test_bad_config(tmp_path, overrides, match) -> None:
    with pytest.raises(ValueError, match=match):
        probe(compose_job(tmp_path, overrides))


# ---------------------------------------------------------------------------------------------
# Activation distributions per label group


@pytest.mark.slow
def test_labels_csv_fits_each_label_group_separately(tmp_path, tiny_hf_folder, text_file):
    """`labels.csv=... labels.group_by=[...]`: one fit per subject:attribute group, from the
    group's own token states (checked against the model's hidden states read directly)."""
    from transformers import AutoModel, AutoTokenizer

    from repgeom.analyses.probe_extras import probe as probe_with_analyses
    from repgeom.metrics.distributions import activation_distribution

    folder = tiny_hf_folder("gpt2")
    sentences = ["the quick brown fox jumps", "over the lazy dog, and then it sleeps.",
                 "a character level tokenizer", "turns every letter into one token;"]
    cells = [("fox", "calm"), ("fox", "loud"), ("dog", "calm"), ("dog", "loud")] * 2
    rows = [{"text": sentences[i % 4], "subject": subject, "tone": tone}
            for i, (subject, tone) in enumerate(cells)]
    csv = tmp_path / "labelled.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    cfg = compose_probe(tmp_path, [f"hf={folder}", f"text_file={text_file}", "window=32", *SMALL,
                                   f"labels.csv={csv}", "labels.group_by=[subject,tone]"])
    result = probe_with_analyses(probe_job(cfg))  # probe.py's function: the pipeline and its extras
    out = result.output_dir / "distributions"
    summary = pd.read_csv(out / "summary.csv")
    assert set(summary["group"]) == {"fox:calm", "fox:loud", "dog:calm", "dog:loud"}
    assert len(summary) == 4 * 4  # groups x (embedding, 2 blocks, final norm)
    shares = pd.read_csv(out / "shares.csv")
    assert (shares["n_groups"] == 4).all()
    sums = shares.groupby(["layer", "criterion", "level"])["share"].sum()
    np.testing.assert_allclose(sums.to_numpy(), 1.0)

    # Independent path: the group's texts through the model, block 1's values, the same fit.
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    texts = [r["text"] for r in rows if (r["subject"], r["tone"]) == ("dog", "loud")]
    with torch.no_grad():
        values = np.concatenate([
            model(**tokenizer(t, return_tensors="pt"), output_hidden_states=True)
            .hidden_states[1][0].reshape(-1).numpy() for t in texts])
    row = summary.query("group == 'dog:loud' and layer == 1").iloc[0]
    assert row["n_values"] == values.size
    expected = activation_distribution(values, n_samples=500, seed=0)
    assert row["best_loglik"] == expected.best_family_loglik
    assert row["kurtosis"] == pytest.approx(expected.kurtosis, rel=1e-5)


def test_labels_csv_is_refused_for_a_run_and_when_missing(tmp_path, tiny_hf_folder) -> None:
    cfg = compose_probe(tmp_path, [f"hf={tiny_hf_folder('gpt2')}",
                                   f"labels.csv={tmp_path / 'none.csv'}"])
    with pytest.raises(FileNotFoundError, match="labels.csv=.*does not exist"):
        probe_job(cfg)
    cfg = compose_probe(tmp_path, [f"run={tmp_path}", f"labels.csv={tmp_path / 'none.csv'}"])
    with pytest.raises(ValueError, match="labels.csv fits the distributions of one model"):
        probe_job(cfg)


@pytest.mark.slow
def test_model_name_labels_the_table(tmp_path, tiny_hf_folder, text_file) -> None:
    cfg = compose_probe(tmp_path, [f"hf={tiny_hf_folder('gpt2')}", f"text_file={text_file}",
                                   "window=32", *SMALL, "plot_metrics=[]", "model_name=tiny-gpt2",
                                   "settings.distributions=false"])
    result = probe(probe_job(cfg))
    assert set(result.frame["model"]) == {"tiny-gpt2"}
    assert set(result.drift_cosine["model"]) == {"tiny-gpt2"}
