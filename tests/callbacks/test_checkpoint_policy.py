"""repgeom.callbacks.checkpoint_policy: every checkpoint written whole or not at all
(`AtomicCheckpointIO`), and last.ckpt as the newest state (`LastCheckpoint`; Lightning 2.6
kept the best one there), a link to best.ckpt when the validation wrote it (issue 41: no second
write), a whole file otherwise; what a kill leaves removed at the next start (issue 47)."""

import logging
import os
import time
import uuid

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from repgeom.callbacks.checkpoint_policy import (
    LEFTOVER_AGE_S,
    AtomicCheckpointIO,
    LastCheckpoint,
    StartFence,
    SupersededStartError,
    link_or_copy,
    remove_leftovers,
)


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
    best.ckpt's global_step. The checkpoint callbacks run after the other callbacks at a
    validation, so the step after it is the first to see what they wrote."""

    def __init__(self, folder) -> None:
        self.folder, self.seen = folder, {}

    def on_train_batch_start(self, trainer, *args) -> None:
        last, best = self.folder / "last.ckpt", self.folder / "best.ckpt"
        if last.exists():
            link = os.readlink(last) if last.is_symlink() else None
            self.seen[trainer.global_step] = (link, _step(last),
                                              _step(best) if best.exists() else None)


def _step(path) -> int:
    return torch.load(path, weights_only=False)["global_step"]


def _callbacks(folder, link=True, **best_options):
    """conf/callbacks/default.yaml's two checkpoint callbacks."""
    options = dict(filename="best", monitor="val/bpc", mode="min", save_top_k=1,
                   enable_version_counter=False) | best_options
    return [ModelCheckpoint(dirpath=folder, **options), LastCheckpoint(folder, link=link)]


def _fit(folder, scores, max_steps, link=True, ckpt_path=None, callbacks=None,
         **trainer_options):
    recorder = _LastRecorder(folder)
    trainer = L.Trainer(max_steps=max_steps, val_check_interval=2, limit_val_batches=1,
                        num_sanity_val_steps=0,
                        callbacks=[*(callbacks or _callbacks(folder, link)), recorder],
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu", plugins=[AtomicCheckpointIO()],
                        **({"default_root_dir": folder} | trainer_options))
    L.seed_everything(0, verbose=False)
    model = _Scored(scores)
    trainer.fit(model, ckpt_path=ckpt_path)
    return trainer, model, recorder.seen


def _holds(path, model) -> bool:
    saved = torch.load(path, weights_only=False)["state_dict"]
    return all(torch.equal(saved[k], v) for k, v in model.state_dict().items())


def _names(folder) -> list[str]:
    """The files in `folder` but the newest start's token (`StartFence`)."""
    return sorted(p.name for p in folder.iterdir() if p.name != StartFence.NAME)


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
    assert _names(tmp_path) == ["best.ckpt", "last.ckpt"]


@pytest.mark.parametrize("link", [True, False])
def test_a_run_ending_without_improvement_keeps_its_final_state_in_last(tmp_path, link) -> None:
    # Lightning 2.6's save_last alone leaves last.ckpt at step 4 here, the best
    trainer, model, seen = _fit(tmp_path, (3.0, 2.0, 2.5), max_steps=6, link=link)
    last = tmp_path / "last.ckpt"
    assert not last.is_symlink() and _step(last) == 6 and _holds(last, model)
    assert _step(tmp_path / "best.ckpt") == 4
    if not link:
        assert seen[3] == (None, 2, 2)  # a whole file at every validation


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
    leftover = tmp_path / f".last.ckpt.{uuid.uuid4().hex[:8]}.tmp"
    leftover.write_bytes(b"left by a kill")
    old = time.time() - LEFTOVER_AGE_S - 60  # the kill was minutes ago
    os.utime(leftover, (old, old))
    trainer, model, _ = _fit(tmp_path, (3.0, 2.0), max_steps=5)  # validations at 2 and 4
    last = tmp_path / "last.ckpt"
    assert _step(last) == 5 and _holds(last, model)
    assert _names(tmp_path) == ["best.ckpt", "last.ckpt"]
    # the same command again: the run is done, nothing is trained or written
    written = {p.name: p.lstat().st_mtime_ns for p in tmp_path.iterdir()}
    trainer, _, seen = _fit(tmp_path, (3.0,), max_steps=5, ckpt_path=str(last))
    assert trainer.global_step == 5 and not seen
    assert {p.name: p.lstat().st_mtime_ns for p in tmp_path.iterdir()} == written


