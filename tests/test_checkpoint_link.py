"""conf/callbacks/default.yaml's checkpoint: ``save_last: link`` (issue 41) keeps last.ckpt the
state that ``save_last: true`` kept, without writing it twice, and replaces the link atomically."""

import os
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from repgeom.checkpoint_link import ModelCheckpoint


class _Scored(BoringModel):
    """A model whose val/bpc at each validation is read from `scores` (2 improves on 3, then
    2.5 does not)."""

    scores = (3.0, 2.0, 2.5)

    def __init__(self) -> None:
        super().__init__()
        self.validations = 0

    def on_validation_epoch_end(self) -> None:
        self.log("val/bpc", self.scores[min(self.validations, len(self.scores) - 1)])
        self.validations += 1


def _fit(folder, save_last) -> tuple[dict, ModelCheckpoint]:
    callback = ModelCheckpoint(dirpath=folder, filename="best", monitor="val/bpc", mode="min",
                               save_top_k=1, save_last=save_last)
    trainer = L.Trainer(max_steps=6, val_check_interval=2, limit_val_batches=1,
                        num_sanity_val_steps=0, callbacks=[callback], logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu")
    L.seed_everything(0, verbose=False)
    trainer.fit(_Scored())
    last = torch.load(folder / "last.ckpt", weights_only=False)
    return last, callback


def test_last_is_a_link_to_the_same_state_save_last_true_wrote(tmp_path) -> None:
    copy, _ = _fit(tmp_path / "true", True)
    linked, _ = _fit(tmp_path / "link", "link")
    assert not (tmp_path / "true" / "last.ckpt").is_symlink()
    assert (tmp_path / "link" / "last.ckpt").is_symlink()
    assert os.readlink(tmp_path / "link" / "last.ckpt") == "best.ckpt"
    # the validation at step 4 improved (2.0), the one at step 6 did not: both last.ckpt hold
    # step 4's state, as best.ckpt does
    assert copy["global_step"] == linked["global_step"] == 4
    for key, value in copy["state_dict"].items():
        assert torch.equal(linked["state_dict"][key], value)
    assert sorted(p.name for p in (tmp_path / "link").iterdir()) == ["best.ckpt", "last.ckpt"]


def test_the_link_replaces_a_file_or_link_at_once_and_leaves_nothing_else(tmp_path) -> None:
    trainer = SimpleNamespace(is_global_zero=True, strategy=SimpleNamespace(barrier=lambda: None))
    (tmp_path / "best.ckpt").write_bytes(b"best")
    (tmp_path / "step4.ckpt").write_bytes(b"step4")
    last = tmp_path / "last.ckpt"
    last.write_bytes(b"an older whole last.ckpt")
    ModelCheckpoint._link_checkpoint(trainer, str(tmp_path / "best.ckpt"), str(last))
    assert last.is_symlink() and last.read_bytes() == b"best"
    ModelCheckpoint._link_checkpoint(trainer, str(tmp_path / "step4.ckpt"), str(last))
    assert os.readlink(last) == "step4.ckpt"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.ckpt", "last.ckpt", "step4.ckpt"]
    (tmp_path / "folder.ckpt").mkdir()  # not ours to delete
    with pytest.raises(IsADirectoryError, match="move it away"):
        ModelCheckpoint._link_checkpoint(trainer, str(tmp_path / "best.ckpt"),
                                         str(tmp_path / "folder.ckpt"))


def test_the_default_callbacks_link_last_ckpt(tmp_path) -> None:
    from hydra_configs import compose_train

    checkpoint = compose_train(tmp_path).callbacks.checkpoint
    assert checkpoint._target_ == "repgeom.checkpoint_link.ModelCheckpoint"
    assert checkpoint.save_last == "link"
