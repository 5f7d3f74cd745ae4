"""Training starts that overlap (a requeue while the old start still runs on a hung node): the
newest start's snapshots win, a superseded start writes no more, and only ended starts' half
writes are swept (`repgeom.probes.run.offload.starts`; found in review of issue 38's mends)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from repgeom.probes.run.offload import layout, snapshots, starts


def _start(tmp_path: Path) -> snapshots.SnapshotWriter:
    writer = snapshots.SnapshotWriter(tmp_path, heartbeat_s=60)
    writer.start({"wandb": None})
    return writer


def _marker(folder: Path, step: int) -> dict | None:
    return snapshots.read_json(snapshots.step_dir(folder, step) / snapshots.COMPLETE)


def test_a_superseded_start_writes_no_snapshot_even_where_the_slot_is_empty(tmp_path) -> None:
    # The newer start writes step 10, the worker probes and deletes it; then the older start
    # (alive on a hung node) reaches step 10. Its weights are the abandoned trajectory's: the
    # worker would probe them as step 10. The same for a step the newer start has not reached.
    folder = snapshots.snapshot_dir(tmp_path)
    older, newer = _start(tmp_path), _start(tmp_path)
    try:
        newer.snapshot(10, torch.nn.Linear(3, 2), {"hyper_parameters": {}})
        newer.wait()
        probed = snapshots.snapshot_time(snapshots.step_dir(folder, 10))
        snapshots.remove_snapshot(snapshots.step_dir(folder, 10), written=probed)  # the worker
        older.snapshot(10, torch.nn.Linear(3, 2), {"hyper_parameters": {}})
        older.wait()
        older.snapshot(20, torch.nn.Linear(3, 2), {"hyper_parameters": {}})
        older.wait()
    finally:
        older.close(final_step=None, stopped=True)
        newer.close(final_step=None, stopped=True)
    assert _marker(folder, 10) is None and _marker(folder, 20) is None
    assert [p.name for p in folder.iterdir() if p.name.startswith(".step")] == []


def test_a_listing_that_fails_once_on_nfs_still_fences_a_superseded_start(tmp_path,
                                                                           monkeypatch) -> None:
    """NFS answers a listing of the starts with ESTALE once (a handle gone stale): it is listed
    again, and the older start still sees the newer one. Before: the failure read as "no start",
    and the fence let the superseded start write."""
    folder = snapshots.snapshot_dir(tmp_path)
    older, newer = _start(tmp_path), _start(tmp_path)
    real, failures = Path.iterdir, [errno.ESTALE]

    def stale_once(path: Path):
        if path.name == starts.STARTS and failures:
            raise OSError(failures.pop(), os.strerror(errno.ESTALE), str(path))
        return real(path)

    try:
        monkeypatch.setattr(Path, "iterdir", stale_once)
        assert not older.is_current() and failures == []
        monkeypatch.setattr(Path, "iterdir", real)
    finally:
        older.close(final_step=None, stopped=True)
        newer.close(final_step=None, stopped=True)
    assert starts.newest(folder) == newer.number


def test_a_marker_read_while_the_worker_moves_it_never_costs_the_newer_starts_snapshot(
        tmp_path, monkeypatch) -> None:
    # The older start's rename finds step 10 taken (an ended start's) and reads its marker just
    # after the worker moved it aside (None); the newer start renames its own in before the
    # older one removes what it found: only a snapshot without a marker may go, so the newer
    # start's is put back and kept.
    folder = snapshots.snapshot_dir(tmp_path)
    dead = _start(tmp_path)
    dead.snapshot(10, torch.nn.Linear(3, 2), {"hyper_parameters": {}})
    dead.close(final_step=None)
    older = _start(tmp_path)
    newer: list[snapshots.SnapshotWriter] = []
    real_read = starts.read_json
    calls = {"n": 0}

    def racing_read(path):
        calls["n"] += 1
        if calls["n"] != 1:
            return real_read(path)
        step = snapshots.step_dir(folder, 10)
        snapshots.remove_snapshot(step, written=snapshots.snapshot_time(step))  # the worker
        marker = real_read(path)  # None: the slot is empty for a moment
        newer.append(_start(tmp_path))
        newer[0].snapshot(10, torch.nn.Linear(3, 2), {"hyper_parameters": {}})
        newer[0].wait()  # the newer start's snapshot is in place now
        return marker

    monkeypatch.setattr(starts, "read_json", racing_read)
    # as if the newer start began only after the older one's check (the race's worst order)
    monkeypatch.setattr(older, "_superseded", lambda step: False)
    try:
        older.snapshot(10, torch.nn.Linear(3, 2), {"hyper_parameters": {}})
        older.wait()
    finally:
        older.close(final_step=None, stopped=True)
        for writer in newer:
            writer.close(final_step=None, stopped=True)
    assert calls["n"] >= 1 and newer
    assert _marker(folder, 10)["number"] == newer[0].number


def test_a_start_this_host_cannot_ask_has_its_half_writes_swept_only_after_an_hour(
        tmp_path, monkeypatch) -> None:
    # A start on another host: its lease says nothing here (filelock judges a pid on its own
    # host only). A half-written snapshot untouched for `STALE_S` is a killed start's (no
    # snapshot takes that long to write) and is swept; a fresh one may be a live start's and
    # stays.
    monkeypatch.setattr(starts, "start_gone", lambda folder, number: False)
    folder = snapshots.snapshot_dir(tmp_path)
    cuts = []
    for step in (10, 20):
        killed = _start(tmp_path)
        cut = folder / f".step_{step:09d}.{killed.number}-0123456789abcdef{snapshots.WRITING}"
        cut.mkdir()
        (cut / snapshots.WEIGHTS).write_bytes(b"PK half a zip")
        cuts.append(cut)
        killed.close(final_step=None)
    old = time.time() - starts.STALE_S - 60
    for path in (cuts[0], cuts[0] / snapshots.WEIGHTS):
        os.utime(path, (old, old))
    last = _start(tmp_path)
    last.close(final_step=None, stopped=True)
    assert not cuts[0].exists() and cuts[1].is_dir()


def test_a_folder_being_put_back_is_not_swept_as_a_leftover(tmp_path, monkeypatch) -> None:
    # remove_snapshot moves a snapshot aside (.removed) and puts it back when it was not the one
    # meant; a start sweeping leftovers at that moment must not delete it: only a .removed folder
    # settled for `SETTLED_S` is a kill's leftover.
    folder = snapshots.snapshot_dir(tmp_path)
    _start(tmp_path).close(final_step=None)
    aside = folder / f".step_{10:09d}.0123456789abcdef{snapshots.REMOVED}"
    aside.mkdir()
    (aside / snapshots.WEIGHTS).write_bytes(b"weights")
    _start(tmp_path).close(final_step=None)
    assert aside.is_dir()  # just moved aside: maybe on its way back
    # later (a rename sets the ctime, which utime cannot set back: the clock moves instead)
    later = time.time() + snapshots.SETTLED_S + 1
    monkeypatch.setattr(layout, "time", SimpleNamespace(time=lambda: later))
    assert snapshots.leftovers(folder, min_age_s=snapshots.SETTLED_S) == [aside]
    _start(tmp_path).close(final_step=None)
    assert not aside.exists()  # settled: a kill's leftover, swept


def test_names_with_other_digits_are_not_ours(tmp_path) -> None:
    # str.isdigit() takes "²"; int("²") raises: a planted name must not crash a start.
    folder = snapshots.snapshot_dir(tmp_path)
    folder.mkdir(parents=True)
    (folder / f".step_000000010.²-ab{snapshots.WRITING}").mkdir()
    (folder / "step_²").mkdir()
    (folder / starts.STARTS).mkdir()
    (folder / starts.STARTS / f"²{starts.SUFFIX}").write_text("")
    assert snapshots.writer_of(folder / f".step_000000010.²-ab{snapshots.WRITING}") is None
    assert snapshots.step_of(folder / "step_²") is None
    writer = _start(tmp_path)
    writer.close(final_step=None)
    assert writer.number == 0


def test_a_start_killed_by_sigkill_mid_write_is_swept_and_a_live_one_is_not(tmp_path) -> None:
    # Real processes (filelock finds a killed one's lease held by a process that is gone): the
    # next start removes the killed start's half-written snapshot and keeps the live one's.
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from repgeom.probes.run.offload import snapshots\n"
        "w = snapshots.SnapshotWriter(Path(sys.argv[1]), heartbeat_s=60)\n"
        "w.start({'wandb': None})\n"
        "cut = w.folder / f'.step_{int(sys.argv[2]):09d}.{w.number}-0123456789abcdef.tmp'\n"
        "cut.mkdir()\n"
        "print(cut, flush=True)\n"
        "time.sleep(300)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = []
    try:
        for step in (10, 20):  # one after the other: two starts' numbers, in order
            procs.append(subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(step)],
                                          stdout=subprocess.PIPE, text=True, env=env))
        cuts = [Path(p.stdout.readline().strip()) for p in procs]
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(60)
        new = _start(tmp_path)
        new.close(final_step=None, stopped=True)
        assert not cuts[0].exists() and cuts[1].is_dir()
    finally:
        for p in procs:
            p.kill()
            p.wait(60)


def test_a_start_that_fails_before_its_claim_says_nothing_of_the_newest_start(
        tmp_path, monkeypatch) -> None:
    """A start whose ``start()`` raises before it has a number (a full disk at its claim), or
    never runs, is closed by Lightning's ``on_exception``: it writes no "failed" beat, which would
    carry the newest start's number and stop the worker while that start trains on."""
    alive = _start(tmp_path)
    folder = snapshots.snapshot_dir(tmp_path)
    before = layout.read_json(folder / layout.TRAINING)

    def full(_folder):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    failed = snapshots.SnapshotWriter(tmp_path, heartbeat_s=60)
    monkeypatch.setattr(starts, "claim", full)
    try:
        with pytest.raises(OSError):
            failed.start({"wandb": None})
        failed.close(final_step=None)
        # Nor one whose start() never ran (W&B's run raised before it, in Offloading.start).
        snapshots.SnapshotWriter(tmp_path, heartbeat_s=60).close(final_step=None)
        after = layout.read_json(folder / layout.TRAINING)
        assert (after["state"], after["number"]) == ("running", alive.number) == (
            before["state"], before["number"])
    finally:
        alive.close(final_step=None, stopped=True)