def test_the_link_replaces_a_file_or_link_at_once_and_leaves_nothing_else(tmp_path) -> None:
    (tmp_path / "best.ckpt").write_bytes(b"best")
    (tmp_path / "step4.ckpt").write_bytes(b"step4")
    last = tmp_path / "last.ckpt"
    last.write_bytes(b"an older whole last.ckpt")
    link_or_copy(str(tmp_path / "best.ckpt"), str(last))
    assert last.is_symlink() and last.read_bytes() == b"best"
    link_or_copy(str(tmp_path / "step4.ckpt"), str(last))
    assert os.readlink(last) == "step4.ckpt"
    assert _names(tmp_path) == ["best.ckpt", "last.ckpt", "step4.ckpt"]
    (tmp_path / "folder.ckpt").mkdir()  # not ours to delete
    with pytest.raises(IsADirectoryError, match="move it away"):
        link_or_copy(str(tmp_path / "best.ckpt"), str(tmp_path / "folder.ckpt"))


def test_the_default_callbacks_write_best_in_place_and_link_last(tmp_path) -> None:
    from hydra_configs import compose_train

    callbacks = compose_train(tmp_path).callbacks
    assert callbacks.checkpoint._target_ == "lightning.pytorch.callbacks.ModelCheckpoint"
    assert callbacks.checkpoint.enable_version_counter is False
    policy = "repgeom.callbacks.checkpoint_policy"
    assert callbacks.last_checkpoint._target_ == f"{policy}.LastCheckpoint"
    assert callbacks.last_checkpoint.link is True


def test_last_stays_last_ckpt_when_the_run_folder_was_moved(tmp_path) -> None:
    # The checkpoints' dirpath is the old folder: Lightning keeps none of its paths, and its
    # version counter wrote last-v1.ckpt beside the existing last.ckpt, which a resume reads.
    import shutil

    _fit(tmp_path / "before", (3.0, 2.0, 2.5), max_steps=6)
    moved = tmp_path / "after"
    shutil.move(tmp_path / "before", moved)
    with pytest.warns(UserWarning, match="dirpath has changed"):
        _, model, _ = _fit(moved, (2.7, 2.8), max_steps=10, ckpt_path=str(moved / "last.ckpt"))
    assert _step(moved / "last.ckpt") == 10 and _holds(moved / "last.ckpt", model)
    assert _names(moved) == ["best.ckpt", "last.ckpt"]


