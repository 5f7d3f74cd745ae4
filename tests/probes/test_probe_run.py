"""probe.py: Hugging Face folders, our checkpoints and runs, revisions, compare, and bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from cli_runs import PYTHON, run_probe_py, subprocess_env
from hub_server import FakeHub, commit_of
from hydra_configs import compose_probe, compose_train
from wandb_records import wandb_history, wandb_records

from repgeom.models.checkpoints import CheckpointFormatError, find_checkpoints, read_checkpoint
from repgeom.probes.core import table
from repgeom.probes.core.measure import PER_HEAD_METRICS
from repgeom.probes.core.spec import training_probe
from repgeom.probes.core.texts import default_text
from repgeom.probes.report import phase_report, phases
from repgeom.probes.run import runner
from repgeom.probes.run.runner import probe
from repgeom.probes.run.trajectory import timings
from repgeom.train import train

# The training probe's metrics on a tiny model (max_order=16) plus the distribution fits that
# probe.py adds by default.
STATE_METRICS = {
    "anisotropy",
    "mean_cosine",
    "cosine_baseline",
    "drift_norm",
    "drift_ratio",
    "twonn",
    "twonn_mle",
    "duplicates",
    "near_duplicate_share",
    "gride_k2",
    "gride_k8",
    "kurtosis",
    "n_modes",
    "loglik_normal",
}
HEAD_METRICS = set(PER_HEAD_METRICS)
LAYER_QK_METRICS = {"qk_cosine_concat"}
"""Read from queries and keys like the head metrics, but one row per block (head -1)."""
# Small and fast: a few hundred states, GRIDE up to order 8, few distribution samples.
SMALL = [
    "n_states=192",
    "settings.max_order=8",
    "settings.state_batch_size=192",
    "settings.distribution_samples=500",
    "device=cpu",
    "plot_metrics=[anisotropy,twonn]",  # each figure costs ~0.4 s on a shared CPU
]


def assert_every_metric_every_layer(
    frame: pd.DataFrame, n_layers: int, n_heads: int, *, final_norm: bool = True
) -> None:
    """Every state metric on the embedding, every block and (pre-LN models) the final norm."""
    names = ["embedding", *(f"block_{i}" for i in range(1, n_layers + 1))]
    names += ["final_norm"] if final_norm else []
    for metric in STATE_METRICS:
        rows = frame.loc[frame["metric"] == metric].sort_values("layer")
        assert rows["layer"].tolist() == list(range(len(names))), metric
        assert rows["layer_name"].tolist() == names, metric
    for metric in HEAD_METRICS:
        rows = frame[frame["metric"] == metric]
        assert len(rows) == n_layers * n_heads, metric
        assert set(rows["layer"]) == set(range(1, n_layers + 1)), metric
    for metric in LAYER_QK_METRICS:
        rows = frame.loc[frame["metric"] == metric].sort_values("layer")
        assert rows["layer"].tolist() == list(range(1, n_layers + 1)), metric
        assert (rows["head"] == -1).all(), metric
    finite = frame[frame["metric"].isin(STATE_METRICS | HEAD_METRICS | LAYER_QK_METRICS)]
    # A layer whose states are mostly copies (a tiny random model's embedding) has its
    # intrinsic dimensions NaN, with the reason in `note` (ProbeSettings.max_copy_share).
    guarded = finite["note"].str.startswith("copies: ") if "note" in finite else False
    assert np.isfinite(finite.loc[~guarded, "value"]).all()
    assert finite.loc[guarded, "metric"].isin(["twonn", "twonn_mle", "gride_k2", "gride_k8"]).all()


@pytest.fixture(scope="module")
def text_file(tmp_path_factory, tiny_text) -> Path:
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text(tiny_text * 3)  # in the tiny tokenizers' vocabulary: no <unk>
    return path


# ---------------------------------------------------------------------------------------------
# Hugging Face folders


@pytest.mark.parametrize(
    "family, kind", [("gpt2", "decoder"), ("bert", "encoder"), ("gpt_neox", "decoder"),
                     ("llama", "decoder"), ("bloom", "decoder")]
)  # fmt: skip
@pytest.mark.slow
def test_hf_folder_every_metric_every_layer(
    tmp_path, tiny_hf_folder, text_file, family, kind
) -> None:
    folder = tiny_hf_folder(family)
    cfg = compose_probe(tmp_path, [f"hf={folder}", f"text_file={text_file}", "window=32", *SMALL])
    result = probe(cfg)
    assert result.kinds == {folder: kind}
    frame = table.read_table(tmp_path)
    assert set(frame["model"]) == {folder} and frame["step"].unique().tolist() == [0]
    # The pre-LN decoders have a final norm, probed as its own layer; BERT (post-LN) has none.
    assert_every_metric_every_layer(frame, n_layers=2, n_heads=4, final_norm=family != "bert")
    info = json.loads((tmp_path / "probe_info.json").read_text())
    assert info["subjects"][0]["kind"] == kind
    expected = {"0": "embedding", "1": "block_1", "2": "block_2"}
    expected |= {"3": "final_norm"} if family != "bert" else {}
    assert info["layers"] == {folder: expected}
    assert (tmp_path / "probes" / "plots" / "profile_anisotropy.png").exists()


@pytest.mark.slow
def test_special_tokens_are_excluded_unless_asked(tmp_path, tiny_hf_folder, text_file) -> None:
    # BERT windows are [CLS] 30 chars [SEP]: 30 states per window without the specials.
    folder = tiny_hf_folder("bert")
    base = [f"hf={folder}", f"text_file={text_file}", "window=32", *SMALL, "n_states=60"]
    base += ["settings.intrinsic_dimension=false", "settings.distributions=false"]
    drift = {}
    for include in ("false", "true"):
        probe(compose_probe(tmp_path / include, [*base, f"include_special={include}"]))
        frame = table.read_table(tmp_path / include)
        drift[include] = frame.query("metric == 'drift_norm' and layer == 2")["value"].item()
    assert drift["false"] != pytest.approx(drift["true"])


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


@pytest.mark.slow
def test_encoder_decoder_is_probed_as_two_models(tmp_path, tiny_hf_folder, text_file) -> None:
    folder = tiny_hf_folder("t5")  # 2 encoder blocks, 3 decoder blocks, 4 heads
    result = probe(compose_probe(tmp_path, [f"hf={folder}", f"text_file={text_file}",
                                            "window=32", *SMALL]))
    encoder, decoder = f"{folder}:encoder", f"{folder}:decoder"
    assert result.kinds == {encoder: "encoder", decoder: "decoder"}
    frame = table.read_table(tmp_path)
    assert set(frame["model"]) == {encoder, decoder} and frame["step"].unique().tolist() == [0]
    for model, n_layers in ((encoder, 2), (decoder, 3)):  # both stacks end in final_layer_norm
        assert_every_metric_every_layer(frame.loc[frame["model"] == model], n_layers, n_heads=4)
    # The two stacks read the same probe set (same windows, positions): same number of states,
    # and the same token embeddings (T5 shares one embedding table), so the same layer-0 value.
    at = frame.loc[(frame["metric"] == "anisotropy") & (frame["layer"] == 0)].set_index("model")
    assert at.loc[encoder, "value"] == pytest.approx(at.loc[decoder, "value"], abs=1e-6)
    # CKA between layers is computed within each stack, layer x layer (3x3 and 4x4 with norms).
    cka = frame.loc[frame["metric"] == "linear_cka"]
    assert cka.groupby("model")["layer_b"].max().to_dict() == {encoder: 3, decoder: 4}
    for stack in ("encoder", "decoder"):
        assert (tmp_path / "probes" / "plots" / stack / "profile_anisotropy.png").exists()
    info = json.loads((tmp_path / "probe_info.json").read_text())
    assert info["layers"][decoder]["4"] == "final_norm" and info["layers"][encoder]["3"] == (
        "final_norm")


@pytest.mark.slow
def test_encoder_decoder_stacks_log_apart_in_wandb(
    tmp_path, tiny_hf_folder, text_file, monkeypatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    folder = tiny_hf_folder("t5")
    result = probe(compose_probe(tmp_path, [
        f"hf={folder}", f"text_file={text_file}", "window=32", *SMALL, "logger=wandb",
        "metrics=[anisotropy]", "settings.distributions=false", "plot_metrics=[anisotropy]"]))
    history = wandb_history(result.wandb_dir)
    frame = result.frame.set_index(["model", "layer"])
    for stack, final_norm in (("encoder", 3), ("decoder", 4)):  # 2 and 3 blocks, then the norm
        rows = [r for r in history if f"probe/{stack}/anisotropy/layer_00" in r]
        assert len(rows) == 1 and rows[0]["probe/step"] == 0
        for layer in range(final_norm + 1):
            assert rows[0][f"probe/{stack}/anisotropy/layer_{layer:02d}"] == pytest.approx(
                frame.loc[(f"{folder}:{stack}", layer), "value"])
        assert any(k.startswith(f"probe/plots/{stack}/profile_anisotropy.") for r in history
                   for k in r)
    assert not any(k.startswith("probe/anisotropy/") for r in history for k in r)


@pytest.mark.slow
def test_tokenizer_option_for_a_folder_without_one(tmp_path, tiny_hf_folder, text_file) -> None:
    bare = tiny_hf_folder("gpt2", tokenizer=False)  # the weights of tiny_hf_folder("gpt2")
    base = [f"text_file={text_file}", "window=32", *SMALL, "plot_metrics=[]", "metrics=[default]"]
    with pytest.raises(ValueError, match=re.escape(f"{bare} has no tokenizer; pass tokenizer=")):
        probe(compose_probe(tmp_path / "none", [f"hf={bare}", *base]))
    ours = probe(compose_probe(tmp_path / "given", [f"hf={bare}",
                                                    f"tokenizer={tiny_hf_folder('gpt2')}", *base]))
    full = probe(compose_probe(tmp_path / "full", [f"hf={tiny_hf_folder('gpt2')}", *base]))
    # Same weights, tokenizer and probe set: the same table but for the model column.
    columns = ["step", "layer", "head", "metric", "value"]
    pd.testing.assert_frame_equal(ours.frame[columns], full.frame[columns])


def test_unknown_family_still_gets_hidden_state_metrics(tmp_path, tiny_hf_folder, text_file):
    folder = tiny_hf_folder("electra")
    cfg = compose_probe(tmp_path, [f"hf={folder}", f"text_file={text_file}", "window=32", *SMALL])
    with pytest.warns(UserWarning, match="model family 'electra' has no query/key hooks"):
        result = probe(cfg)
    metrics = set(result.frame["metric"])
    assert {"anisotropy", "twonn", "attention_entropy"} <= metrics
    assert not {"qk_cosine", "qk_cosine_concat"} & metrics
    assert result.kinds == {folder: "encoder"}


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


# ---------------------------------------------------------------------------------------------
# Our checkpoints


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A tiny training run probed at steps 0, 10 and 20, with checkpoints at steps 10 and 20."""
    run_dir = tmp_path_factory.mktemp("run")
    steps_ckpt = (
        "+callbacks.every10={_target_:lightning.pytorch.callbacks.ModelCheckpoint,"
        f"dirpath:'{run_dir}/checkpoints',filename:'step{{step}}',every_n_train_steps:10,"
        "save_top_k:-1,auto_insert_metric_name:false}"
    )
    overrides = ["logger=csv", "probe.every_n_steps=10", "probe.n_log_spaced=0", steps_ckpt]
    train(compose_train(run_dir, overrides))
    return run_dir


