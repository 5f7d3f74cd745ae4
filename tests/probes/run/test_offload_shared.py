"""A run folder under many hands (issue 38): a snapshot that cannot be read is skipped once and
named, never retried for ever; a worker reads the run's state only once it holds the run; one lock
whatever each node sees, with fenced writes; "same host" by boot id and pid namespace; a replayed
step's new snapshot replaces an unprobed one from the abandoned start."""

from __future__ import annotations

import errno
import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
from hydra_configs import compose_train

from repgeom import files
from repgeom.probes.core import table
from repgeom.probes.run.offload import snapshots
from repgeom.probes.run.offload.follow import Follower, TrainingDiedError, follow
from repgeom.probes.run.offload.lease import Life, LockLostError, WorkerLock, training_alive
from repgeom.train import train

PROBE = ["probe.every_n_steps=10", "probe.log_spaced_until=4", "probe.n_log_spaced=3"]
STEPS = [0, 1, 2, 4, 10, 20]  # the schedule of PROBE over 20 steps (test_callback)
PASSES = 200
"""More passes over the snapshot folder than a worker needs for 6 snapshots: it spins."""


@pytest.fixture(scope="module")
def snapshot_run(tmp_path_factory) -> Path:
    """A 20-step run with ``probe.offload=snapshots`` and no worker: its 6 snapshots stay."""
    run_dir = tmp_path_factory.mktemp("shared") / "run"
    train(compose_train(run_dir, ["logger=csv", *PROBE, "probe.offload=snapshots"]))
    return run_dir


def _copy(run_dir: Path, to: Path) -> Path:
    shutil.copytree(run_dir, to)
    return to


@pytest.fixture
def bounded_passes(monkeypatch):
    """Fail a worker that looks at its folder more than `PASSES` times (a busy loop)."""
    original, passes = snapshots.snapshots, []

    def counted(folder):
        passes.append(1)
        if len(passes) > PASSES:
            raise AssertionError(f"the worker spins: {len(passes)} passes over {folder}")
        return original(folder)

    monkeypatch.setattr(snapshots, "snapshots", counted)
    return passes


def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _skipped_steps(run_dir: Path) -> dict:
    return json.loads((table.probe_dir(run_dir) / "skipped.json").read_text())


# -- hole 2: quarantine ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("part", [snapshots.COMPLETE, snapshots.WEIGHTS])
def test_a_snapshot_that_cannot_be_read_is_skipped_named_and_tried_again_once_rewritten(
        snapshot_run, tmp_path, bounded_passes, capsys, part) -> None:
    # complete.json cut short made the worker say "changed or vanished" and look again at full
    # speed for ever; weights.ckpt cut to half crashed every start with CheckpointFormatError.
    run_dir = _copy(snapshot_run, tmp_path / "run")
    folder = snapshots.snapshot_dir(run_dir)
    broken = snapshots.step_dir(folder, 10) / part
    _cut(broken)
    result = follow(run_dir, timeout_s=30, wandb=False)
    assert result.stopped == "done"
    assert sorted(table.read_table(run_dir)["step"].unique()) == [s for s in STEPS if s != 10]
    assert result.quarantined == {10: result.quarantined[10]} and str(broken) in \
        result.quarantined[10]
    warnings = [line for line in capsys.readouterr().out.splitlines()
                if line.startswith("warning:") and str(broken) in line]
    assert len(warnings) == 1, warnings
    assert _skipped_steps(run_dir)["step 10"]["step"] == 10
    # A rerun does not try the same broken snapshot again; one the trainer writes again (a new
    # time) is tried, probed, and no longer named.
    assert follow(run_dir, timeout_s=30, wandb=False).probed == []
    good = snapshots.step_dir(snapshots.snapshot_dir(snapshot_run), 10)
    shutil.rmtree(broken.parent)
    shutil.copytree(good, broken.parent)
    marker = snapshots.read_json(broken.parent / snapshots.COMPLETE)
    snapshots.write_json(broken.parent / snapshots.COMPLETE, {**marker, "time": time.time()})
    again = follow(run_dir, timeout_s=30, wandb=False)
    assert again.probed == [10] and not again.quarantined
    assert sorted(table.read_table(run_dir)["step"].unique()) == STEPS
    assert "step 10" not in _skipped_steps(run_dir)


# -- hole 3: the state is read under the lock ------------------------------------------------------


