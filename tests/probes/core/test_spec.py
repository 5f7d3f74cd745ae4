"""The one resolved probe spec (`repgeom.probes.core.spec.resolve`): the command line's values, then
the training probe's, then the defaults; and probe.py's options read once (`ProbeRequest`)."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from repgeom.models.checkpoints import read_checkpoint
from repgeom.probes.core.measure import ProbeSettings
from repgeom.probes.core.sampling import DEFAULT_N_STATES, DEFAULT_POSITIONS_PER_WINDOW
from repgeom.probes.core.spec import (
    EstimatorOptions,
    ProbeRequest,
    ProbeSpec,
    resolve,
    training_probe,
)
from repgeom.probes.run.job import probe_request

TRAINED = ProbeSpec(n_states=512, positions_per_window=None, attention_windows=3, batch_size=4,
                    seed=9, metrics=["anisotropy"], settings={"state_batch_size": 64},
                    protocol="llm_microscope")


def test_nothing_asked_gives_the_defaults_and_the_fallback_seed() -> None:
    spec = resolve(ProbeRequest(), seed=5)
    assert spec == ProbeSpec(seed=5)
    assert (spec.n_states, spec.positions_per_window) == (DEFAULT_N_STATES,
                                                          DEFAULT_POSITIONS_PER_WINDOW)
    assert resolve(ProbeRequest()).seed == ProbeSettings.seed  # no fallback: the one default


def test_the_training_probe_wins_over_defaults_and_the_fallback_seed() -> None:
    spec = resolve(ProbeRequest(), TRAINED, seed=5)
    assert spec == TRAINED  # positions_per_window None (every position) is kept, not defaulted


def test_the_command_line_wins_field_by_field() -> None:
    request = ProbeRequest(n_states=100, positions_per_window="all", seed=2,
                           metrics=("intrinsic_dimension",), settings={"max_order": 8})
    spec = resolve(request, TRAINED)
    assert (spec.n_states, spec.positions_per_window, spec.seed) == (100, None, 2)
    assert (spec.attention_windows, spec.batch_size, spec.protocol) == (3, 4, "llm_microscope")
    assert spec.metrics == ["intrinsic_dimension"]
    # Estimator options merge: the training probe's, then the command line's.
    assert (spec.settings.state_batch_size, spec.settings.max_order) == (64, 8)
    settings = spec.probe_settings()
    assert (settings.seed, settings.metrics) == (2, ("intrinsic_dimension",))


def test_a_new_spec_field_needs_no_resolution_code() -> None:
    """Every field of `ProbeSpec` is one of `ProbeRequest` too, so `resolve` takes it over by
    name (a new option is its two fields and its YAML line)."""
    spec_fields = {f.name for f in dataclasses.fields(ProbeSpec)}
    assert spec_fields <= {f.name for f in dataclasses.fields(ProbeRequest)}
    for name in ("n_states", "attention_windows", "batch_size"):
        assert getattr(resolve(ProbeRequest(**{name: 7}), TRAINED), name) == 7


def test_request_from_config_reads_probe_yaml_keys() -> None:
    cfg = OmegaConf.create({"n_states": 64, "positions_per_window": "all", "seed": None,
                            "metrics": ["all"], "settings": {"max_order": None, "attention": False},
                            "text_file": None, "text_source": "sample", "window": None,
                            "include_special": False, "protocol": "repgeom", "hf": "x"})
    request = probe_request(cfg)
    assert request == ProbeRequest(n_states=64, positions_per_window="all", metrics=("all",),
                                   settings={"attention": False}, protocol="repgeom")


@pytest.mark.parametrize(("given", "match"), [
    ({"n_states": 0}, "n_states must be a positive integer"),
    ({"batch_size": True}, "batch_size must be a positive integer"),
    ({"positions_per_window": "some"}, "positions_per_window must be a positive integer, 'all'"),
    ({"settings": {"seed": 3}}, r"settings.seed: give it as seed="),
    ({"settings": {"twonn_batch": 3}}, "settings: unknown key 'twonn_batch'"),
])
def test_bad_requests_name_the_option(given, match) -> None:
    with pytest.raises(ValueError, match=match):
        ProbeRequest(**given)


def test_estimator_options_mirror_probe_settings() -> None:
    """`EstimatorOptions` is `ProbeSettings` less seed and metrics, with the same defaults:
    written once."""
    ours = {f.name: f.default for f in dataclasses.fields(EstimatorOptions)}
    theirs = {f.name: f.default for f in dataclasses.fields(ProbeSettings)
              if f.name not in ("seed", "metrics")}
    assert ours == theirs


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