@pytest.mark.slow
def test_checkpoint_gives_the_training_probe_numbers(tmp_path, trained_run) -> None:
    ckpt = trained_run / "checkpoints" / "last.ckpt"
    result = probe(compose_probe(tmp_path, [f"ckpt={ckpt}", "plot_metrics=[anisotropy]"]))
    assert result.kinds == {"last (step 20)": "decoder"}
    ours = table.read_table(tmp_path)
    logged = table.read_table(trained_run)
    keys = ["step", "layer", "head", "metric"]
    merged = logged.loc[logged["step"] == 20].merge(ours, on=keys, suffixes=("_train", "_probe"))
    # Every metric the training probe logged at step 20 is in probe.py's table (which also has
    # the distribution fits, off in training).
    assert len(merged) == (logged["step"] == 20).sum() > 50
    assert {"loglik_normal", "kurtosis"} <= set(ours["metric"])
    # Same weights, same windows, same code path (probe_gpt) in another process: the only
    # freedom left is float32 summation order in CPU kernels (thread count), ~1e-7 relative;
    # the estimators (TwoNN on nearest-neighbour ratios) can amplify that a little, hence 1e-5.
    np.testing.assert_allclose(
        merged["value_probe"], merged["value_train"], rtol=1e-5, atol=1e-7, err_msg="value"
    )
    np.testing.assert_allclose(
        merged["std_probe"], merged["std_train"], rtol=1e-5, atol=1e-7, err_msg="std"
    )


