"""conf/callbacks/default.yaml's checkpoint (repgeom.checkpoint_link): last.ckpt is the newest
state (Lightning 2.6 kept the best one there), a link to best.ckpt when the validation wrote it
(issue 41: no second write) and a whole file otherwise, each replaced atomically."""

import os
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from repgeom.checkpoint_link import PARTIAL_SUFFIX, ModelCheckpoint


class _Scored(BoringModel):
    """A model whose val/bpc at its n-th validation is `scores[n]` (the last one repeated)."""

    def __init__(self, scores: tuple[float, ...]) -> None:
        super().__init__()
        self.scores, self.validations = scores, 0

    def on_validation_epoch_end(self) -> None:
        self.log("val/bpc", self.scores[min(self.validations, len(self.scores) - 1)])
        self.validations += 1


class _LastRecorder(L.Callback):
    """What last.ckpt is at the start of each step: (link target or None, its global_step), and
    best.ckpt's global_step. ModelCheckpoint runs after the other callbacks at a validation, so
    the step after it is the first to see what it wrote."""

    def __init__(self, folder) -> None:
        self.folder, self.seen = folder, {}

    def on_train_batch_start(self, trainer, *args) -> None:
        last, best = self.folder / "last.ckpt", self.folder / "best.ckpt"
        if last.exists():
            link = os.readlink(last) if last.is_symlink() else None
            self.seen[trainer.global_step] = (link, _step(last), _step(best))


def _step(path) -> int:
    return torch.load(path, weights_only=False)["global_step"]