def test_only_what_a_kill_of_ours_left_is_removed_at_the_next_start(tmp_path) -> None:
    # repgeom.files.atomic_write's temporary files of *.ckpt (a link where link_or_copy was
    # killed, dangling or not), and repgeom's before issue 47; unchanged for LEFTOVER_AGE_S.
    # Review of issue 47: model.ckpt.partial, my.ckpt.0.link, .notes.ckpt.x.tmp were deleted,
    # and a dangling temporary link was kept.
    ours = [".last.ckpt.0123abcd.tmp", ".hpc_ckpt_3.ckpt.deadbeef.tmp", "last.ckpt.partial",
            "best.ckpt.partial"]
    users = ["notes.txt", "last.ckpt.bak", ".notes.txt.0123abcd.tmp", "hpc_ckpt_1.ckpt.partial.d",
             ".last.ckpt.tmp", "last.ckpt.tmp", "model.ckpt.partial", "my.ckpt.0.link",
             "pretrained.ckpt.7.link", ".notes.ckpt.x.tmp", ".best.ckpt.userbackup.tmp",
             "last.ckpt.7.link"]  # a file, not our link
    for name in ours + users:
        (tmp_path / name).write_bytes(b"x")
    os.symlink("best.ckpt", tmp_path / "last.ckpt.4242.link")  # repgeom before issue 47
    os.symlink("gone.ckpt", tmp_path / ".last.ckpt.0badf00d.tmp")  # a killed link_or_copy
    (tmp_path / ".step5.ckpt.0123abcd.tmp").mkdir()  # a folder is never ours
    old = time.time() - LEFTOVER_AGE_S - 60
    for path in tmp_path.iterdir():
        os.utime(path, (old, old), follow_symlinks=False)
    (tmp_path / ".best.ckpt.feedbeef.tmp").write_bytes(b"x")  # a live writer's, fresh
    _fit(tmp_path, (3.0, 2.0), max_steps=4)  # every validation improves: links only
    assert _names(tmp_path) == sorted(["best.ckpt", "last.ckpt", ".step5.ckpt.0123abcd.tmp",
                                       ".best.ckpt.feedbeef.tmp", *users])
    assert remove_leftovers(tmp_path) == []
    assert remove_leftovers(tmp_path, min_age_s=0) == [str(tmp_path / ".best.ckpt.feedbeef.tmp")]


def test_last_is_a_whole_copy_where_the_filesystem_has_no_links(tmp_path, monkeypatch) -> None:
    def refused(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "symlink", refused)
    _, model, _ = _fit(tmp_path, (3.0, 2.0), max_steps=4)
    last = tmp_path / "last.ckpt"
    assert not last.is_symlink() and _step(last) == 4 and _holds(last, model)
    assert _names(tmp_path) == ["best.ckpt", "last.ckpt"]


def test_last_never_links_to_a_file_top_k_may_delete(tmp_path) -> None:
    # save_top_k=2 drops step=4.ckpt (1.1) at step 6 (0.5): a last.ckpt linked to it dangled
    # between Lightning's removal and the next link, and no resume found it.
    callbacks = _callbacks(tmp_path, filename="{step}", save_top_k=2)
    trainer, model, seen = _fit(tmp_path, (1.0, 1.1, 0.5), max_steps=6, callbacks=callbacks)
    assert all(link is None for link, _, _ in seen.values())
    last = tmp_path / "last.ckpt"
    assert not last.is_symlink() and _step(last) == 6 and _holds(last, model)
    assert _names(tmp_path) == ["last.ckpt", "step=2.ckpt", "step=6.ckpt"]


def test_a_superseded_start_writes_no_more_checkpoints(tmp_path) -> None:
    # issue 47, item 2: start A lives on (a hung node) while SLURM's requeue starts B, which
    # claims the run at its start of training; A's next save (best.ckpt at step 4) is refused
    # and A stops, leaving B's files as they were.
    class _NewerStartBegins(L.Callback):
        def on_train_batch_end(self, trainer, *args) -> None:
            if trainer.global_step == 3:
                StartFence(tmp_path).claim()  # what B's LastCheckpoint does

    written = {}

    class _Snapshot(L.Callback):
        def on_train_batch_start(self, trainer, *args) -> None:
            if trainer.global_step == 3:
                written.update({p.name: p.read_bytes() for p in tmp_path.glob("*.ckpt")})

    with pytest.raises(SupersededStartError, match="a newer training start"):
        _fit(tmp_path, (3.0, 2.0), max_steps=8,
             callbacks=[*_callbacks(tmp_path), _NewerStartBegins(), _Snapshot()])
    assert sorted(written) == ["best.ckpt", "last.ckpt"]
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.ckpt")} == written
    assert _names(tmp_path) == ["best.ckpt", "last.ckpt"]  # the refused write left nothing


