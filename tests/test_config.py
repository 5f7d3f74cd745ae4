"""Every config group composes and instantiates; mistakes fail with Hydra's list of what exists."""

import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import lightning as L
import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from hydra.utils import instantiate
from hydra_configs import CONF_DIR, ROOT, compose_probe, compose_train
from omegaconf import OmegaConf

from repgeom.models.gpt import GPTConfig
from repgeom.probes.core.spec import ProbeSpec, resolve
from repgeom.probes.run.callback import ProbeCallback
from repgeom.probes.run.job import probe_request
from repgeom.train import build_callbacks, build_loggers, train


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("model", _options("model"))
@pytest.mark.parametrize("masking", _options("masking"))
def test_every_model_and_masking_composes(tmp_path: Path, model: str, masking: str) -> None:
    # Real sizes (no TINY model overrides): the config a user gets.
    cfg = compose_train(tmp_path, [f"model={model}", f"masking={masking}"], tiny=False)
    config = instantiate(cfg.model, vocab_size=206, causal=cfg.masking.causal)
    assert isinstance(config, GPTConfig)
    assert config.causal is (masking == "causal")
    OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves


def test_bert_small_is_gpt_small_with_post_norm(tmp_path: Path) -> None:
    gpt = OmegaConf.load(CONF_DIR / "model" / "gpt_small.yaml")
    bert = compose_train(tmp_path, ["model=bert_small"], tiny=False).model
    assert bert.norm == "post" and gpt.norm == "pre"
    for key in ("n_layer", "n_head", "n_embd"):
        assert bert[key] == gpt[key]


@pytest.mark.parametrize(
    "group", ["data", "optim", "trainer", "logger", "callbacks", "probe", "experiment"]
)
def test_every_group_option_instantiates(tmp_path: Path, group: str) -> None:
    for option in _options(group):
        cfg = compose_train(tmp_path, [f"{group}={option}"])
        OmegaConf.to_container(cfg, resolve=True)
        callbacks = build_callbacks(cfg)
        loggers = build_loggers(cfg)
        assert all(hasattr(cb, "on_train_start") for cb in callbacks)
        if group == "logger" and option == "none":
            assert loggers == []
        if group == "data":
            assert instantiate(cfg.data).__class__.__name__ == "Enwik8DataModule"


def test_unknown_option_lists_what_exists(tmp_path: Path) -> None:
    with pytest.raises(MissingConfigException) as error:
        compose_train(tmp_path, ["model=gpt_huge"])
    assert "gpt_tiny" in str(error.value) and "gpt_small" in str(error.value)


def test_unknown_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigCompositionException, match="n_layers"):
        compose_train(tmp_path, ["model.n_layers=3"])


@pytest.mark.slow
@pytest.mark.parametrize("masking", ["causal", "bidirectional"])
def test_cfg_job_resolves_for_gpt_small(masking: str) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "train.py",
            "model=gpt_small",
            f"masking={masking}",
            "--cfg",
            "job",
            "--resolve",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    cfg = OmegaConf.create(out)
    assert cfg.model.n_layer == 12 and cfg.model.n_embd == 512 and cfg.model.block_size == 512
    assert cfg.masking.causal is (masking == "causal")
    assert cfg.data.source == "enwik8"  # the real run trains on the full, downloaded file
    assert cfg.run_name == f"gpt_small-{masking}-enwik8-seed0"


@pytest.mark.parametrize("experiment", _options("experiment"))
def test_probe_none_switches_the_probe_off_in_every_preset(tmp_path: Path, experiment: str) -> None:
    # the presets set probe.* values and are composed after the probe group: with probe=none
    # they still land in cfg.probe, which must not become a callback (it used to be handed to
    # Lightning as a plain dict: "Missing key on_exception")
    cfg = compose_train(tmp_path, [f"experiment={experiment}", "probe=none"])
    callbacks = build_callbacks(cfg)
    assert all(isinstance(cb, L.Callback) for cb in callbacks)
    assert not any(isinstance(cb, ProbeCallback) for cb in callbacks)
    with_probe = build_callbacks(compose_train(tmp_path, [f"experiment={experiment}"]))
    assert sum(isinstance(cb, ProbeCallback) for cb in with_probe) == 1


@pytest.mark.parametrize("preset", [[], ["experiment=quickstart"]])
def test_probe_that_is_not_a_callback_fails_with_the_options(tmp_path: Path, preset) -> None:
    # `~probe` drops the probe group; a preset's probe.* values then make a dict without
    # _target_. Not the probe=none flag, so an error, naming probe and the options
    cfg = compose_train(tmp_path, [*preset, "~probe"], tiny=False)
    if not preset:  # no preset: no probe at all, which is fine
        assert not any(isinstance(cb, ProbeCallback) for cb in build_callbacks(cfg))
        return
    match = (r"probe has no _target_.*probe=<option>, one of "
             r"\['default', 'full', 'llm_microscope', 'none'\]")
    with pytest.raises(ValueError, match=match):
        build_callbacks(cfg)
    with pytest.raises(ValueError, match=match):  # train() refuses before it builds anything
        train(cfg)
    assert not (tmp_path / "checkpoints").exists()


def test_each_protocol_is_one_preset_read_by_both_commands(tmp_path: Path) -> None:
    """conf/probe/llm_microscope.yaml (the training probe) includes probe.py's
    conf/protocol/llm_microscope.yaml: both resolve to the same probe set and estimator options,
    and every position is spelled ``all`` in both."""
    train_cfg = compose_train(tmp_path, ["probe=llm_microscope"], tiny=False)
    assert train_cfg.probe.positions_per_window == "all"
    given = OmegaConf.to_container(train_cfg.probe, resolve=True)
    trained = ProbeCallback(**{k: v for k, v in given.items() if k != "_target_"}).spec
    probe_cfg = compose_probe(tmp_path, ["hf=gpt2", "protocol=llm_microscope"])
    assert probe_cfg.positions_per_window == "all"
    asked = resolve(probe_request(probe_cfg), seed=trained.seed)
    fields = ("protocol", "n_states", "positions_per_window", "attention_windows")
    assert [getattr(trained, f) for f in fields] == [getattr(asked, f) for f in fields]
    # the estimator options too, but `distributions`: probe.py fits them by default (slow), the
    # training probe does not (conf/probe.yaml, conf/probe/default.yaml), whatever the protocol
    options = [{**asdict(spec.settings), "distributions": None} for spec in (trained, asked)]
    assert options[0] == options[1]
    assert (trained.protocol, trained.n_states, trained.positions_per_window) == (
        "llm_microscope", 4096, None)  # None: every position, as checkpoints hold it
    assert trained.settings.twonn_convention == "llm_microscope"
    assert ProbeSpec(positions_per_window="all") == ProbeSpec(positions_per_window=None)
    for bad in (0, "every", True, 2.5):
        with pytest.raises(ValueError, match="positions_per_window must be a positive integer "
                                             "or 'all'"):
            ProbeSpec(positions_per_window=bad)