@pytest.mark.slow
def test_a_worker_started_while_another_finishes_reads_the_state_once_it_holds_the_run(
        snapshot_run, tmp_path) -> None:
    # A second worker job started while the first finishes (slurm/probe_worker.sbatch invites
    # it): it read worker.json before it had the lock, so it probed every step again, redid the
    # end-of-run work and rolled worker.json back.
    run_dir = _copy(snapshot_run, tmp_path / "run")
    second = Follower(run_dir, device=torch.device("cpu"), timeout_s=30, keep_snapshots=True,
                      wandb=False)
    first = follow(run_dir, timeout_s=30, keep_snapshots=True, wandb=False)
    assert first.probed == STEPS
    state = (snapshots.snapshot_dir(run_dir) / snapshots.WORKER).read_text()
    result = second.run()
    assert result.probed == [] and result.stopped == "done"
    assert (snapshots.snapshot_dir(run_dir) / snapshots.WORKER).read_text() == state


# -- hole 4: one lock per run, fenced writes, replayed steps ---------------------------------------


@pytest.mark.parametrize(("first", "second"), [("flock", "file"), ("file", "flock")])
def test_workers_that_pick_different_lock_kinds_still_exclude_each_other(
        tmp_path, first, second) -> None:
    # follow_lock=auto picks per node: the file server sees ext4 (flock), its NFS clients see
    # nfs4 (the lease file). Both held the run at once.
    held = WorkerLock(tmp_path, kind=first)
    held.acquire(timeout_s=5, what="the run")
    try:
        with pytest.raises(RuntimeError, match="another probe worker"):
            WorkerLock(tmp_path, kind=second).acquire(timeout_s=1, what="the run")
    finally:
        held.release()


def test_a_holder_that_lost_the_run_while_paused_writes_nothing(tmp_path) -> None:
    # A lease holder paused (SIGSTOP, an NFS partition) after its check(), past the stale time:
    # another worker takes the run over and writes; the paused one wakes and writes worker.json
    # and the table over the new holder's. Its writes are fenced: the token is checked just
    # before each rename into place, and the new holder's files stay.
    run_dir = tmp_path / "run"
    folder = snapshots.snapshot_dir(run_dir)
    folder.mkdir(parents=True)
    follower = Follower(run_dir, device=torch.device("cpu"), timeout_s=5, keep_snapshots=False,
                        wandb=False, lock="file")
    follower.lock.acquire(timeout_s=5, what="the run")
    follower.lock.check()
    follower.done = {0: 1.0}
    follower.lock.lease.force_break()  # taken over, as a waiter does once the lease is stale
    other = WorkerLock(folder)
    other.acquire(timeout_s=5, what="the run")
    theirs = {"done": {"0": 1.0, "1": 2.0}, "seconds": 1.0}
    snapshots.write_json(folder / snapshots.WORKER, theirs)  # the new holder's progress
    table.append_rows(table.probe_dir(run_dir), [_row(0), _row(1)])  # and rows
    try:
        with pytest.raises(LockLostError):
            follower._save()
        with pytest.raises(LockLostError), follower.fenced():
            table.append_rows(table.probe_dir(run_dir), [_row(2)])
    finally:
        follower.lock.release()
    assert snapshots.read_json(folder / snapshots.WORKER) == theirs
    assert sorted(table.read_table(run_dir)["step"]) == [0, 1]
    assert other.lease.owner.token == other.token  # its release left the new holder's lease
    other.release()


def _row(step: int) -> dict:
    return {"step": step, "layer": 0, "head": -1, "metric": "m", "value": float(step),
            "std": 0.0}


def test_a_replayed_steps_snapshot_replaces_an_unprobed_one_of_the_abandoned_start(
        tmp_path) -> None:
    # A training start killed after writing step 10, resumed from a checkpoint before it: its
    # replay of step 10 is what the run's weights are now. The old snapshot was kept and, when
    # not yet probed, went into the table under step 10.
    model = torch.nn.Linear(2, 2)
    abandoned = snapshots.SnapshotWriter(tmp_path, heartbeat_s=60)
    abandoned.start({"wandb": None})
    abandoned.snapshot(10, model, {"hyper_parameters": {}})
    abandoned.close(final_step=None)
    folder = snapshots.snapshot_dir(tmp_path)
    old = snapshots.read_json(snapshots.step_dir(folder, 10) / snapshots.COMPLETE)
    with torch.no_grad():
        model.weight.add_(1.0)
    resumed = snapshots.SnapshotWriter(tmp_path, heartbeat_s=60)
    resumed.start({"wandb": None})
    resumed.snapshot(10, model, {"hyper_parameters": {}})
    resumed.wait()
    new = snapshots.read_json(snapshots.step_dir(folder, 10) / snapshots.COMPLETE)
    assert new["time"] > old["time"]
    written = torch.load(snapshots.step_dir(folder, 10) / snapshots.WEIGHTS, weights_only=True)
    torch.testing.assert_close(written["state_dict"]["model.weight"], model.weight.detach())
    # The same start never rewrites its own complete snapshot (the worker may read it).
    resumed.snapshot(10, torch.nn.Linear(2, 2), {"hyper_parameters": {}})
    resumed.close(final_step=10)
    assert snapshots.read_json(snapshots.step_dir(folder, 10) / snapshots.COMPLETE) == new
    assert [p.name for p in folder.iterdir() if p.name.startswith(".step")] == []