def test_a_resume_skips_a_cut_short_checkpoint_for_the_next_newest(tmp_path, caplog) -> None:
    # issue 47, hole 3: Lightning's hpc_ckpt copied across filesystems and killed mid-copy was
    # newer than a whole last.ckpt, and the resume chose it and failed to load it.
    from repgeom.train import resume_checkpoint

    _fit(tmp_path / "checkpoints", (3.0,), max_steps=2, link=False)
    whole = (tmp_path / "checkpoints" / "last.ckpt").read_bytes()
    hpc = tmp_path / "hpc_ckpt_1.ckpt"
    hpc.write_bytes(whole[: len(whole) // 5])
    os.utime(hpc, ns=(os.stat(hpc).st_atime_ns, os.stat(tmp_path / "checkpoints" / "last.ckpt")
                      .st_mtime_ns + 10**9))
    with caplog.at_level(logging.WARNING, logger="repgeom.train"):
        assert resume_checkpoint(tmp_path) == tmp_path / "checkpoints" / "last.ckpt"
    assert "hpc_ckpt_1.ckpt" in caplog.text and "not a whole torch.save file" in caplog.text
    hpc.write_bytes(whole)  # whole again: the newest is chosen
    assert resume_checkpoint(tmp_path) == hpc


def test_a_resume_whose_every_checkpoint_is_damaged_refuses_to_start_again(tmp_path) -> None:
    # review of issue 47: with last.ckpt cut short (or a link to a file that is gone) and no
    # other candidate, the start began again from step 0 in the same folder, overwriting
    # best.ckpt and the step files.
    from repgeom.train import ResumeRefusedError, resume_checkpoint

    folder = tmp_path / "checkpoints"
    _fit(folder, (3.0,), max_steps=2, link=False)
    last = folder / "last.ckpt"
    last.write_bytes(last.read_bytes()[:100])
    with pytest.raises(ResumeRefusedError, match=r"last\.ckpt: not a whole torch.save.*ckpt_path"):
        resume_checkpoint(tmp_path)
    last.unlink()
    os.symlink("gone.ckpt", last)  # dangling
    with pytest.raises(ResumeRefusedError, match=r"last\.ckpt: .*FileNotFoundError"):
        resume_checkpoint(tmp_path)
    last.unlink()
    assert resume_checkpoint(tmp_path) is None  # nothing to resume: a new run


class _SlurmSignal(L.Callback):
    """What Lightning's SLURM signal handler does, here at step 7: the trainer saves
    ``<run>/hpc_ckpt_<n+1>.ckpt`` through its strategy and checkpoint plugin."""

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == 7:
            run = trainer.default_root_dir
            n = len([name for name in os.listdir(run) if name.startswith("hpc_ckpt_")])
            trainer.save_checkpoint(os.path.join(run, f"hpc_ckpt_{n + 1}.ckpt"))


def _train_killed_mid_write(prefix: str, run: str) -> None:
    """`repgeom.train.train` on `_KILLED_RUN`, SIGKILLed (no handler runs) half-way through the
    first write of a file whose name (or its hidden temporary's) starts with `prefix`: torch.save
    into it, or a copy into it (a move across filesystems); "link": as last.ckpt is first linked
    to best.ckpt."""
    import io
    import shutil
    import signal

    from hydra_configs import compose_train

    import repgeom.train

    save, copyfile = torch.save, shutil.copyfile

    def cut(data: bytes, path) -> None:
        with open(path, "wb") as file:
            file.write(data[: len(data) // 3])
        os.kill(os.getpid(), signal.SIGKILL)

    def dying_save(obj, f, *args, **kwargs):
        if isinstance(f, str | os.PathLike) and os.path.basename(f).lstrip(".").startswith(prefix):
            buffer = io.BytesIO()
            save(obj, buffer, *args, **kwargs)
            cut(buffer.getvalue(), f)
        return save(obj, f, *args, **kwargs)

    def dying_copyfile(src, dst, *args, **kwargs):
        if os.path.basename(dst).lstrip(".").startswith(prefix):
            with open(src, "rb") as source:
                cut(source.read(), dst)
        return copyfile(src, dst, *args, **kwargs)

    torch.save, shutil.copyfile = dying_save, dying_copyfile
    if prefix == "link":
        os.symlink = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
    build = repgeom.train.build_callbacks
    repgeom.train.build_callbacks = lambda cfg: [*build(cfg), _SlurmSignal()]
    repgeom.train.train(compose_train(run, _KILLED_RUN))


_KILLED_RUN = ["logger=csv", "probe=none", "callbacks=trajectory", "trainer.max_steps=25",
               "callbacks.checkpoint_every.every_n_train_steps=5"]  # validations at 10 and 20


@pytest.mark.slow  # trains the tiny model twice, once in a subprocess
@pytest.mark.parametrize("killed", ["step5", "hpc_ckpt_1", "best", "link", "last"])
def test_a_kill_mid_write_of_any_save_leaves_nothing_after_the_next_start(
        tmp_path, monkeypatch, killed) -> None:
    # issue 47, holes 3 and 4, with TMPDIR on another filesystem (a tmpfs under a disk run
    # folder, as node-local /tmp under a network one): Lightning's save went through TMPDIR
    # and a move, which was a copy into the final name; a kill mid-copy left a cut hpc_ckpt or
    # step*.ckpt that a resume or probe chose, and a kill before the move a tmpXXXX in TMPDIR.
    # "link": a kill between best.ckpt and the first last.ckpt made the rerun write best-v1.ckpt.
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from hydra_configs import compose_train

    import repgeom.train
    from repgeom.models.checkpoints import checkpoint_problem

    shm = "/dev/shm"
    if not os.path.isdir(shm) or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the test's folder")
    tmpdir = os.path.join(shm, f"repgeom-test-{uuid.uuid4().hex}")
    os.mkdir(tmpdir)
    run = tmp_path / "run"
    tests = str(Path(__file__).parent)
    code = (f"import sys; sys.path[:0] = [{tests!r}]\n"
            "from test_checkpoint_policy import _train_killed_mid_write\n"
            f"_train_killed_mid_write({killed!r}, {str(run)!r})")
    env = {**os.environ, "TMPDIR": tmpdir, "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        killed_run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                    text=True, timeout=600)
        assert killed_run.returncode == -9, killed_run.stderr[-3000:]  # SIGKILL
        old = time.time() - LEFTOVER_AGE_S - 60  # the requeued start comes minutes later
        for path in [*run.glob(".*.tmp"), *run.glob("checkpoints/.*.tmp")]:
            os.utime(path, (old, old), follow_symlinks=False)
        monkeypatch.setattr(tempfile, "tempdir", tmpdir)
        build = repgeom.train.build_callbacks
        monkeypatch.setattr(repgeom.train, "build_callbacks",
                            lambda cfg: [*build(cfg), _SlurmSignal()])
        result = repgeom.train.train(compose_train(run, _KILLED_RUN))  # the same command again
        assert result.trainer.global_step == 25
        assert os.listdir(tmpdir) == []
    finally:
        for name in os.listdir(tmpdir):
            os.remove(os.path.join(tmpdir, name))
        os.rmdir(tmpdir)
    checkpoints = run / "checkpoints"
    assert _names(checkpoints) == ["best.ckpt", "last.ckpt", *(f"step{s}.ckpt" for s in
                                                              (10, 15, 20, 25, 5))]
    assert [p.name for p in run.glob("hpc_ckpt_*")] == ["hpc_ckpt_1.ckpt"]
    for path in [*checkpoints.glob("*.ckpt"), run / "hpc_ckpt_1.ckpt"]:
        assert checkpoint_problem(path) is None, path
    assert _step(checkpoints / "last.ckpt") == 25


def test_last_links_in_a_run_folder_reached_through_a_link(tmp_path) -> None:
    # review of issue 47: LastCheckpoint held abspath, ModelCheckpoint realpath, so in a run
    # folder under a link (/scratch -> /gpfs/scratch) last.ckpt was never a link but a second
    # whole write at every validation
    (tmp_path / "real").mkdir()
    os.symlink("real", tmp_path / "link")
    folder = tmp_path / "link" / "ck"
    _, model, seen = _fit(folder, (3.0, 2.0), max_steps=4)
    assert seen[3][0] == "best.ckpt"
    assert os.readlink(folder / "last.ckpt") == "best.ckpt" and _holds(folder / "last.ckpt", model)


def test_last_takes_a_home_folder_and_refuses_a_remote_one(monkeypatch, tmp_path) -> None:
    # review of issue 47: "~/runs" and "s3://bucket/run" became folders under the working one
    monkeypatch.setenv("HOME", str(tmp_path))
    assert LastCheckpoint("~/runs/ck").path == str(tmp_path.resolve() / "runs" / "ck" /
                                                   "last.ckpt")
    for remote in ("s3://bucket/run/checkpoints", "gs://bucket/ck"):
        with pytest.raises(ValueError, match="remote folder.*give a local dirpath"):
            LastCheckpoint(remote)
        with pytest.raises(ValueError, match="remote folder"):
            StartFence(remote)


def test_a_start_token_that_cannot_be_read_stops_the_write(tmp_path) -> None:
    # review of issue 47: a cut-short or unreadable token let a superseded start write on
    older, newer = StartFence(tmp_path), StartFence(tmp_path)
    older.claim()
    older.check()  # its own token
    token = tmp_path / StartFence.NAME
    for text in ('{"start": "', '{"start": null}', "[1, 2]"):
        token.write_text(text)
        with pytest.raises(SupersededStartError, match="cannot be read as one"):
            older.check()
    newer.claim()
    with pytest.raises(SupersededStartError, match="a newer training start"):
        older.check()
    token.unlink()
    older.check()  # no token: no start claimed, nothing newer


def test_a_start_claiming_late_over_a_newer_one_is_superseded(tmp_path, monkeypatch) -> None:
    # review of issue 47: a start hung before its start of training claimed the run after
    # the newer (requeued) start had, and fenced the newer one off
    hung, requeued = StartFence(tmp_path, started=100.0), StartFence(tmp_path, started=200.0)
    requeued.claim()
    with pytest.raises(SupersededStartError, match="a newer training start"):
        hung.claim()
    requeued.check()  # still its own
    # in one SLURM job, the restart count decides, whatever the nodes' clocks say
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    second = StartFence(tmp_path, started=250.0)
    second.claim()
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    with pytest.raises(SupersededStartError):
        StartFence(tmp_path, started=300.0).claim()
    second.check()


def test_every_rank_stops_on_rank_zeros_fence_before_the_validations_saves(tmp_path) -> None:
    # review of issue 47: rank 0 alone raised when superseded, leaving the other DDP ranks at a
    # barrier. The decision is rank 0's, broadcast: here this process plays a rank whose own
    # fence is fine, and rank 0's broadcast (from step 3 on) says superseded.
    said = "a newer training start of this run has begun (rank 0 says)"

    class _RankZeroSaysSuperseded(L.Callback):
        def on_train_batch_end(self, trainer, *args) -> None:
            if trainer.global_step == 3:
                trainer.strategy.broadcast = lambda obj, src=0: said if obj is None else obj

    with pytest.raises(SupersededStartError, match=r"rank 0 says"):
        _fit(tmp_path, (3.0, 2.0), max_steps=8,
             callbacks=[*_callbacks(tmp_path), _RankZeroSaysSuperseded()])
    assert _step(tmp_path / "best.ckpt") == 2 and _step(tmp_path / "last.ckpt") == 2
