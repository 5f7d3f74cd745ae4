"""The LM loss rows on the probe's own windows: `probe.py ckpt=` of a decoder and of an encoder
equals the training module's own validation loss on the same windows and positions, and the
training callback writes the same rows."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hydra_configs import compose_probe, compose_train

from repgeom.models.checkpoints import read_checkpoint
from repgeom.models.lightning_module import CharLM
from repgeom.probes.core import table
from repgeom.probes.core.spec import ProbeRequest
from repgeom.probes.core.targets import checkpoint_probe_set, checkpoint_spec
from repgeom.probes.run.runner import probe
from repgeom.train import train

SMALL = ["n_states=192", "settings.max_order=8", "settings.state_batch_size=192",
         "metrics=[default]", "settings.distributions=false", "device=cpu", "plot_metrics=[]"]


@pytest.fixture(scope="module")
def encoder_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("encoder")
    train(compose_train(run_dir, ["logger=csv", "masking=bidirectional"]))
    return run_dir


def _model_rows(frame, step=None):
    rows = frame.loc[frame["layer"] == table.MODEL_LAYER]
    if step is not None:
        rows = rows.loc[rows["step"] == step]
    assert (rows["layer_name"] == "model").all()
    return rows.set_index("metric")


def _validation_loss(path: Path) -> float:
    """The training module's own loss (`CharLM._loss`/`_logits_loss`, what validation_step
    logs) on the windows `probe.py ckpt=` draws, at the positions it predicts."""
    module = CharLM.load_from_checkpoint(path, map_location="cpu").eval()
    ckpt = read_checkpoint(path)
    request = ProbeRequest.from_config(compose_probe(path.parent, SMALL))
    spec, _ = checkpoint_spec(request, path, ckpt)
    probes = checkpoint_probe_set(path, ckpt, module.vocab, module.model.config.block_size, spec)
    windows = probes.windows
    with torch.no_grad():
        if module.causal:  # the next character at each sampled position inside its window
            targets = torch.full_like(windows, -100)
            targets[:, :-1] = torch.where(probes.positions[:, :-1], windows[:, 1:], -100)
            return float(module._logits_loss(windows, targets))
        # an encoder: validation's masking of the windows (one extra column, which _loss drops)
        padded = torch.cat([windows, windows[:, :1]], dim=1)
        return float(module._loss(padded, generator_seed=spec.seed)[0])


@pytest.mark.parametrize("kind", ["decoder", "encoder"])
def test_probe_py_bpc_equals_the_validation_loss_on_the_same_windows(
        kind, trained_run, encoder_run, tmp_path) -> None:
    run = trained_run if kind == "decoder" else encoder_run
    path = run / "checkpoints" / "last.ckpt"
    frame = probe(compose_probe(tmp_path, [f"ckpt={path}", *SMALL])).frame
    rows = _model_rows(frame)
    expected = _validation_loss(path)
    # float32 logits on both sides, other kernels (the probe's head runs on the sampled rows):
    # measured 7e-7 (decoder) and 3e-8 (encoder); the bound asked for is 1e-4
    assert rows.loc["lm_loss", "value"] == pytest.approx(expected, abs=1e-4)
    assert rows.loc["bpc", "value"] == pytest.approx(expected / math.log(2), abs=1e-4)
    assert 0 < rows.loc["lm_loss", "std"] < 0.2 * rows.loc["lm_loss", "value"]


def test_the_training_callback_writes_the_loss_rows_at_every_probe_step(trained_run) -> None:
    frame = table.read_table(trained_run)
    steps = sorted(set(frame.loc[frame["layer"] >= 0, "step"]))
    for step in steps:
        rows = _model_rows(frame, step)
        assert set(rows.index) == {"lm_loss", "bpc"}
        assert rows.loc["bpc", "value"] == pytest.approx(rows.loc["lm_loss", "value"]
                                                         / math.log(2), rel=1e-12)
    first, last = (_model_rows(frame, s).loc["lm_loss", "value"] for s in (steps[0], steps[-1]))
    assert first == pytest.approx(math.log(205), rel=0.1)  # untrained: about uniform
    assert last < first  # trained for 20 steps