@pytest.mark.slow  # trains (the trained_run fixture)
def test_older_checkpoints_take_the_probe_config_from_the_run_folder(trained_run) -> None:
    """Checkpoints written before the callback saved its config: csv/hparams.yaml has it."""
    ckpt = read_checkpoint(trained_run / "checkpoints" / "last.ckpt")
    saved, origin = training_probe(ckpt, trained_run)
    assert origin == "checkpoint" and saved.n_states == 512
    ckpt["callbacks"] = {key: {"done": [0]} for key in ckpt["callbacks"]}
    from_run, origin = training_probe(ckpt, trained_run)
    assert origin.startswith("run config")
    assert (from_run.n_states, from_run.positions_per_window, from_run.seed) == (512, 4, 0)
    # The run config lists what conf/probe/default.yaml sets; ProbeSettings fills the rest.
    assert from_run.probe_settings() == saved.probe_settings()


@pytest.mark.slow
def test_checkpoint_and_its_hf_export_give_the_same_table(tmp_path, trained_run) -> None:
    """The layer convention across both probe paths: probing a checkpoint (ckpt=) and its
    Hugging Face export (hf=) on the same text, windows, settings and seed gives the same value
    on every (layer, head, metric) row that either path produces (final norm included)."""
    from dataclasses import asdict

    from repgeom.models.export_hf import export_hf

    ckpt = trained_run / "checkpoints" / "last.ckpt"
    folder = export_hf(ckpt, tmp_path / "exported")
    text = tmp_path / "valid.txt"
    text.write_text(default_text("sample"), encoding="utf-8")  # markup, non-ASCII
    # Every option the ckpt= path would otherwise take from the training probe is given
    # explicitly, so the two runs differ in nothing but the model they load.
    trained, _ = training_probe(read_checkpoint(ckpt), trained_run)
    settings = asdict(trained.probe_settings())
    settings.update(max_order=8, state_batch_size=256, distribution_samples=500, distributions=True)
    settings.pop("seed")  # the top-level seed= below sets it for both
    settings.pop("metrics")  # probe.py's own metrics= (all) chooses them for both
    block_size = 32  # hydra_configs.TINY
    common = [f"text_file={text}", f"window={block_size}", "n_states=256", "batch_size=4",
              "seed=3", "device=cpu", "plot_metrics=[]",
              *(f"++settings.{k}={str(v).lower() if isinstance(v, bool) else v}"
                for k, v in settings.items())]  # fmt: skip
    ours_run = probe(compose_probe(tmp_path / "ckpt", [f"ckpt={ckpt}", *common]))
    theirs_run = probe(compose_probe(tmp_path / "hf", [f"hf={folder}", *common]))
    assert [s.source for s in (*ours_run.subjects, *theirs_run.subjects)] == ["ours", "hf"]
    assert list(ours_run.kinds.values()) == list(theirs_run.kinds.values()) == ["decoder"]
    ours, theirs = ours_run.frame, theirs_run.frame

    keys = ["layer", "layer_b", "head", "metric"]  # layer_b: the pairwise (CKA) rows
    assert not ours.duplicated(keys).any() and not theirs.duplicated(keys).any()
    merged = ours.merge(theirs, on=keys, how="outer", suffixes=("_ckpt", "_hf"), indicator=True)
    only = merged.loc[merged["_merge"] != "both", [*keys, "_merge"]]
    assert only.empty, f"rows only one path produced:\n{only}"
    assert len(merged) > 100 and {"anisotropy", "twonn", "qk_cosine", "linear_cka"} <= set(
        merged["metric"]
    )
    # On this CPU the two tables come out bit-identical (the same float32 kernels in the same
    # order); other kernels may differ in summation order (~1e-6 on the states, as the export
    # tests measure on large weights), which nearest-neighbour ratios and distribution fits
    # amplify somewhat: 1e-4, relative for large values (log-likelihoods), absolute near zero.
    for column in ("value", "std"):
        np.testing.assert_allclose(
            merged[f"{column}_hf"], merged[f"{column}_ckpt"], rtol=1e-4, atol=1e-4,
            err_msg=column,
        )  # fmt: skip


