"""`repgeom.files`: the one atomic writer (a callback, several files, a mode), the one directory
fsync, the one lock and the one "read a JSON object or None"."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repgeom import files


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_callback_writes_the_file_whole(tmp_path) -> None:
    seen = []

    def write(tmp: Path) -> None:
        seen.append((tmp.parent, tmp.name.startswith(".out.txt."), tmp.stat().st_size))
        tmp.write_text("whole")

    files.atomic_write(tmp_path / "out.txt", write)
    assert (tmp_path / "out.txt").read_text() == "whole"
    assert seen == [(tmp_path, True, 0)]  # an empty hidden file beside the target
    assert _names(tmp_path) == ["out.txt"]


def test_a_failing_callback_renames_nothing_and_leaves_no_temporary_file(tmp_path) -> None:
    (tmp_path / "a").write_text("old a")
    (tmp_path / "b").write_text("old b")

    def fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, "disk full")

    with pytest.raises(OSError, match="disk full"):
        files.atomic_write_many([(tmp_path / "a", lambda tmp: tmp.write_text("new a")),
                                 (tmp_path / "b", fail)])
    assert (tmp_path / "a").read_text() == "old a"  # written, but not renamed: b failed
    assert (tmp_path / "b").read_text() == "old b"
    assert _names(tmp_path) == ["a", "b"]


def test_several_files_are_renamed_after_one_fence_check_or_none_is(tmp_path) -> None:
    # The fence is checked once, before the first rename: a lease lost at that check renames
    # none of them. Before, it was checked before each rename, and a lease lost between two
    # renames left a new probes.parquet beside the old probes.csv.
    seen = []

    def check() -> None:
        seen.append(sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")))

    with files.fenced(check):
        files.atomic_write_many([(tmp_path / "first", lambda tmp: tmp.write_text("1")),
                                 (tmp_path / "second", lambda tmp: tmp.write_text("2"))])
    assert seen == [[]]  # once, before any rename
    assert (tmp_path / "first").read_text() == "1" and (tmp_path / "second").read_text() == "2"

    def lost() -> None:
        raise RuntimeError("lease taken over")

    with files.fenced(lost), pytest.raises(RuntimeError, match="taken over"):
        files.atomic_write_many([(tmp_path / "first", lambda tmp: tmp.write_text("new")),
                                 (tmp_path / "second", lambda tmp: tmp.write_text("new"))])
    assert [(tmp_path / n).read_text() for n in ("first", "second")] == ["1", "2"]
    assert _names(tmp_path) == ["first", "second"]  # no temporary file left


def test_a_killed_writes_temporaries_are_found_for_that_file_only(tmp_path) -> None:
    for name in (".step_10.pt.0a1b2c3d.tmp", ".step_10.pt.ffff0000.tmp", ".step_1.pt.1234.tmp",
                 "step_10.pt", ".step_10.ptx.aaaa.tmp"):
        (tmp_path / name).write_text("x")
    found = [p.name for p in files.stale_temporaries(tmp_path / "step_10.pt")]
    assert found == [".step_10.pt.0a1b2c3d.tmp", ".step_10.pt.ffff0000.tmp"]


def test_a_lost_fence_renames_nothing(tmp_path) -> None:
    def lost() -> None:
        raise RuntimeError("lease taken over")

    with files.fenced(lost), pytest.raises(RuntimeError, match="taken over"):
        files.atomic_write_text(tmp_path / "x.json", "{}")
    assert _names(tmp_path) == []


def test_the_mode_is_the_umasks_or_the_one_given(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        files.atomic_write(tmp_path / "default", lambda tmp: tmp.write_bytes(b"x"))
        files.atomic_write(tmp_path / "given", lambda tmp: tmp.write_bytes(b"x"), mode=0o640)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "default").stat().st_mode) == 0o644  # never mkstemp's 0600
    assert stat.S_IMODE((tmp_path / "given").stat().st_mode) == 0o640


def test_a_tmp_dir_holds_the_temporary_file(tmp_path) -> None:
    (tmp_path / "blobs").mkdir()
    (tmp_path / "snapshots").mkdir()
    seen = []
    files.atomic_write(tmp_path / "snapshots" / "f",
                       lambda tmp: (seen.append(tmp.parent), tmp.write_text("x")),
                       tmp_dir=tmp_path / "blobs")
    assert seen == [tmp_path / "blobs"]
    assert _names(tmp_path / "blobs") == [] and _names(tmp_path / "snapshots") == ["f"]


def test_fsync_dir_passes_over_a_refusal(tmp_path, monkeypatch) -> None:
    real = os.fsync
    calls = []

    def refuse(fd: int) -> None:
        calls.append(fd)
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(os, "fsync", refuse)
    files.fsync_dir(tmp_path)  # a file system that refuses fsync on a directory
    files.fsync_dir(tmp_path / "missing")  # cannot be opened: nothing to flush
    monkeypatch.setattr(os, "fsync", real)
    assert len(calls) == 1


def test_try_lock_says_none_while_another_process_holds_it(tmp_path) -> None:
    lock = tmp_path / "lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", str(lock)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert files.try_lock(lock) is None
    finally:
        holder.kill()
        holder.wait()
    handle = files.try_lock(lock)
    assert handle is not None
    handle.close()


def test_try_lock_is_none_for_a_folder_that_is_gone(tmp_path) -> None:
    assert files.try_lock(tmp_path / "gone" / "lock") is None


def test_a_refused_flock_is_raised_not_taken_for_another_holder(tmp_path, monkeypatch) -> None:
    # EACCES from flock(2) is a refusal (a security module, an NFSv4 server), never contention
    # on Linux; "another process holds it, wait for it" would send the user after no process.
    def refused(fd, operation):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(fcntl, "flock", refused)
    with pytest.raises(PermissionError):
        files.try_lock(tmp_path / "lock")


def test_try_lock_raises_other_errors_and_closes_the_file(tmp_path, monkeypatch) -> None:
    def broken(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", broken)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError) as raised:
        files.try_lock(tmp_path / "lock")
    assert raised.value.errno == errno.ENOLCK
    assert set(os.listdir("/proc/self/fd")) == before


def test_try_lock_makes_the_file_with_the_mode_asked(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        handle = files.try_lock(tmp_path / "lock", create_mode=0o600)
    finally:
        os.umask(old)
    assert handle is not None
    handle.close()
    assert stat.S_IMODE((tmp_path / "lock").stat().st_mode) == 0o600


@pytest.mark.parametrize(("text", "why"), [
    (None, None),  # missing: no reason, the file is simply not there
    ('{"a": 1', "JSONDecodeError"),  # cut short
    ("[1, 2]", "not a JSON object"),
    (b"\xff\xfe", "UnicodeDecodeError"),
])
def test_read_json_says_none_and_why(tmp_path, text, why) -> None:
    path = tmp_path / "x.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    data, reason = files.read_json_why(path)
    assert data is None and files.read_json(path) is None
    assert reason is None if why is None else why in reason


def test_read_json_reads_an_object(tmp_path) -> None:
    (tmp_path / "x.json").write_text('{"step": 10}')
    assert files.read_json(tmp_path / "x.json") == {"step": 10}
    assert files.read_json_why(tmp_path / "x.json") == ({"step": 10}, None)


def test_only_temporaries_older_than_any_write_count_as_stale_for_a_shared_file(tmp_path) -> None:
    old, fresh = tmp_path / ".probes.csv.0a1b2c3d.tmp", tmp_path / ".probes.csv.ffff0000.tmp"
    for path in (old, fresh):
        path.write_text("x")
    then = time.time() - 3600
    os.utime(old, (then, then))
    assert files.stale_temporaries(tmp_path / "probes.csv", min_age_s=600) == [old]
    assert files.stale_temporaries(tmp_path / "probes.csv") == [old, fresh]
