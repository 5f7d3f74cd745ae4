"""texts=shuffled: each window's tokens shuffled among its probe-able positions, seeded, the
same windows and positions, for probe.py and the training callback."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hydra_configs import compose_job, compose_train

from repgeom.probes.core import table
from repgeom.probes.core.sampling import WindowPool, draw, shuffle_tokens
from repgeom.probes.core.spec import ProbeSpec
from repgeom.probes.run.runner import probe
from repgeom.train import train

SMALL = ["n_states=192", "settings.max_order=8", "settings.state_batch_size=192",
         "metrics=[default]", "settings.distributions=false", "device=cpu", "plot_metrics=[]"]


def test_shuffle_keeps_each_windows_tokens_and_the_left_out_positions() -> None:
    windows = torch.randint(0, 50, (30, 40), generator=torch.Generator().manual_seed(0))
    candidates = torch.ones_like(windows, dtype=torch.bool)
    candidates[:, 0] = False  # a BOS token
    candidates[5, 30:] = False  # padding
    shuffled = shuffle_tokens(windows, candidates, seed=4)
    assert torch.equal(shuffled[~candidates], windows[~candidates])
    for row in range(len(windows)):
        keep = candidates[row]
        assert sorted(shuffled[row, keep].tolist()) == sorted(windows[row, keep].tolist())
    assert (shuffled != windows).float().mean() > 0.8  # the order is gone
    assert torch.equal(shuffled, shuffle_tokens(windows, candidates, seed=4))  # seeded
    assert not torch.equal(shuffled, shuffle_tokens(windows, candidates, seed=5))


def test_draw_shuffles_the_same_windows_at_the_same_positions() -> None:
    windows = torch.arange(200 * 16).reshape(200, 16) % 97
    real = draw(WindowPool.of_windows(windows), ProbeSpec(n_states=64, seed=2))
    shuffled = draw(WindowPool.of_windows(windows), ProbeSpec(n_states=64, seed=2,
                                                              texts="shuffled"))
    assert torch.equal(real.positions, shuffled.positions)
    assert torch.equal(real.windows.sort(dim=1).values, shuffled.windows.sort(dim=1).values)
    assert not torch.equal(real.windows, shuffled.windows)
    assert shuffled.describe()["texts"] == "shuffled" and real.describe()["texts"] == "real"
    with pytest.raises(ValueError, match="texts must be one of real, shuffled"):
        ProbeSpec(texts="reversed")


@pytest.mark.slow
def test_probe_py_and_the_callback_probe_shuffled_text(trained_run, tmp_path) -> None:
    path = trained_run / "checkpoints" / "last.ckpt"
    real = probe(compose_job(tmp_path / "real", [f"ckpt={path}", *SMALL])).frame
    shuffled = probe(compose_job(tmp_path / "shuffled", [f"ckpt={path}", "texts=shuffled",
                                                           *SMALL])).frame
    info = json.loads((tmp_path / "shuffled" / "probe_info.json").read_text())
    assert info["texts"] == "shuffled"
    assert (shuffled[table.TEXTS_COLUMN] == "shuffled").all()
    assert table.TEXTS_COLUMN not in real.columns
    keys = ["layer", "head", "metric"]
    both = real.merge(shuffled, on=keys, suffixes=("_real", "_shuffled"))
    assert len(both) == len(real) == len(shuffled)  # the same rows
    rows = both.set_index(keys)
    # the embedding layer holds each token's own vector plus its position's: the same tokens
    # at other positions give other states; the loss of a model that learnt something from the
    # order of characters rises
    assert not np.isclose(rows.loc[(0, -1, "anisotropy"), "value_real"],
                          rows.loc[(0, -1, "anisotropy"), "value_shuffled"], rtol=1e-6)
    loss = rows.loc[(table.MODEL_LAYER, -1, "lm_loss")]
    assert loss["value_shuffled"] > loss["value_real"]


@pytest.mark.slow
def test_the_training_callback_takes_probe_texts(tmp_path) -> None:
    train(compose_train(tmp_path, ["logger=csv", "probe.texts=shuffled", "trainer.max_steps=2",
                                   "probe.every_n_steps=2"]))
    described = json.loads((table.probe_dir(tmp_path) / "probe_set.json").read_text())
    assert described["texts"] == "shuffled"
    frame = table.read_table(tmp_path)
    assert {"anisotropy", "lm_loss"} <= set(frame["metric"])


def test_checkpoints_hold_texts_only_when_shuffled() -> None:
    """A checkpoint of real text holds no `texts` (a repgeom from before the field reads it);
    one of shuffled text holds it, and both read back."""
    real, shuffled = ProbeSpec(), ProbeSpec(texts="shuffled")
    assert "texts" not in real.to_dict() and shuffled.to_dict()["texts"] == "shuffled"
    for spec in (real, shuffled):
        assert ProbeSpec.from_checkpoint({"spec": spec.to_dict()}) == spec


def test_a_table_never_mixes_real_and_shuffled_rows(tmp_path) -> None:
    """The ``texts`` column marks shuffled rows; appending rows of the other texts (a resumed
    probe with texts= changed) is refused, and so is a resumed trajectory before any work."""
    from repgeom.probes.report import sink
    from repgeom.probes.run.resume import done_steps

    rows = [dict(step=0, layer=1, metric="anisotropy", value=0.5, model="m")]
    frame = sink.write_step(tmp_path, rows, texts="shuffled")
    assert frame[table.TEXTS_COLUMN].tolist() == ["shuffled"]
    assert table.texts_of(frame) == {"shuffled"}
    sink.write_step(tmp_path, [{**rows[0], "step": 5}], texts="shuffled")  # the same: appended
    with pytest.raises(ValueError, match="one table never mixes them"):
        sink.write_step(tmp_path, [{**rows[0], "step": 10}], texts="real")
    assert sorted(table.read_table(tmp_path)["step"]) == [0, 5]  # left as it was
    with pytest.raises(ValueError, match="texts=real was asked"):
        done_steps(tmp_path, "real")
    assert done_steps(tmp_path, "shuffled") == {("m", "step=0"), ("m", "step=5")}
    real = tmp_path / "real"
    assert table.TEXTS_COLUMN not in sink.write_step(real, rows).columns  # real: as before
    with pytest.raises(ValueError, match="one table never mixes them"):
        sink.write_step(real, [{**rows[0], "step": 5}], texts="shuffled")


def test_shuffling_keeps_special_tokens_in_place_even_where_probed() -> None:
    """``include_special=true``: BOS/CLS/SEP may be probed, yet stay where they are; only the
    ordinary tokens move."""
    bos, sep = 1, 2
    body = torch.arange(200 * 14).reshape(200, 14) % 90 + 10
    windows = torch.cat([torch.full((200, 1), bos), body, torch.full((200, 1), sep)], dim=1)
    pool = WindowPool(len(windows), windows.shape[1], lambda chosen: (
        windows[torch.from_numpy(chosen)], torch.ones((len(chosen), windows.shape[1]),
                                                      dtype=torch.bool), None), (bos, sep))
    shuffled = draw(pool, ProbeSpec(n_states=64, seed=2, texts="shuffled")).windows
    assert (shuffled[:, 0] == bos).all() and (shuffled[:, -1] == sep).all()
    real = draw(pool, ProbeSpec(n_states=64, seed=2)).windows
    assert torch.equal(shuffled.sort(dim=1).values, real.sort(dim=1).values)
    assert (shuffled[:, 1:-1] != real[:, 1:-1]).float().mean() > 0.5  # the ordinary ones move


@pytest.mark.slow
def test_hf_windows_keep_cls_and_sep_when_shuffled(tiny_hf_folder, text_file) -> None:
    from repgeom.models.hf import load_hf_model
    from repgeom.probes.core.spec import ProbeRequest, resolve
    from repgeom.probes.core.targets import hf_probe_set

    hf = load_hf_model(tiny_hf_folder("bert"))
    cls, sep = hf.tokenizer.cls_token_id, hf.tokenizer.sep_token_id
    for include in (False, True):
        request = ProbeRequest(n_states=60, window=32, text_file=str(text_file),
                               include_special=include, texts="shuffled")
        probes = hf_probe_set(hf, request, resolve(request))
        real = hf_probe_set(hf, request, resolve(ProbeRequest(
            n_states=60, window=32, text_file=str(text_file), include_special=include)))
        ids = probes.windows
        assert torch.equal(ids == cls, real.windows == cls)
        assert torch.equal(ids == sep, real.windows == sep)
        assert not torch.equal(ids, real.windows)
        assert probes.positions[:, 0].any() == include  # CLS probed only when asked