@pytest.mark.slow
def test_run_folder_is_a_trajectory_with_one_step_per_checkpoint(tmp_path, trained_run) -> None:
    assert [s for s, _ in find_checkpoints(trained_run)] == [10, 20]
    overrides = [f"run={trained_run}", "logger=wandb", "settings.distributions=false",
                 "plot_metrics=[anisotropy,twonn]"]  # fmt: skip
    os.environ.setdefault("WANDB_MODE", "offline")
    result = probe(compose_probe(tmp_path, overrides))
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
# Compare


def test_compare_identical_texts_hf(tmp_path, tiny_hf_folder) -> None:
    folder = tiny_hf_folder("bert")
    text = "the lazy dog sleeps"
    result = probe(
        compose_probe(tmp_path, [f"hf={folder}", f"compare.text_a='{text}'",
                                 f"compare.text_b='{text}'"])
    )  # fmt: skip
    pooled = pd.read_csv(tmp_path / "compare" / "pooled_cosine.csv")
    assert pooled["layer"].tolist() == [0, 1, 2]  # BERT is post-LN: no final norm
    np.testing.assert_allclose(pooled["pooled_cosine"], 1.0, atol=1e-6)  # float32 states
    assert (tmp_path / "compare" / "compare.png").stat().st_size > 10_000
    matrix = pd.read_csv(tmp_path / "compare" / "token_cosine_last_layer.csv", index_col=0)
    assert matrix.shape == (len(text), len(text))  # [CLS]/[SEP] excluded
    np.testing.assert_allclose(np.diag(matrix.to_numpy()), 1.0, atol=1e-5)
    assert result.frame.empty and result.kinds == {folder: "encoder"}