def _fit(folder, scores, max_steps, save_last="link", ckpt_path=None, **trainer_options):
    callback = ModelCheckpoint(dirpath=folder, filename="best", monitor="val/bpc", mode="min",
                               save_top_k=1, save_last=save_last)
    recorder = _LastRecorder(folder)
    trainer = L.Trainer(max_steps=max_steps, val_check_interval=2, limit_val_batches=1,
                        num_sanity_val_steps=0, callbacks=[callback, recorder], logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu", **trainer_options)
    L.seed_everything(0, verbose=False)
    model = _Scored(scores)
    trainer.fit(model, ckpt_path=ckpt_path)
    return trainer, model, recorder.seen


def _holds(path, model) -> bool:
    saved = torch.load(path, weights_only=False)["state_dict"]
    return all(torch.equal(saved[k], v) for k, v in model.state_dict().items())


def test_last_is_the_newest_validation_a_link_only_to_a_best_written_then(tmp_path) -> None:
    # validations at steps 2, 4, 6, 8: val/bpc 3.0 and 2.0 improve, 2.5 does not, 1.0 does
    trainer, model, seen = _fit(tmp_path, (3.0, 2.0, 2.5, 1.0), max_steps=8)
    assert seen[3] == ("best.ckpt", 2, 2)
    assert seen[5] == ("best.ckpt", 4, 4)
    # step 6 did not improve: last.ckpt is step 6's state as a whole file, written beside the
    # link, not through it (best.ckpt still holds step 4)
    assert seen[7] == (None, 6, 4)
    last = tmp_path / "last.ckpt"
    assert last.is_symlink() and os.readlink(last) == "best.ckpt" and _step(last) == 8
    assert _holds(last, model)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.ckpt", "last.ckpt"]


@pytest.mark.parametrize("save_last", ["link", True])
def test_a_run_ending_without_improvement_keeps_its_final_state_in_last(tmp_path,
                                                                        save_last) -> None:
    # Lightning 2.6 alone leaves last.ckpt at step 4 here, the best
    trainer, model, _ = _fit(tmp_path, (3.0, 2.0, 2.5), max_steps=6, save_last=save_last)
    last = tmp_path / "last.ckpt"
    assert not last.is_symlink() and _step(last) == 6 and _holds(last, model)
    assert _step(tmp_path / "best.ckpt") == 4


def test_a_resumed_run_moves_last_on_at_its_first_validation(tmp_path) -> None:
    _fit(tmp_path, (3.0, 2.0), max_steps=4)
    assert _step(tmp_path / "last.ckpt") == 4
    # the new process has saved nothing when its first validation (step 6) fails to improve
    _, model, seen = _fit(tmp_path, (2.5,), max_steps=8, ckpt_path=str(tmp_path / "last.ckpt"))
    assert seen[5] == ("best.ckpt", 4, 4)
    assert seen[7] == (None, 6, 4)
    assert _step(tmp_path / "last.ckpt") == 8 and _holds(tmp_path / "last.ckpt", model)


def test_training_that_stops_between_validations_ends_with_last_at_its_final_step(
        tmp_path) -> None:
    (tmp_path / f"last.ckpt{PARTIAL_SUFFIX}").write_bytes(b"left by a kill mid-write")
    trainer, model, _ = _fit(tmp_path, (3.0, 2.0), max_steps=5)  # validations at 2 and 4
    last = tmp_path / "last.ckpt"
    assert _step(last) == 5 and _holds(last, model)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.ckpt", "last.ckpt"]
    # the same command again: the run is done, nothing is trained or written
    written = last.stat().st_mtime_ns
    trainer, _, seen = _fit(tmp_path, (3.0,), max_steps=5, ckpt_path=str(last))
    assert trainer.global_step == 5 and not seen and last.stat().st_mtime_ns == written


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


class _Killed(BaseException):
    """A kill, at the point a test chooses."""


def test_a_kill_while_best_is_written_leaves_last_whole_when_tmp_is_another_disk(
        tmp_path, monkeypatch) -> None:
    # Lightning saves through fsspec, which writes a temporary file under tempfile.gettempdir()
    # and shutil.move's it into place: where /tmp is another filesystem (a tmpfs, a node's local
    # disk under a network checkpoint folder) the move is a copy into best.ckpt itself. Here
    # every such rename fails as across filesystems, and the second copy dies half-way.
    import errno
    import shutil
    import tempfile

    rename, copyfile, copies = os.rename, shutil.copyfile, []

    def rename_across(src, dst, *args, **kwargs):
        if os.path.dirname(os.path.abspath(src)) == os.path.abspath(tempfile.gettempdir()):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return rename(src, dst, *args, **kwargs)

    def dying_copyfile(src, dst, *args, **kwargs):
        copies.append(os.path.basename(dst))
        if len(copies) == 2:  # the second best.ckpt, while last.ckpt links to the first
            with open(src, "rb") as source, open(dst, "wb") as target:
                target.write(source.read()[:100])
            raise _Killed
        return copyfile(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", rename_across)
    monkeypatch.setattr(shutil, "copyfile", dying_copyfile)
    with pytest.raises(_Killed):
        _fit(tmp_path, (3.0, 2.0), max_steps=4)
    last = tmp_path / "last.ckpt"
    assert os.readlink(last) == "best.ckpt" and _step(last) == 2  # the previous one, whole


def test_last_stays_last_ckpt_when_the_run_folder_was_moved(tmp_path) -> None:
    # The checkpoint's dirpath is the old folder: Lightning keeps none of its paths, and its
    # version counter wrote last-v1.ckpt beside the existing last.ckpt, which a resume reads.
    import shutil

    _fit(tmp_path / "before", (3.0, 2.0, 2.5), max_steps=6)
    moved = tmp_path / "after"
    shutil.move(tmp_path / "before", moved)
    _, model, _ = _fit(moved, (2.7, 2.8), max_steps=10, ckpt_path=str(moved / "last.ckpt"))
    assert _step(moved / "last.ckpt") == 10 and _holds(moved / "last.ckpt", model)
    assert not (moved / "last-v1.ckpt").exists()


def test_what_a_kill_left_is_removed_when_the_next_run_only_links(tmp_path) -> None:
    (tmp_path / f"last.ckpt{PARTIAL_SUFFIX}").write_bytes(b"left by a kill mid-write")
    (tmp_path / f"best.ckpt{PARTIAL_SUFFIX}").write_bytes(b"left by a kill mid-write")
    os.symlink("best.ckpt", tmp_path / "last.ckpt.4242.link")  # another process's
    _fit(tmp_path, (3.0, 2.0), max_steps=4)  # every validation improves: links only
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.ckpt", "last.ckpt"]


def test_last_is_a_whole_copy_where_the_filesystem_has_no_links(tmp_path, monkeypatch) -> None:
    def refused(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "symlink", refused)
    _, model, _ = _fit(tmp_path, (3.0, 2.0), max_steps=4)
    last = tmp_path / "last.ckpt"
    assert not last.is_symlink() and _step(last) == 4 and _holds(last, model)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.ckpt", "last.ckpt"]


def test_last_never_dangles_when_top_k_drops_the_file_it_links_to(tmp_path) -> None:
    # save_top_k=2: the validation at step 6 (0.5) drops step=4.ckpt (1.1), which last.ckpt
    # linked to since step 4. Lightning removes it before it links last.ckpt to step=6.ckpt: a
    # kill between the two left last.ckpt dangling, no resume found it, the run started over.
    seen = []

    class _Watched(ModelCheckpoint):
        def _remove_checkpoint(self, trainer, filepath) -> None:
            super()._remove_checkpoint(trainer, filepath)
            seen.append((os.path.basename(filepath), _step(tmp_path / "last.ckpt")))

    callback = _Watched(dirpath=tmp_path, filename="{step}", monitor="val/bpc", mode="min",
                        save_top_k=2, save_last="link")
    trainer = L.Trainer(max_steps=6, val_check_interval=2, limit_val_batches=1,
                        num_sanity_val_steps=0, callbacks=[callback], logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu")
    trainer.fit(_Scored((1.0, 1.1, 0.5)))
    assert seen == [("step=4.ckpt", 6)]
    assert os.readlink(tmp_path / "last.ckpt") == "step=6.ckpt"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "step=2.ckpt",
                                                          "step=6.ckpt"]
    assert os.path.basename(callback.best_model_path) == "step=6.ckpt"