def test_an_older_start_still_alive_never_replaces_the_newer_starts_snapshot(tmp_path) -> None:
    # A requeue while the old start still runs on a hung node: the newer start writes step 10 of
    # its replay, then the older one writes its own step 10. The older one's weights are the
    # abandoned trajectory's; the worker must get the newer start's (review of issue 40).
    folder = snapshots.snapshot_dir(tmp_path)
    older = snapshots.SnapshotWriter(tmp_path, heartbeat_s=60)
    older.start({"wandb": None})
    newer = snapshots.SnapshotWriter(tmp_path, heartbeat_s=60)
    newer.start({"wandb": None})
    assert newer.number > older.number
    theirs, ours = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    try:
        newer.snapshot(10, ours, {"hyper_parameters": {}})
        newer.wait()
        older.snapshot(10, theirs, {"hyper_parameters": {}})
        older.wait()
    finally:
        older.close(final_step=None, stopped=True)
        newer.close(final_step=None, stopped=True)
    marker = files.read_json(snapshots.step_dir(folder, 10) / snapshots.COMPLETE)
    assert marker["start"] == newer.start_id and marker["number"] == newer.number
    written = torch.load(snapshots.step_dir(folder, 10) / snapshots.WEIGHTS, weights_only=True)
    torch.testing.assert_close(written["state_dict"]["model.weight"], ours.weight.detach())
    assert [p.name for p in folder.iterdir() if p.name.startswith(".step")] == []