def test_compare_encoder_decoder_writes_one_file_per_stack(tmp_path, tiny_hf_folder) -> None:
    folder = tiny_hf_folder("t5")
    probe(compose_probe(tmp_path, [f"hf={folder}", "compare.text_a='the cat sat'",
                                   "compare.text_b='a dog ran.'", "device=cpu"]))
    encoder, decoder = (
        pd.read_csv(tmp_path / "compare" / f"pooled_cosine_step0_{stack}.csv")
        for stack in ("encoder", "decoder")
    )
    # Every probed layer, as in the probe table: T5's stacks end in a final norm.
    assert encoder["layer"].tolist() == [0, 1, 2, 3]
    assert decoder["layer"].tolist() == [0, 1, 2, 3, 4]
    assert encoder["layer_name"].tolist() == ["embedding", "block_1", "block_2", "final_norm"]
    assert set(encoder["model"]) == {f"{folder}:encoder"} and set(decoder["kind"]) == {"decoder"}
    # Layer 0 is the embedding of the same tokens in both stacks (T5 shares one table).
    assert encoder["pooled_cosine"][0] == pytest.approx(decoder["pooled_cosine"][0], abs=1e-6)
    assert encoder["pooled_cosine"][1] != pytest.approx(decoder["pooled_cosine"][1], abs=1e-3)


@pytest.mark.slow  # trains (the trained_run fixture)
def test_compare_different_texts_checkpoint(tmp_path, trained_run) -> None:
    ckpt = trained_run / "checkpoints" / "last.ckpt"
    probe(compose_probe(tmp_path, [f"ckpt={ckpt}", "compare.text_a=abc", "compare.text_b='xyz!'"]))
    pooled = pd.read_csv(tmp_path / "compare" / "pooled_cosine.csv")
    # The probe table's layers: embedding, two blocks, our GPT's final norm.
    assert pooled["layer_name"].tolist() == ["embedding", "block_1", "block_2", "final_norm"]
    assert (pooled["pooled_cosine"] < 1 - 1e-4).all()
    matrix = pd.read_csv(tmp_path / "compare" / "token_cosine_last_layer.csv", index_col=0)
    assert matrix.shape == (3, 4)
    assert (tmp_path / "compare" / "compare.png").exists()


# ---------------------------------------------------------------------------------------------
# Bad input


