"""probe.py's targets end to end: Hugging Face folders of every family, our checkpoints
(the training probe's numbers, the same table as their Hugging Face export) and the
protocols."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from hydra_configs import compose_job, compose_probe
from probe_runs import SMALL, assert_every_metric_every_layer
from wandb_records import wandb_history

from repgeom.models.checkpoints import read_checkpoint
from repgeom.probes.core import table
from repgeom.probes.core.spec import training_probe
from repgeom.probes.core.texts import default_text
from repgeom.probes.run.job import probe_job
from repgeom.probes.run.runner import probe

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
    result = probe(probe_job(cfg))
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
        probe(compose_job(tmp_path / include, [*base, f"include_special={include}"]))
        frame = table.read_table(tmp_path / include)
        drift[include] = frame.query("metric == 'drift_norm' and layer == 2")["value"].item()
    assert drift["false"] != pytest.approx(drift["true"])


@pytest.mark.slow
def test_encoder_decoder_is_probed_as_two_models(tmp_path, tiny_hf_folder, text_file) -> None:
    folder = tiny_hf_folder("t5")  # 2 encoder blocks, 3 decoder blocks, 4 heads
    result = probe(compose_job(tmp_path, [f"hf={folder}", f"text_file={text_file}",
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
    result = probe(compose_job(tmp_path, [
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
        probe(compose_job(tmp_path / "none", [f"hf={bare}", *base]))
    ours = probe(compose_job(tmp_path / "given", [f"hf={bare}",
                                                    f"tokenizer={tiny_hf_folder('gpt2')}", *base]))
    full = probe(compose_job(tmp_path / "full", [f"hf={tiny_hf_folder('gpt2')}", *base]))
    # Same weights, tokenizer and probe set: the same table but for the model column.
    columns = ["step", "layer", "head", "metric", "value"]
    pd.testing.assert_frame_equal(ours.frame[columns], full.frame[columns])


def test_unknown_family_still_gets_hidden_state_metrics(tmp_path, tiny_hf_folder, text_file):
    folder = tiny_hf_folder("electra")
    cfg = compose_probe(tmp_path, [f"hf={folder}", f"text_file={text_file}", "window=32", *SMALL])
    with pytest.warns(UserWarning, match="model family 'electra' has no query/key hooks"):
        result = probe(probe_job(cfg))
    metrics = set(result.frame["metric"])
    assert {"anisotropy", "twonn", "attention_entropy"} <= metrics
    assert not {"qk_cosine", "qk_cosine_concat"} & metrics
    assert result.kinds == {folder: "encoder"}


# ---------------------------------------------------------------------------------------------
# Our checkpoints


@pytest.mark.slow
def test_checkpoint_gives_the_training_probe_numbers(tmp_path, trained_run) -> None:
    ckpt = trained_run / "checkpoints" / "last.ckpt"
    result = probe(compose_job(tmp_path, [f"ckpt={ckpt}", "plot_metrics=[anisotropy]"]))
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
    ours_run = probe(compose_job(tmp_path / "ckpt", [f"ckpt={ckpt}", *common]))
    theirs_run = probe(compose_job(tmp_path / "hf", [f"hf={folder}", *common]))
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
    result = probe(probe_job(cfg))
    metrics_seen = set(result.frame["metric"])
    assert "twonn_llm_microscope" in metrics_seen and "twonn" not in metrics_seen
    info = json.loads((tmp_path / "probe_info.json").read_text())
    assert info["protocol"] == "llm_microscope" and info["twonn_convention"] == "llm_microscope"
    # The authors' 512-token chunks, cut to the tiny model's 64 positions; whole windows.
    assert "256 states from 4 windows of 64 tokens" in capsys.readouterr().out