def test_a_start_sweeps_the_writes_of_ended_starts_only(tmp_path, monkeypatch) -> None:
    # A new start removes a half-written snapshot of a start that has ended (killed mid-write),
    # never the write in progress of an older start still alive (review of issue 40: it did, and
    # that start's training then failed with FileNotFoundError). The older start, superseded,
    # then renames nothing (`starts`: its weights are the abandoned trajectory's).
    folder = snapshots.snapshot_dir(tmp_path)
    killed, alive = (snapshots.SnapshotWriter(tmp_path, heartbeat_s=60) for _ in range(2))
    killed.start({"wandb": None})
    alive.start({"wandb": None})
    cut = folder / f".step_{20:09d}.{killed.number}-0123456789abcdef{snapshots.WRITING}"
    cut.mkdir()
    killed.close(final_step=None)  # its lock let go, as the kernel does for a killed process
    writing, go_on = threading.Event(), threading.Event()
    real_save = torch.save

    def slow_save(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        writing.set()
        assert go_on.wait(60)

    monkeypatch.setattr(torch, "save", slow_save)
    alive.snapshot(10, torch.nn.Linear(3, 2), {"hyper_parameters": {}})
    assert writing.wait(60)
    new = snapshots.SnapshotWriter(tmp_path, heartbeat_s=60)
    new.start({"wandb": None})
    assert not cut.exists()
    assert [step for step, _ in snapshots.snapshots(folder)[1]] == [10]  # the live write
    go_on.set()
    try:
        alive.wait()  # no FileNotFoundError: its write was left alone
    finally:
        alive.close(final_step=None, stopped=True)
        new.close(final_step=None, stopped=True)
    assert snapshots.snapshots(folder) == ([], [])  # superseded: its write renamed nowhere


def test_a_worker_deleting_a_probed_snapshot_puts_back_a_newer_one_found_in_its_place(
        tmp_path) -> None:
    # The worker probed step 10 (time t1) and deletes it; meanwhile a resumed start replaced it
    # with its replay (t2). The delete must not take the unprobed replay with it.
    folder = snapshots.snapshot_dir(tmp_path)
    path = snapshots.step_dir(folder, 10)
    path.mkdir(parents=True)
    (folder / snapshots.MARKER).write_text("repgeom")
    snapshots.write_json(path / snapshots.COMPLETE, {"step": 10, "time": 2.0})
    snapshots.remove_snapshot(path, written=1.0)
    assert snapshots.read_json(path / snapshots.COMPLETE)["time"] == 2.0
    snapshots.remove_snapshot(path, written=2.0)
    assert not path.exists() and not snapshots.leftovers(folder)


def _marked_snapshot(tmp_path: Path, step: int = 10) -> tuple[Path, Path]:
    folder = snapshots.snapshot_dir(tmp_path)
    path = snapshots.step_dir(folder, step)
    path.mkdir(parents=True)
    (folder / snapshots.MARKER).write_text("repgeom")
    snapshots.write_json(path / snapshots.COMPLETE, {"step": step, "time": 1.0})
    return folder, path


def _lost() -> None:
    raise LockLostError("lost")


def test_every_deletion_is_fenced_even_of_a_leftover(tmp_path) -> None:
    # A leftover `.step_N.<x>.removed` was deleted without a fence check, and the pre-clean of
    # this pid's own `.removed` folder ran before the check: a worker that lost the run deleted.
    folder, path = _marked_snapshot(tmp_path)
    leftover = folder / ".step_000000011.1234.removed"
    mine = folder / f".step_000000010.{os.getpid()}.removed"
    for aside in (leftover, mine):
        aside.mkdir()
        (aside / snapshots.WEIGHTS).write_bytes(b"w")
    with files.fenced(_lost):
        with pytest.raises(LockLostError):
            snapshots.remove_snapshot(leftover)
        with pytest.raises(LockLostError):
            snapshots.remove_snapshot(path)
    assert leftover.is_dir() and mine.is_dir() and path.is_dir()


def test_deletions_call_the_fence_through_the_files_module(tmp_path, monkeypatch) -> None:
    # layout imported check_fence by name, so a patched files.check_fence never saw deletions.
    _, path = _marked_snapshot(tmp_path)
    seen = []
    monkeypatch.setattr(files, "check_fence", lambda: seen.append(1))
    snapshots.remove_snapshot(path)
    assert seen and not path.exists()


def test_a_deletion_whose_aside_name_is_taken_still_deletes(tmp_path, monkeypatch) -> None:
    # The aside folder was named by pid, which containers share: a rename onto another's
    # non-empty `.step_N.<pid>.removed` failed with ENOTEMPTY and crashed the trainer.
    folder, path = _marked_snapshot(tmp_path)
    rename, taken = os.rename, []

    def busy(source, target, *args, **kwargs):
        if str(target).endswith(".removed") and not taken:
            taken.append(target)
            raise OSError(errno.ENOTEMPTY, "Directory not empty", str(target))
        return rename(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "rename", busy)
    snapshots.remove_snapshot(path)
    assert taken and not path.exists() and not snapshots.leftovers(folder)
    assert str(os.getpid()) not in Path(taken[0]).name  # named by a random id, not the pid


def test_a_malformed_lease_is_an_unknown_holder_taken_over_once_it_stands_still(
        tmp_path) -> None:
    # A lease `[1]` crashed the waiter with AttributeError, a pid "abc" with ValueError; the
    # lease is filelock's now, and a record it cannot parse is judged by its age alone.
    (tmp_path / "worker.lease").write_text('{"pid": "abc", "token": "x"}')
    taker = WorkerLock(tmp_path)
    taker.acquire(timeout_s=30, what="the run")
    try:
        assert taker.lease.owner.token == taker.token
    finally:
        taker.release()


def test_malformed_state_files_read_as_empty_with_a_warning(tmp_path, capsys) -> None:
    # A done.json that is no object, or a worker.json whose `done` is a list, crashed the worker.
    run_dir = tmp_path / "run"
    folder = snapshots.snapshot_dir(run_dir)
    folder.mkdir(parents=True)
    (folder / snapshots.DONE).write_text("[1]")
    (folder / snapshots.WORKER).write_text(json.dumps({
        "done": [0, 1], "seconds": "abc", "quarantined": {"3": "broken"}, "finished": "x"}))
    snapshots.write_json(folder / snapshots.TRAINING, {"pid": "abc", "state": "running",
                                                       "time": "late", "step": 2})
    assert training_alive(folder, 60).life is Life.MALFORMED
    # A malformed done.json is not taken for the run's end, and a malformed heartbeat for no
    # live trainer: the worker stops after its timeout, without a crash.
    with pytest.raises(TrainingDiedError, match="malformed"):
        follow(run_dir, timeout_s=1, wandb=False)
    out = capsys.readouterr().out
    assert "done is not an object of steps" in out and "seconds is not a number" in out
    done = {"step": 5, "time": 1.0, "number": 0, "skipped_for_space": {}}
    snapshots.write_json(folder / snapshots.DONE, done)
    (folder / snapshots.WORKER).write_text(json.dumps({"done": {"x": 1.0, "2": "late"}}))
    from repgeom.probes.run.offload.follow import work_left

    assert work_left(run_dir) is True  # the end-of-run work of step 5 is not recorded as done
    snapshots.write_json(folder / snapshots.DONE, {**done, "skipped_for_space": [4]})
    assert work_left(run_dir) is False  # a malformed done.json: no run to finish
    assert "skipped_for_space is not an object: [4]" in capsys.readouterr().out