def test_missing_paths(tmp_path) -> None:
    for override, match in (
        ("ckpt=/nonexistent/last.ckpt", "ckpt='/nonexistent/last.ckpt': no such file"),
        ("run=/nonexistent/run", "run='/nonexistent/run': no such folder"),
        ("hf=/nonexistent/model", "no such local folder"),
    ):
        with pytest.raises(FileNotFoundError, match=match):
            probe(compose_probe(tmp_path, [override]))
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        probe(compose_probe(tmp_path, [f"run={tmp_path / 'empty_run'}"]))


def test_checkpoint_of_another_format(tmp_path, tiny_hf_folder) -> None:
    state_dict = tmp_path / "weights.pt"
    torch.save({"layer.weight": torch.zeros(2, 2)}, state_dict)
    with pytest.raises(CheckpointFormatError, match="plain state dict"):
        probe(compose_probe(tmp_path, [f"ckpt={state_dict}"]))
    lightning_other = tmp_path / "other.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"lr": 0.1}}, lightning_other)
    with pytest.raises(CheckpointFormatError, match="not one of repgeom's CharLM"):
        probe(compose_probe(tmp_path, [f"ckpt={lightning_other}"]))
    text = tmp_path / "notes.ckpt"
    text.write_text("not a checkpoint")
    with pytest.raises(CheckpointFormatError, match="torch.load cannot read it"):
        probe(compose_probe(tmp_path, [f"ckpt={text}"]))
    with pytest.raises(ValueError, match="use ckpt= instead|not a Hugging Face model folder"):
        probe(compose_probe(tmp_path, [f"hf={tmp_path}"]))


@pytest.mark.slow  # trains (the trained_run fixture)
def test_text_shorter_than_the_window(tmp_path, tiny_hf_folder, trained_run) -> None:
    short = tmp_path / "short.txt"
    short.write_text("too short")
    folder = tiny_hf_folder("gpt2")
    with pytest.raises(ValueError, match="one window of 32 tokens"):
        probe(compose_probe(tmp_path, [f"hf={folder}", f"text_file={short}", "window=32"]))
    ckpt = trained_run / "checkpoints" / "last.ckpt"
    with pytest.raises(ValueError, match="block_size=32"):
        probe(compose_probe(tmp_path, [f"ckpt={ckpt}", f"text_file={short}"]))


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
        probe(compose_probe(tmp_path, overrides))


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
    result = probe_with_analyses(cfg)  # probe.py's function: the pipeline and its extras
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
        runner.check_config(cfg)
    cfg = compose_probe(tmp_path, [f"run={tmp_path}", f"labels.csv={tmp_path / 'none.csv'}"])
    with pytest.raises(ValueError, match="labels.csv fits the distributions of one model"):
        runner.check_config(cfg)


@pytest.mark.slow
def test_model_name_labels_the_table(tmp_path, tiny_hf_folder, text_file) -> None:
    cfg = compose_probe(tmp_path, [f"hf={tiny_hf_folder('gpt2')}", f"text_file={text_file}",
                                   "window=32", *SMALL, "plot_metrics=[]", "model_name=tiny-gpt2",
                                   "settings.distributions=false"])
    result = probe(cfg)
    assert set(result.frame["model"]) == {"tiny-gpt2"}
    assert set(result.drift_cosine["model"]) == {"tiny-gpt2"}


def test_protocol_llm_microscope_on_an_hf_model(tmp_path, tiny_hf_folder, text_file,
                                                capsys) -> None:
    """protocol=llm_microscope: whole windows of the authors' 512 tokens (at most the model's
    positions), the authors' TwoNN rows, and probe_info.json naming the protocol."""
    folder = tiny_hf_folder("gpt2")
    cfg = compose_probe(tmp_path, [f"hf={folder}", f"text_file={text_file}",
                                   "protocol=llm_microscope", "n_states=256",
                                   "settings.state_batch_size=256", "settings.max_order=8",
                                   "settings.distributions=false", "plot_metrics=[]",
                                   "metrics=[default]"])
    result = probe(cfg)
    metrics_seen = set(result.frame["metric"])
    assert "twonn_llm_microscope" in metrics_seen and "twonn" not in metrics_seen
    info = json.loads((tmp_path / "probe_info.json").read_text())
    assert info["protocol"] == "llm_microscope" and info["twonn_convention"] == "llm_microscope"
    # The authors' 512-token chunks, cut to the tiny model's 64 positions; whole windows.
    assert "256 states from 4 windows of 64 tokens" in capsys.readouterr().out
