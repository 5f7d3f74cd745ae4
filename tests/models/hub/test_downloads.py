"""Hub downloads (`repgeom.models.hub.downloads`) against the tests' stand-in hub and its faults:
folders repgeom owns and only those deleted, one retry policy for every hub call, resumed
partial files, the errors that say what to do, weights hashes, complete caches, Ctrl-C."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import textwrap
import threading
import time
from email.utils import formatdate
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub.constants
import pytest
from cli_runs import PYTHON, subprocess_env
from hub_server import FakeHub, Fault

from repgeom.models.hub import downloads, revisions
from repgeom.models.hub.calls import (
    DownloadError,
    HubAccessError,
    Retrier,
    RetriesExhausted,
    RevisionUnavailable,
    describe,
    retry_after,
)
from repgeom.models.hub.download_folders import (
    DOWNLOADS,
    LOCK,
    MARKER,
    RevisionFiles,
    clear_leftovers,
    download_dir,
    release,
)
from repgeom.models.hub.downloads import fetch_revision
from repgeom.probes.run.copies import copies
from repgeom.probes.run.trajectory import Step, Trajectory

REPO = "org/steps"
WEIGHTS_BYTES = 300_000
CHUNK = 16_384
"""The chunk huggingface_hub's http_get writes at a time, where a test needs part of a file
written (a kill, a disk that fills): 10 MiB by default."""


def _revision(folder: Path, seed: int, *, weights: str | None = "safetensors",
              shards: int = 1) -> Path:
    """A revision's files: a config and random weights (one file, shards with an index, or a
    ``.bin``; none for a config-only branch). The tests here never load them."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "seed": seed}))
    blob = hashlib.sha256(str(seed).encode()).digest() * (WEIGHTS_BYTES // 32 + 1)
    blob = blob[:WEIGHTS_BYTES]
    if weights == "safetensors" and shards == 1:
        (folder / "model.safetensors").write_bytes(blob)
    elif weights == "safetensors":
        names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
        for i, name in enumerate(names):
            (folder / name).write_bytes(blob[i::shards])
        index = {"metadata": {}, "weight_map": {f"w{i}": n for i, n in enumerate(names)}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    elif weights == "bin":
        (folder / "pytorch_model.bin").write_bytes(blob)
    return folder


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> dict[str, Path]:
    """step10..step40 with their own weights, step50 serving step40's (one folder), step60
    config only."""
    root = tmp_path_factory.mktemp("repo")
    folders = {f"step{s}": _revision(root / f"step{s}", s) for s in (10, 20, 30, 40)}
    folders["step50"] = folders["step40"]
    folders["step60"] = _revision(root / "step60", 60, weights=None)
    return folders


@pytest.fixture
def use(monkeypatch, tmp_path):
    """`use(hub)`: point huggingface_hub (in this process) at `hub`, with an empty cache."""

    def point(hub: FakeHub) -> FakeHub:
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
        monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            hub.url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        return hub

    return point


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fetch(revision: str, work: Path, **options) -> RevisionFiles:
    options = {"owner": work.parent / "out", "first_wait_s": 0.01, "say": lambda m: None,
               **options}
    return fetch_revision(REPO, revision, work, **options)


def _hf_subject(revision: str, step: int) -> SimpleNamespace:
    return SimpleNamespace(name=REPO, revision=revision, step=step, source="hf",
                           reference=False, model=REPO, stack=None, path="")


# ---------------------------------------------------------------------------------------------
# Ownership


@pytest.mark.parametrize("where", ["folder", "cwd"])
def test_a_users_files_a_git_repository_and_the_cwd_survive(where, repo, use, tmp_path,
                                                             monkeypatch) -> None:
    """`work_dir=` names the user's folder (or ``.``): a kill left a download behind, the rerun
    clears it and probes: only repgeom's marked folder goes, never ``mydata/``, ``.git/``, a
    folder the user named like a revision, nor the cwd (today's clean-up deleted all four)."""
    user = tmp_path / "mine"
    for path in ("mydata/table.csv", ".git/HEAD", "step20/notes.txt", "step99/notes.txt"):
        (user / path).parent.mkdir(parents=True, exist_ok=True)
        (user / path).write_text("the user's")
    if where == "cwd":
        monkeypatch.chdir(user)
    work = Path(".") if where == "cwd" else user
    out = tmp_path / "out"
    trajectory = Trajectory(request=None, device=None, output_dir=out, work_dir=work)
    with use(FakeHub(REPO, repo)):
        left = trajectory._fetch(Step([_hf_subject("step10", 10)]))  # then killed
        left.lock.close()
        trajectory._clear_leftovers([Step([_hf_subject("step20", 20)])])
        assert not left.path.exists()  # this run's leftover, not to be probed again: deleted
        files = trajectory._fetch(Step([_hf_subject("step20", 20)]))
        assert files.owned and (files.path / MARKER).is_file()
        release(files)
    assert os.getcwd() and Path.cwd().exists()
    kept = sorted(str(p.relative_to(user)) for p in user.rglob("*") if p.is_file())
    assert kept == [".git/HEAD", "mydata/table.csv", "step20/notes.txt", "step99/notes.txt"]
    assert not (user / DOWNLOADS).exists()  # repgeom's own folder goes once empty


def test_the_clean_up_deletes_only_this_runs_unlocked_marked_leftovers(repo, use,
                                                                       tmp_path) -> None:
    work = tmp_path / "work"
    with use(FakeHub(REPO, repo)):
        mine = {r: _fetch(r, work, owner=tmp_path / "a") for r in ("step10", "step20", "step30")}
        theirs = _fetch("step10", work, owner=tmp_path / "b")
    for files in (mine["step10"], mine["step20"], theirs):
        files.lock.close()  # their processes were killed; step30's is still running
    unmarked = download_dir(work, tmp_path / "a", REPO, "step40")
    unmarked.mkdir(parents=True)  # no marker: not known to be repgeom's
    deleted = clear_leftovers(work, tmp_path / "a", keep=[(REPO, "step20")])
    assert deleted == [mine["step10"].path]
    assert mine["step20"].path.is_dir()  # still to probe: its files resume
    assert mine["step30"].path.is_dir()  # locked by a live process
    assert theirs.path.is_dir() and unmarked.is_dir()  # another run's; not marked
    assert theirs.path != mine["step10"].path
    mine["step30"].lock.close()


class _Killed(BaseException):
    """kill -9 at one deletion: nothing after it runs, no `except OSError` catches it."""


def _killed_at(cut: int, calls, real):
    """`real`, raising `_Killed` instead at the `cut`-th call counted by `calls` (an iterator
    shared by every function wrapped for one cut)."""

    def call(*args, **kwargs):
        if next(calls) == cut:
            raise _Killed
        return real(*args, **kwargs)

    return call


def _marker_listed_first(monkeypatch) -> None:
    """Folder listings (``os.listdir``, ``os.scandir``: pathlib's and rmtree's) name the marker
    first, as ext4 happened to: the worst order for a deletion in listing order (tmpfs lists
    the newest file first, and then the old rmtree got away with it)."""
    real_listdir, real_scandir = os.listdir, os.scandir

    class Listing(list):
        def __getattr__(self, name: str):  # tell, seek, truncate: the file's own
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def close(self):
            pass

    def listdir(*args, **kwargs):
        return sorted(real_listdir(*args, **kwargs), key=lambda name: name != MARKER)

    def scandir(*args, **kwargs):
        with real_scandir(*args, **kwargs) as entries:
            return Listing(sorted(entries, key=lambda entry: entry.name != MARKER))

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "scandir", scandir)


def _unmarked_leftovers(folder: Path) -> list[str]:
    """What is left in `folder` besides its marker and lock when it has lost its marker."""
    if not folder.is_dir() or (folder / MARKER).exists():
        return []
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.name != LOCK)


@pytest.mark.parametrize("deletion", ["release", "clear_leftovers"])
def test_a_kill_at_any_deletion_leaves_no_file_without_its_marker(deletion, repo, use, tmp_path,
                                                                  monkeypatch) -> None:
    # Under load, probe.py killed while it released its final revision left that folder's
    # weights without their marker (rmtree had deleted it first), and no rerun deleted them
    # (tests/probes/run/test_trajectory.py::test_kill_9_then_the_same_command_gives_the_same_table
    # failed once in five loaded runs). Kill at each deletion in turn: the folder keeps its
    # marker while anything else is left, and the rerun's clean-up deletes what is left.
    _marker_listed_first(monkeypatch)
    real_unlink, real_rmdir, cuts = os.unlink, os.rmdir, 0
    with use(FakeHub(REPO, repo)):
        for cut in range(1, 30):
            work, calls = tmp_path / f"work{cut}", iter(range(1, 10_000))
            files = _fetch("step10", work)
            (files.path / "onnx").mkdir()  # a revision's subfolder, and a partial file
            (files.path / "onnx" / "model.onnx").write_bytes(b"w")
            (files.path / "pytorch_model.bin.incomplete").write_bytes(b"w")
            if deletion == "clear_leftovers":
                files.lock.close()  # the run was killed; its rerun clears the folder
            monkeypatch.setattr(os, "unlink", _killed_at(cut, calls, real_unlink))
            monkeypatch.setattr(os, "rmdir", _killed_at(cut, calls, real_rmdir))
            try:
                release(files) if deletion == "release" else clear_leftovers(work, work.parent
                                                                            / "out")
            except _Killed:
                cuts += 1
            else:
                break  # every deletion has been cut once
            finally:
                monkeypatch.setattr(os, "unlink", real_unlink)
                monkeypatch.setattr(os, "rmdir", real_rmdir)
                files.lock.close()  # the process is gone
            assert _unmarked_leftovers(files.path) == [], cut
            clear_leftovers(work, work.parent / "out")
            assert not any(p.is_file() and p.name != LOCK for p in work.rglob("*")), cut
    assert cuts >= 6  # config, weights, proofs, the subfolder's file, marker, lock at least


def test_an_undeletable_file_keeps_its_folder_marked_for_a_later_clean_up(repo, use, tmp_path,
                                                                         monkeypatch) -> None:
    real_unlink = os.unlink

    def busy(path, *args, **kwargs):
        if Path(path).name == "model.safetensors":
            raise OSError(errno.EBUSY, "Device or resource busy", str(path))
        return real_unlink(path, *args, **kwargs)

    work = tmp_path / "work"
    with use(FakeHub(REPO, repo)):
        files = _fetch("step10", work)
    monkeypatch.setattr(os, "unlink", busy)
    release(files)
    assert (files.path / MARKER).exists() and (files.path / "model.safetensors").exists()
    monkeypatch.setattr(os, "unlink", real_unlink)
    assert clear_leftovers(work, tmp_path / "out") == [files.path]  # a later run tries again
    assert not files.path.exists()


def test_a_revision_folder_that_is_a_link_is_not_followed(repo, use, tmp_path) -> None:
    # Never a user's file: a link in place of a revision folder keeps what it points to.
    work, users = tmp_path / "work", tmp_path / "users_disk"
    with use(FakeHub(REPO, repo)):
        files = _fetch("step10", work)
    users.mkdir()
    (users / "notes.txt").write_text("theirs")
    (users / MARKER).write_bytes((files.path / MARKER).read_bytes())  # as if it were ours
    files.lock.close()
    shutil.rmtree(files.path)
    files.path.symlink_to(users, target_is_directory=True)
    release(RevisionFiles(files.path, owned=True))
    clear_leftovers(work, tmp_path / "out")
    assert sorted(p.name for p in users.iterdir()) == sorted([MARKER, "notes.txt"])


@pytest.mark.parametrize("after", [MARKER, LOCK])
def test_a_claim_of_the_same_run_during_a_release_keeps_its_marker(after, repo, use, tmp_path,
                                                                   monkeypatch) -> None:
    # Another process of the run asks for the revision as this one deletes it: refused while
    # the lock is held (after the marker went), or it makes the folder anew, marked and locked.
    real_unlink, other = os.unlink, {}

    def and_then_claimed(path, *args, **kwargs):
        real_unlink(path, *args, **kwargs)
        if Path(path).name == after and not other:
            try:
                other["files"] = _fetch("step10", work)
            except DownloadError as error:
                other["refused"] = error

    work = tmp_path / "work"
    with use(FakeHub(REPO, repo)):
        files = _fetch("step10", work)
        monkeypatch.setattr(os, "unlink", and_then_claimed)
        release(files)
        monkeypatch.setattr(os, "unlink", real_unlink)
    if after == MARKER:
        assert "in use by another repgeom process" in str(other["refused"])
        assert not files.path.exists()
    else:
        assert (files.path / MARKER).exists() and (files.path / "model.safetensors").exists()
        release(other["files"])
        assert not files.path.exists()


def test_two_jobs_on_one_work_dir_never_touch_each_others_folders(repo, use, tmp_path) -> None:
    """Two runs (say two shards) download the same revisions into one `work_dir` at once, and
    each clears its leftovers while the other downloads: both end with whole, checked files."""
    work, results, errors = tmp_path / "work", {}, []

    def job(name: str) -> None:
        try:
            out = tmp_path / name
            for revision in ("step10", "step20", "step30"):
                clear_leftovers(work, out, keep=[(REPO, revision)])
                files = _fetch(revision, work, owner=out)
                results[name, revision] = (files.path, _sha256(files.path / "model.safetensors"))
                release(files)
        except Exception as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    with use(FakeHub(REPO, repo, bytes_per_second=2_000_000)):  # slow enough to overlap
        threads = [threading.Thread(target=job, args=(n,)) for n in ("a", "b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert not errors, errors
    for revision in ("step10", "step20", "step30"):
        assert results["a", revision][0] != results["b", revision][0]
        assert results["a", revision][1] == results["b", revision][1] == _sha256(
            repo[revision] / "model.safetensors")


def test_the_same_revision_of_the_same_run_twice_at_once_is_refused(repo, use, tmp_path) -> None:
    with use(FakeHub(REPO, repo)):
        first = _fetch("step10", tmp_path / "work")
        with pytest.raises(DownloadError, match="in use by another repgeom process"):
            _fetch("step10", tmp_path / "work")
        release(first)


@pytest.mark.slow  # two processes
def test_a_kill_during_a_download_then_the_rerun_resumes(repo, use, tmp_path) -> None:
    """kill -9 mid-file: the partial file stays and the rerun asks for the rest only (a Range
    request), so no byte is sent twice."""
    work = tmp_path / "work"
    code = textwrap.dedent(f"""
        import huggingface_hub.constants
        from repgeom.models.hub.downloads import fetch_revision
        huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE = {CHUNK}  # a kill loses a chunk
        fetch_revision({REPO!r}, "step10", {str(work)!r}, owner={str(tmp_path / "out")!r})
    """)
    with FakeHub(REPO, repo, bytes_per_second=100_000) as hub:  # 3 s for the weights
        env = subprocess_env(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf_home"))
        env.pop("HF_HUB_OFFLINE", None)
        process = subprocess.Popen([PYTHON, "-c", code], env=env)
        part = download_dir(work, tmp_path / "out", REPO, "step10") / "model.safetensors.incomplete"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not part.exists() or part.stat().st_size < 50_000):
            time.sleep(0.05)
        process.kill()
        process.wait()
        had = part.stat().st_size
        assert 0 < had < WEIGHTS_BYTES
        use(hub)
        files = _fetch("step10", work)
        ranges = [r.range_start for r, status, _ in hub.served if r.kind == "file"
                  and r.filename == "model.safetensors" and status == 206]
    assert _sha256(files.path / "model.safetensors") == _sha256(
        repo["step10"] / "model.safetensors")
    assert ranges and ranges[0] >= had  # resumed where the killed process stopped
    weights_sent = sum(n for r, _, n in hub.served if r.filename == "model.safetensors")
    assert weights_sent <= WEIGHTS_BYTES + (1 << 16)  # at most the last write before the kill
    release(files)


# ---------------------------------------------------------------------------------------------
# One retry policy


def test_429_waits_for_retry_after_on_the_api_and_on_files(repo, use, tmp_path) -> None:
    said: list[str] = []
    faults = [Fault(on="info", status=429, retry_after="1"),
              Fault(on="file", status=429, retry_after=formatdate(time.time() + 5, usegmt=True),
                    filename="model.safetensors")]  # a date: about 3 s after the first wait
    with use(FakeHub(REPO, repo, faults=faults)) as hub:
        started = time.monotonic()
        files = _fetch("step10", tmp_path / "work", say=said.append)
        took = time.monotonic() - started
    assert said[0].startswith("waiting 1.0 s: HTTP 429 from ")
    assert said[0].endswith("/api/models/org/steps/revision/step10 (try 1, 15 min of 15 left)")
    second = float(said[1].split()[1])  # the date's seconds, less those spent since
    assert 2 <= second <= 5 and "HTTP 429" in said[1] and "try 2" in said[1]
    assert took >= 1 + second - 0.05  # the wait is shown to 0.1 s
    assert [s for _, s, _ in hub.served].count(429) == 2
    assert files.weights == {"model.safetensors": _sha256(repo["step10"] / "model.safetensors")}
    release(files)


def test_5xx_on_the_listing_and_on_the_file_list_are_retried(repo, use, tmp_path) -> None:
    said: list[str] = []
    faults = [Fault(on="refs", status=500, times=2), Fault(on="info", status=503, times=2)]
    with use(FakeHub(REPO, repo, faults=faults)) as hub:
        refs = revisions.list_refs(REPO, retry=Retrier(first_wait_s=0.01, say=said.append))
        files = _fetch("step20", tmp_path / "work", say=said.append)
    assert "step20" in refs.branches
    assert [s for r, s, _ in hub.served if r.kind == "refs"] == [500, 500, 200]
    assert [s for r, s, _ in hub.served if r.kind == "info"] == [503, 503, 200]
    assert len(said) == 4 and all("HTTP 50" in m for m in said)
    release(files)


def test_a_429_on_the_listing_waits_then_lists(repo, use) -> None:
    said: list[str] = []
    with use(FakeHub(REPO, repo, faults=[Fault(on="refs", status=429, retry_after="1")])):
        refs = revisions.list_refs(REPO, retry=Retrier(first_wait_s=0.01, say=said.append))
    assert "step10" in refs.branches and said[0].startswith("waiting 1.0 s: HTTP 429")


def test_a_connection_cut_mid_file_resumes_where_it_stopped(repo, use, tmp_path) -> None:
    cut = Fault(on="file", filename="model.safetensors", cut_after=100_000, times=2)
    with use(FakeHub(REPO, repo, faults=[cut])) as hub:
        files = _fetch("step30", tmp_path / "work")
    served = [(r.range_start, status, n) for r, status, n in hub.served
              if r.filename == "model.safetensors"]
    kept = 100_000  # a cut keeps every byte that arrived, though http_get reads 10 MiB chunks
    assert served == [(0, 200, 100_000), (kept, 206, 100_000),
                      (2 * kept, 206, WEIGHTS_BYTES - 2 * kept)]
    assert _sha256(files.path / "model.safetensors") == _sha256(
        repo["step30"] / "model.safetensors")
    assert files.bytes == sum(p.stat().st_size for p in repo["step30"].iterdir())
    release(files)


def test_a_link_that_drops_every_transfer_before_a_chunk_ends_still_finishes(repo, use,
                                                                              tmp_path) -> None:
    """huggingface_hub's http_get reads 10 MiB at a time and loses what arrived of a chunk with
    a cut; repgeom hands those bytes on (`repgeom.models.hub.calls._cut_kept`), so a link that
    drops every transfer after 40 kB finishes a 300 kB file, each transfer sending new bytes
    only. Before: each cut kept nothing, and the budget ended the revision."""
    assert huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE >= 10 * 2**20  # the library's own
    cut = Fault(on="file", filename="model.safetensors", cut_after=40_000, times=float("inf"))
    with use(FakeHub(REPO, repo, faults=[cut])) as hub:
        files = _fetch("step20", tmp_path / "work", retry_budget_s=5.0)
    starts = [r.range_start for r, _, _ in hub.served if r.filename == "model.safetensors"]
    assert starts == list(range(0, WEIGHTS_BYTES, 40_000))
    assert _sha256(files.path / "model.safetensors") == _sha256(
        repo["step20"] / "model.safetensors")
    release(files)


def test_a_cut_after_the_last_byte_of_a_file_of_known_size_keeps_it_on_the_first_try(
        repo, use, tmp_path, monkeypatch) -> None:
    """Every byte of the file arrives, then the connection fails before the answer ends (a
    chunked body whose last, empty chunk never comes): the cut is kept (`_cut_kept`), the bytes
    are the listed size and their sha256 the hub's, so the file is proved and kept on the first
    try: one GET, no wait, no ``.incomplete`` left. Not a cut short body to resume (there is no
    byte left to ask for), nor a library retry of a request from the end."""
    cuts: list[list] = []  # each try's cuts: the fault must really end the body with an error
    attempt = Retrier.attempt

    @contextlib.contextmanager
    def watched(self, what, **options):
        with attempt(self, what, **options) as cut:
            cuts.append(cut)
            yield cut

    monkeypatch.setattr(Retrier, "attempt", watched)
    said: list[str] = []
    cut = Fault(on="file", filename="model.safetensors", unterminated=True)
    with use(FakeHub(REPO, repo, faults=[cut])) as hub:
        files = _fetch("step30", tmp_path / "work", say=said.append)
    served = [(r.range_start, status, n) for r, status, n in hub.served
              if r.filename == "model.safetensors"]
    assert served == [(0, 200, WEIGHTS_BYTES)]  # the whole file, once
    errors = [error for try_cuts in cuts for error in try_cuts]
    assert [type(e).__name__ for e in errors] == ["RemoteProtocolError"], errors  # httpx's
    assert said == []
    assert _sha256(files.path / "model.safetensors") == _sha256(
        repo["step30"] / "model.safetensors")
    assert not list(files.path.glob("*.incomplete"))
    release(files)


def test_a_full_disk_under_a_cuts_bytes_is_named_not_retried(repo, use, tmp_path,
                                                             monkeypatch) -> None:
    """The write of what arrived before a cut meets a full disk: ENOSPC, named at once, not the
    cut retried until the budget is spent ("the hub did not answer")."""
    _disk_fills(monkeypatch, "safetensors.incomplete", after_bytes=100_000)
    cut = Fault(on="file", filename="model.safetensors", cut_after=150_000, times=float("inf"))
    with use(FakeHub(REPO, repo, faults=[cut])) as hub:
        with pytest.raises(OSError) as raised:
            _fetch("step10", tmp_path / "work", retry_budget_s=1.0)
    monkeypatch.undo()
    assert raised.value.errno == errno.ENOSPC and "work_dir=" in str(raised.value)
    assert sum(1 for r, _, _ in hub.served if r.filename == "model.safetensors") == 1


def test_a_proxy_that_ignores_range_and_cuts_later_each_time_is_no_progress(repo, use,
                                                                            tmp_path) -> None:
    """A proxy that ignores ``Range`` and cuts each whole transfer a little later (a time limit
    on a varying link) throws away what was kept at every try: no try is progress, so the
    back-off grows and the budget ends it, as for a cut at the same byte (the review of the
    byte-exact cuts counted 82 whole transfers in a 3 s budget)."""
    count = itertools.count()

    def hook(request):
        if request.kind == "file" and request.filename == "model.safetensors":
            return Fault(on="file", cut_after=100_000 + 100 * next(count))
        return None

    with use(FakeHub(REPO, repo, hook=hook, ignore_range=True)) as hub:
        finished, error, _ = _in_thread(lambda: _fetch(
            "step20", tmp_path / "work", retry_budget_s=1.0, first_wait_s=0.05), 40)
    tries = sum(1 for r, _, _ in hub.served if r.filename == "model.safetensors")
    assert finished and isinstance(error, DownloadError), error
    assert tries <= 7  # waits of at least 0.025 * 2**k s fit 1 s 5 times


def test_the_budget_bounds_the_tries_and_the_partial_file_is_kept(repo, use, tmp_path) -> None:
    """Always cut, always 500 after: the budget ends it; the message says the partial file is
    kept and the same command resumes; a rerun against a healthy hub finishes it."""
    work = tmp_path / "work"
    faults = [Fault(on="file", filename="model.safetensors", cut_after=50_000),
              Fault(on="file", filename="model.safetensors", status=500, times=float("inf"))]
    with use(FakeHub(REPO, repo, faults=faults)) as hub:
        with pytest.raises(DownloadError) as raised:
            _fetch("step40", work, retry_budget_s=0.5, first_wait_s=0.05)
        tries = sum(1 for r, _, _ in hub.served if r.filename == "model.safetensors")
    message = str(raised.value)
    assert "HTTP 500" in message and "partial files are kept" in message
    assert "the same command resumes" in message and "retry_budget_s=" in message
    assert 3 <= tries <= 1 + 0.5 / (0.05 * 0.5) + 1  # each wait at least half the first one
    part = download_dir(work, tmp_path / "out", REPO, "step40") / "model.safetensors.incomplete"
    kept = 50_000  # a cut keeps every byte that arrived, though http_get reads 10 MiB chunks
    assert part.stat().st_size == kept
    with use(FakeHub(REPO, repo)) as hub:
        files = _fetch("step40", work)
    assert hub.bytes_sent <= WEIGHTS_BYTES - kept + 1000  # the rest, and the config
    assert _sha256(files.path / "model.safetensors") == _sha256(
        repo["step40"] / "model.safetensors")
    release(files)


def test_a_wait_longer_than_the_budget_fails_at_once(repo, use, tmp_path) -> None:
    with use(FakeHub(REPO, repo, faults=[Fault(on="info", status=429, retry_after="3600")])):
        started = time.monotonic()
        with pytest.raises(DownloadError, match="asks to wait 3600 s, more than"):
            _fetch("step10", tmp_path / "work", retry_budget_s=60)
    assert time.monotonic() - started < 10


def test_an_error_without_a_message_is_named_by_its_type() -> None:
    """``str(error).splitlines()[0]`` raised IndexError on these in the error path."""
    assert describe(ConnectionError()) == "ConnectionError"
    with pytest.raises(RetriesExhausted, match=r"\(ConnectionError\)"):
        Retrier(budget_s=0, say=lambda m: None).failed(ConnectionError(), "a try")


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after({"Retry-After": "120"}) == 120
    later = retry_after({"Retry-After": formatdate(time.time() + 90, usegmt=True)})
    assert 85 <= later <= 91
    assert retry_after({"ratelimit": '"api";r=0;t=55'}) == 55
    assert retry_after({}) is None


# ---------------------------------------------------------------------------------------------
# Faults that no retry mends


def test_a_config_only_branch_and_a_missing_revision_are_unavailable(repo, use, tmp_path) -> None:
    with use(FakeHub(REPO, repo)) as hub:
        with pytest.raises(RevisionUnavailable, match="step60 of org/steps has no weights file"):
            _fetch("step60", tmp_path / "work")
        with pytest.raises(RevisionUnavailable, match="no such revision"):
            _fetch("step70", tmp_path / "work")
    assert not any(r.kind == "file" for r, _, _ in hub.served)
    assert not (tmp_path / "work").exists()  # nothing made for a revision that cannot be probed


def test_a_file_that_404s_makes_the_revision_unavailable_without_retries(repo, use,
                                                                        tmp_path) -> None:
    with use(FakeHub(REPO, repo, faults=[Fault(on="file", status=404)])) as hub:
        with pytest.raises(RevisionUnavailable, match="HTTP 404"):
            _fetch("step10", tmp_path / "work")
    assert sum(1 for r, _, _ in hub.served if r.kind == "file") == 1


@pytest.mark.parametrize("token", [None, "hf_fake"])
def test_a_gated_repository_names_the_token_and_the_licence_page(token, repo, use, tmp_path,
                                                                monkeypatch) -> None:
    with use(FakeHub(REPO, repo, gated=True)) as hub:
        if token:
            monkeypatch.setenv("HF_TOKEN", token)
        with pytest.raises(HubAccessError) as raised:
            _fetch("step10", tmp_path / "work")
    message = str(raised.value)
    assert f"HTTP {403 if token else 401}" in message
    assert "HF_TOKEN" in message and "hf auth login" in message
    assert f"https://huggingface.co/{REPO}" in message
    assert sum(1 for r, _, _ in hub.served if r.kind == "file") <= 1  # not retried


def test_a_full_disk_is_not_retried_and_names_work_dir(repo, use, tmp_path, monkeypatch) -> None:
    usage = SimpleNamespace(total=10**9, used=10**9 - 1000, free=1000)
    monkeypatch.setattr(downloads.shutil, "disk_usage", lambda path: usage)
    with use(FakeHub(REPO, repo)) as hub:
        with pytest.raises(OSError) as raised:
            _fetch("step10", tmp_path / "work")
    assert raised.value.errno == errno.ENOSPC and "work_dir=" in str(raised.value)
    assert not any(r.kind == "file" for r, _, _ in hub.served)


def test_a_quota_hit_while_writing_is_not_retried(repo, use, tmp_path, monkeypatch) -> None:
    real_open = open

    def over_quota(path, mode="r", *args, **kwargs):
        if str(path).endswith(".incomplete") and any(c in mode for c in "aw+"):
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", over_quota)
    with use(FakeHub(REPO, repo)) as hub:
        with pytest.raises(OSError) as raised:
            _fetch("step10", tmp_path / "work")
    assert raised.value.errno == errno.EDQUOT and "over its quota" in str(raised.value)
    assert "work_dir=" in str(raised.value)
    assert sum(1 for r, _, _ in hub.served if r.kind == "file") <= 1  # not retried


def _disk_fills(monkeypatch, suffix: str, *, after_bytes: int) -> None:
    """``open`` of a file whose name ends with `suffix` gives a handle whose writes raise ENOSPC
    once the file would pass `after_bytes`; every other file opens as usual."""
    real_open = open

    class Filling:
        def __init__(self, handle) -> None:
            self.handle = handle

        def write(self, data: bytes) -> int:
            if self.handle.tell() + len(data) > after_bytes:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.handle.write(data)

        def __getattr__(self, name: str):  # tell, seek, truncate: the file's own
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.handle.close()

    def filling(path, mode="r", *args, **kwargs):
        handle = real_open(path, mode, *args, **kwargs)
        return Filling(handle) if str(path).endswith(suffix) else handle

    monkeypatch.setattr("builtins.open", filling)


def test_a_disk_that_fills_mid_file_names_the_folder_and_its_free_space(repo, use, tmp_path,
                                                                        monkeypatch) -> None:
    """ENOSPC after part of a weights file was written: not retried, the message names the
    folder and the space left there, and the partial file stays for the same command to resume.
    Before: the message gave no free space."""
    _disk_fills(monkeypatch, "safetensors.incomplete", after_bytes=100_000)
    with use(FakeHub(REPO, repo)) as hub:  # writes of `CHUNK`: the first ones fit
        monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", CHUNK)
        with pytest.raises(OSError) as raised:
            _fetch("step10", tmp_path / "work")
    monkeypatch.undo()
    dest = download_dir(tmp_path / "work", tmp_path / "out", REPO, "step10")
    message = str(raised.value)
    assert raised.value.errno == errno.ENOSPC and str(dest) in message
    assert "GB free" in message and "work_dir=" in message and "resumes" in message
    assert 0 < (dest / "model.safetensors.incomplete").stat().st_size <= 100_000  # kept
    assert sum(1 for r, _, _ in hub.served if r.filename == "model.safetensors") == 1


# ---------------------------------------------------------------------------------------------
# Weights identity, formats, caches


def test_weights_hashes_tell_copies_from_steps(repo, use, tmp_path) -> None:
    """step50 serves step40's weights (as 86 of Pythia-2.8b's branches serve the final
    model's): same hash; hashes come from the hub's LFS metadata and equal the content's."""
    with use(FakeHub(REPO, repo)):
        got = {}
        for revision in ("step30", "step40", "step50"):
            files = _fetch(revision, tmp_path / "work")
            got[revision] = files.weights
            assert files.weights == {"model.safetensors": _sha256(files.path / "model.safetensors")}
            release(files)
    assert got["step40"] == got["step50"] != got["step30"]


def test_sharded_safetensors_and_bin_only_repositories(use, tmp_path) -> None:
    sharded = _revision(tmp_path / "sharded", 1, shards=3)
    # The .bin format's index too (its shards are not fetched: one format is enough).
    (sharded / "pytorch_model.bin.index.json").write_text(
        json.dumps({"weight_map": {"w": "pytorch_model-00001-of-00002.bin"}}))
    binary = _revision(tmp_path / "binary", 2, weights="bin")
    lacking = _revision(tmp_path / "lacking", 3, shards=2)
    (lacking / "model-00002-of-00002.safetensors").unlink()  # named by its index, not served
    with use(FakeHub(REPO, {"step1": sharded, "step2": binary, "step3": lacking})):
        with pytest.raises(RevisionUnavailable, match="model-00002-of-00002.safetensors"):
            _fetch("step3", tmp_path / "work")
        files = _fetch("step1", tmp_path / "work")
        shards = sorted(p.name for p in files.path.glob("*.safetensors"))
        assert sorted(files.weights) == shards and len(shards) == 3
        assert all(files.weights[s] == _sha256(sharded / s) for s in shards)
        release(files)
        files = _fetch("step2", tmp_path / "work")
        assert files.weights == {"pytorch_model.bin": _sha256(binary / "pytorch_model.bin")}
        release(files)


def test_a_cache_holding_one_shard_of_three_is_not_used(use, tmp_path) -> None:
    sharded = _revision(tmp_path / "sharded", 1, shards=3)
    with use(FakeHub(REPO, {"step1": sharded})) as hub:
        from huggingface_hub import snapshot_download

        snapshot_download(REPO, revision="step1", allow_patterns=[
            "config.json", "*.index.json", "model-00001-of-00003.safetensors"])
        files = _fetch("step1", tmp_path / "work")
        assert files.owned  # downloaded: the cache lacks two shards
        release(files)
        snapshot_download(REPO, revision="step1")  # now the cache has all three
        sent = hub.bytes_sent
        files = _fetch("step1", tmp_path / "work")
        assert not files.owned and hub.bytes_sent == sent
        assert files.weights == {s.name: _sha256(s) for s in sharded.glob("*.safetensors")}


def test_a_local_folder_is_hashed(tmp_path) -> None:
    folder = _revision(tmp_path / "local", 3)
    files = fetch_revision(str(folder), None, tmp_path / "work")
    assert not files.owned
    assert files.weights == {"model.safetensors": _sha256(folder / "model.safetensors")}


# ---------------------------------------------------------------------------------------------
# Ctrl-C


@pytest.mark.slow  # a subprocess
@pytest.mark.parametrize("delivered_to", ["process", "download thread"])
def test_ctrl_c_during_a_download_exits_without_waiting_for_it(delivered_to, repo,
                                                               tmp_path) -> None:
    """The trajectory loop waits for a revision that downloads for minutes; SIGINT ends the
    process within seconds (the thread pool joined the download before), and the partial file stays
    for the next run. The kernel hands a process's SIGINT to any of its threads: "download
    thread" sends it to the download's own (``signal.pthread_kill``), where an untimed wait in
    the main thread never woke to run the handler (a CI hang, seen twice)."""
    out = tmp_path / "out"
    part = download_dir(out / "work", out, REPO, "step10") / "model.safetensors.incomplete"
    code = textwrap.dedent(f"""
        import faulthandler, signal, threading, time
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # the stacks, if it hangs
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as in a terminal
        from types import SimpleNamespace
        from pathlib import Path
        import huggingface_hub.constants
        from repgeom.probes.run.trajectory import Trajectory
        huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE = 1024  # a write every 0.5 s (`CHUNK`)
        part = Path({str(part)!r})

        def interrupt_the_download():
            while not (part.exists() and part.stat().st_size):
                time.sleep(0.05)
            (download,) = [t for t in threading.enumerate() if t.name == "prefetch"]
            print("SIGINT sent", flush=True)
            signal.pthread_kill(download.ident, signal.SIGINT)

        if {delivered_to == "download thread"}:
            threading.Thread(target=interrupt_the_download, daemon=True).start()
        subject = SimpleNamespace(name={REPO!r}, revision="step10", step=10, source="hf",
                                  reference=False, model={REPO!r}, stack=None, path="")
        Trajectory(request=None, device=None, output_dir=Path({str(out)!r})).run([subject])
    """)
    with FakeHub(REPO, repo, bytes_per_second=2_000) as hub:  # 150 s for the weights
        env = subprocess_env(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf_home"))
        env.pop("HF_HUB_OFFLINE", None)
        # The child sets Python's SIGINT handler itself (code above), as a terminal gives it: a
        # pytest worker can leave SIGINT ignored, and a child inheriting SIG_IGN never raises
        # KeyboardInterrupt (Python installs its handler only over SIG_DFL).
        process = subprocess.Popen([PYTHON, "-c", code], env=env, stderr=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (part.exists() and part.stat().st_size):
            time.sleep(0.05)
        assert part.exists(), process.stderr.read() if process.poll() is not None else ""
        if delivered_to == "process":
            process.send_signal(signal.SIGINT)
        sent = time.monotonic()
        try:
            _, stderr = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGUSR1)
            time.sleep(2)
            process.kill()
            pytest.fail("no exit 30 s after SIGINT; its threads:\n" + process.communicate()[1])
        took = time.monotonic() - sent
    # 5 s on a quiet machine; 20 s leaves room for a loaded CI machine and still fails a process
    # that waits for the download (150 s) or its thread pool's join.
    assert took < 20, f"{took:.1f} s"
    assert process.returncode != 0 and "KeyboardInterrupt" in stderr
    assert part.stat().st_size > 0  # kept: the next run resumes it


# ---------------------------------------------------------------------------------------------
# As a user runs it


@pytest.mark.slow  # probe.py against the stand-in hub
def test_probe_py_rides_out_the_hubs_faults_in_a_users_work_dir(tiny_hf_folder, tiny_text,
                                                                tmp_path) -> None:
    """``work_dir=`` a folder of the user's, and a hub that answers 500 to the listing, 429 to
    a file list and cuts a download: every revision is probed, the console says why it waited,
    and the user's files (and a folder named like a revision) are still there."""
    from cli_runs import run_probe_py

    from repgeom.probes.core import table

    folders = {f"step{s}": tiny_hf_folder("gpt2") for s in (10, 20, 30)}
    user = tmp_path / "mine"
    for path in ("mydata/table.csv", ".git/HEAD", "step20/notes.txt"):
        (user / path).parent.mkdir(parents=True, exist_ok=True)
        (user / path).write_text("the user's")
    text = tmp_path / "text.txt"
    text.write_text(tiny_text * 3)
    out = tmp_path / "out"
    faults = [Fault(on="refs", status=500),  # step20: not one a first look at the model reads
              Fault(on="info", status=429, retry_after="1", revision="step20"),
              Fault(on="file", filename="model.safetensors", cut_after=1000, revision="step20")]
    with FakeHub(REPO, folders, faults=faults) as hub:
        done = run_probe_py(
            [f"hf={REPO}", "hf_revisions=all", f"text_file={text}", "window=32", "n_states=64",
             "settings.state_batch_size=64", "settings.max_order=8",
             "settings.distributions=false", "metrics=[anisotropy]", "plot_metrics=[]",
             "device=cpu", f"work_dir={user}", f"hydra.run.dir={out}"],
            HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf_home"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(table.read_table(out)["step"].unique()) == [10, 20, 30]
    size = (Path(folders["step20"]) / "model.safetensors").stat().st_size
    waits = [line for line in done.stderr.splitlines() if line.startswith("waiting ")]
    assert len(waits) == 3, done.stderr[-3000:]
    assert "HTTP 500" in waits[0] and "HTTP 429" in waits[1] and "peer closed" in waits[2]
    assert [n for r, _, n in hub.served if r.filename == "model.safetensors"
            and r.revision == "step20"] == [1000, size - 1000]  # the cut kept its 1000 bytes,
    # though huggingface_hub reads in chunks of 10 MiB (`repgeom.models.hub.calls._cut_kept`)
    kept = sorted(str(p.relative_to(user)) for p in user.rglob("*"))
    assert kept == [".git", ".git/HEAD", "mydata", "mydata/table.csv", "step20",
                    "step20/notes.txt"]


def test_a_wrapped_http_error_is_judged_by_its_cause(repo, use, monkeypatch) -> None:
    """``hf_hub_download`` raises a 503 of its HEAD request as ``LocalEntryNotFoundError`` (from
    the HTTP error) and transformers wraps that in an OSError: the retry policy reads the HTTP
    error underneath, so the model's config read rides out the hub's faults too."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    from repgeom.models.hf.loading import model_stacks
    from repgeom.models.hub import calls as hub_calls

    # huggingface_hub tries a HEAD 6 times itself. The config read (one GET per try, through
    # repgeom's retry policy) waits once after a 503 and reads it. No real sleeping.
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    faults = [Fault(on="head", filename="config.json", status=503, times=100)]
    with use(FakeHub(REPO, repo, faults=faults)) as hub:
        try:
            from huggingface_hub import hf_hub_download

            hf_hub_download(REPO, "config.json", revision="step10")
        except LocalEntryNotFoundError as wrapped:
            error = wrapped
        assert hub_calls.status_of(error) == 503 and hub_calls.transient(error)
        assert hub_calls.status_of(OSError("no cause")) is None
        heads = [status for r, status, _ in hub.served if r.kind == "head"]
        faults[0].times = 0  # the HEADs answer again
        hub.add_fault(Fault(on="file", filename="config.json", status=503, times=1))
        assert list(model_stacks(REPO, revision="step10")) == [None]
        gets = [status for r, status, _ in hub.served if r.kind == "file"]
    assert len(heads) > 1 and set(heads) == {503}  # huggingface_hub's own tries
    assert gets == [503, 200]  # ours: one 503, a wait, the config


# ---------------------------------------------------------------------------------------------
# Issue 32: every hub call bounded, every weights file proved


TIMEOUT_S = 1  # an int: huggingface_hub reads these settings with int()
"""The read and connect timeouts of the tests against a silent hub: they wait out this, not the
default's 20 s."""


def _short_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each hub call waits `TIMEOUT_S` for a silent hub, through the settings a user sets."""
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", str(TIMEOUT_S))
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", str(TIMEOUT_S))


def _in_thread(call, limit_s: float):
    """Run `call()` on a daemon thread; (finished, its result or error, seconds taken)."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = call()
        except BaseException as error:  # noqa: BLE001 - handed to the test
            out["value"] = error

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    return not thread.is_alive(), out.get("value"), time.monotonic() - started


@pytest.mark.slow
def test_a_hub_that_never_answers_ends_the_listing_and_the_download_within_the_budget(
        repo, use, tmp_path, monkeypatch) -> None:
    """A hub that accepts the connection and never answers (a half-open connection through a
    proxy): each call fails its try within the read timeout (here ``HF_HUB_DOWNLOAD_TIMEOUT``,
    1 s, rather than waiting out the default's 20 s), and the run ends by itself within the
    budget, naming the hub and the command to rerun. Before: ``list_repo_refs`` had no timeout
    and waited for ever."""
    budget = 5.0
    _short_timeouts(monkeypatch)
    said: list[str] = []
    with use(FakeHub(REPO, repo, silent=True)) as hub:
        listing = _in_thread(lambda: revisions.list_refs(
            REPO, retry=Retrier(budget_s=budget, say=said.append)), budget + 60)
        download = _in_thread(lambda: _fetch("step10", tmp_path / "work", retry_budget_s=budget,
                                             say=said.append), budget + 60)
    for finished, error, seconds in (listing, download):
        assert finished, "still waiting on a hub that never answers"
        assert seconds < budget + 2 * TIMEOUT_S + 5  # + the last try, + 5 s for a loaded machine
        assert isinstance(error, OSError | DownloadError), error
        assert hub.url in str(error) and "rerun the same command" in str(error)
        assert "timeout" in str(error).lower()


def test_the_timeouts_are_huggingface_hubs_settings_read_at_each_call(monkeypatch) -> None:
    """``HF_HUB_DOWNLOAD_TIMEOUT`` bounds each read and ``HF_HUB_ETAG_TIMEOUT`` the connection,
    as a user sets them for huggingface_hub, read at each call (huggingface_hub's ``constants``
    read them once, at import) and given by the session's hooks to every request of a try,
    those that pass no timeout (``list_repo_refs``) included; unset (or not a positive
    number), each read waits 20 s, under 30 s so that the console speaks within 30 s of a stall.
    Outside a try the library's requests are left as they are."""
    from huggingface_hub.utils import get_session

    from repgeom.models.hub import calls

    def bounds(retrier: Retrier | None) -> tuple:
        with retrier.attempt("a test") if retrier else contextlib.nullcontext():
            session = get_session()  # the one the library uses now (the hooks made it anew)
            request = session.build_request("GET", "http://127.0.0.1:9/x", timeout=None)
            for hook in session.event_hooks["request"]:
                hook(request)
        timeout = request.extensions["timeout"]
        return timeout["read"], timeout["connect"]

    for variable in ("HF_HUB_DOWNLOAD_TIMEOUT", "HF_HUB_ETAG_TIMEOUT"):
        monkeypatch.delenv(variable, raising=False)
    assert bounds(Retrier()) == (calls.READ_TIMEOUT_S, calls.CONNECT_TIMEOUT_S) == (20.0, 10.0)
    assert bounds(None) == (None, None)  # not ours: as huggingface_hub made it
    _short_timeouts(monkeypatch)
    assert bounds(Retrier()) == (TIMEOUT_S, TIMEOUT_S)
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "-3")
    assert calls.timeout().read == calls.READ_TIMEOUT_S


def test_a_proxy_that_ignores_range_and_cuts_at_the_same_byte_ends_within_the_budget(
        repo, use, tmp_path) -> None:
    """Bytes thrown away are not progress: a proxy that answers every resumed request with the
    whole file from byte 0 and cuts it at the same byte leaves the partial file as it was, so
    each try costs the budget and the back-off grows. Before: every try counted as progress (77
    whole transfers in 82 s with retry_budget_s=60), for ever."""
    cut = Fault(on="file", filename="model.safetensors", cut_after=100_000, times=float("inf"))
    abort = threading.Event()
    with use(FakeHub(REPO, repo, faults=[cut], ignore_range=True)) as hub:
        timer = threading.Timer(30, abort.set)  # the old code loops until this
        timer.start()
        finished, error, seconds = _in_thread(lambda: _fetch(
            "step20", tmp_path / "work", retry_budget_s=1.0, first_wait_s=0.05, abort=abort), 40)
        timer.cancel()
    tries = sum(1 for r, _, _ in hub.served if r.filename == "model.safetensors")
    assert finished and isinstance(error, DownloadError), error
    assert "retry_budget_s=" in str(error)
    assert seconds < 1.0 + 10  # the budget, plus the tries' own short seconds
    # No progress, so the back-off doubles: waits of at least 0.025 * 2**k s fit 1 s 5 times
    # (sum 0.775 s). Before, each try counted as progress: the wait restarted at ~0.04 s, ~27
    # whole transfers in the same budget.
    assert tries <= 7
    part = download_dir(tmp_path / "work", tmp_path / "out", REPO, "step20")
    kept = 100_000  # a cut keeps every byte that arrived, though http_get reads 10 MiB chunks
    assert (part / "model.safetensors.incomplete").stat().st_size == kept  # kept, resumable


def test_a_branch_moved_between_a_kill_and_the_rerun_is_fetched_again(repo, use,
                                                                      tmp_path) -> None:
    """A finished file is trusted by its hash, never by its size: the branch moved to weights
    of the same size, and the rerun fetches them again and says so. Before: the old bytes were
    kept and labelled with the new sha256."""
    moved = _revision(tmp_path / "moved", 99)
    said: list[str] = []
    with use(FakeHub(REPO, dict(repo))) as hub:
        files = _fetch("step10", tmp_path / "work")
        files.lock.close()  # killed after the download, before its release
        new_commit = hub.move("step10", moved)
        files = _fetch("step10", tmp_path / "work", say=said.append)
    content = _sha256(files.path / "model.safetensors")
    assert content == _sha256(moved / "model.safetensors") != _sha256(
        repo["step10"] / "model.safetensors")
    assert files.weights == {"model.safetensors": content}
    assert json.loads((files.path / MARKER).read_text())["commit"] == new_commit
    assert any("moved" in m and new_commit[:12] in m for m in said), said
    release(files)


def test_a_branch_is_resolved_on_the_hub_before_the_cache_is_used(repo, use, tmp_path) -> None:
    """Online, the cache is read at the commit the hub names now, not at the cache's stale ref.
    Before: `_cached` read the cache's ref of step10 and probed the old weights."""
    moved = _revision(tmp_path / "moved", 98)
    with use(FakeHub(REPO, dict(repo))) as hub:
        from huggingface_hub import snapshot_download

        snapshot_download(REPO, revision="step10")  # the cache's ref: the old commit
        hub.move("step10", moved)
        files = _fetch("step10", tmp_path / "work")
    assert files.owned  # downloaded: the cache holds another commit
    assert _sha256(files.path / "model.safetensors") == _sha256(moved / "model.safetensors")
    release(files)


def _trainer_revision(folder: Path, seed: int) -> Path:
    """A revision pushed by the Hugging Face Trainer: ``.bin`` weights beside its state files,
    which are the same bytes in every revision of the run."""
    _revision(folder, seed, weights="bin")
    (folder / "training_args.bin").write_bytes(b"args" * 100)
    (folder / "optimizer.bin").write_bytes(b"adam" * 1000)
    (folder / "trainer_state.json").write_text("{}")
    return folder


def test_training_state_files_of_trainer_pushed_revisions_are_not_weights(use,
                                                                           tmp_path) -> None:
    """Before: training_args.bin and optimizer.bin counted as weights, were downloaded, and
    every two revisions were warned about as sharing weights files (780 warnings for 40)."""
    folders = {f"checkpoint-{s}": _trainer_revision(tmp_path / f"c{s}", s) for s in (1, 2, 3)}
    weights = {}
    with use(FakeHub(REPO, folders)) as hub:
        for revision in folders:
            files = _fetch(revision, tmp_path / "work")
            weights[revision] = files.weights
            release(files)
    assert all(set(w) == {"pytorch_model.bin"} for w in weights.values())
    assert not {f for _, f in hub.downloads()} & {"training_args.bin", "optimizer.bin"}
    assert copies(weights) == ({}, {})


def test_bin_only_and_safetensors_revisions_of_the_same_weights_are_one_checkpoint(
        use, tmp_path) -> None:
    """``main`` holds the last step's ``.bin`` and the bot's safetensors conversion of it: the
    same checkpoint, compared on the format both have, so `hf_revisions=all` does not probe it
    as one more step and the trajectory marks it a copy. Before: safetensors against ``.bin``,
    never equal."""
    last = _revision(tmp_path / "last", 5, weights="bin")
    main = _revision(tmp_path / "main", 5, weights="bin")
    (main / "model.safetensors").write_bytes(b"converted" * 1000)
    folders = {"step1": _revision(tmp_path / "s1", 1, weights="bin"), "step2": last,
               "main": main}
    with use(FakeHub(REPO, folders)):
        listing = revisions.step_revisions(REPO)
        fetched = {}
        for revision in ("step2", "main"):
            files = _fetch(revision, tmp_path / "work")
            fetched[revision] = files.weights
            release(files)
    assert [name for _, name in listing.found] == ["step1", "step2"] and not listing.final_main
    assert "main" in listing.ignored["main: the weights of step2"]
    assert "model.safetensors" in fetched["main"]  # loaded: safetensors over .bin
    assert copies(fetched)[0] == {"step2": "main"}


def test_consolidated_and_sharded_safetensors_are_resolved_by_the_index(use, tmp_path) -> None:
    """A revision holding both a consolidated file and the shards its index names: only the
    shards are fetched. Before: both."""
    both = _revision(tmp_path / "both", 7, shards=2)
    (both / "model.safetensors").write_bytes(b"consolidated" * 1000)
    with use(FakeHub(REPO, {"step1": both})) as hub:
        files = _fetch("step1", tmp_path / "work")
    assert sorted(files.weights) == ["model-00001-of-00002.safetensors",
                                     "model-00002-of-00002.safetensors"]
    assert "model.safetensors" not in {f for _, f in hub.downloads()}
    release(files)


def test_offline_with_main_cached_lists_and_fetches_without_the_network(repo, use, tmp_path,
                                                                        monkeypatch) -> None:
    """Before: `_add_main` called ``model_info`` and crashed with ``OfflineModeIsEnabled``."""
    folders = {"step10": repo["step10"], "step20": repo["step20"], "main": repo["step30"]}
    with use(FakeHub(REPO, folders)):
        from huggingface_hub import snapshot_download

        for revision in folders:
            snapshot_download(REPO, revision=revision)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # hub gone too
    listing = revisions.step_revisions(REPO)
    assert [name for _, name in listing.found] == ["step10", "step20", "main"]
    said: list[str] = []
    files = _fetch("main", tmp_path / "work", say=said.append)
    assert not files.owned
    assert files.weights == {"model.safetensors": _sha256(repo["step30"] / "model.safetensors")}
    assert any("offline" in m and "cache" in m for m in said), said


def test_a_404_on_one_shard_deletes_only_unfinished_partials(use, tmp_path) -> None:
    """Before: the whole revision folder was deleted, finished shards and kept downloads too."""
    sharded = _revision(tmp_path / "sharded", 4, shards=3)
    faults = [Fault(on="file", filename="model-00002-of-00003.safetensors", cut_after=10_000),
              Fault(on="file", filename="model-00003-of-00003.safetensors", status=404)]
    work = tmp_path / "work"
    with use(FakeHub(REPO, {"step1": sharded}, faults=faults)):
        with pytest.raises(RevisionUnavailable, match="HTTP 404"):
            _fetch("step1", work, keep_weights=True)
    folder = download_dir(work, tmp_path / "out", REPO, "step1")
    assert {p.name for p in folder.glob("*.safetensors")} == {
        "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors"}
    assert not list(folder.glob("*.incomplete"))
    assert (folder / MARKER).is_file()


def test_keep_weights_is_recorded_and_honoured_by_later_runs(repo, use, tmp_path) -> None:
    """Before: a rerun without keep_weights deleted the revisions an earlier run kept."""
    work, owner = tmp_path / "work", tmp_path / "out"
    with use(FakeHub(REPO, repo)):
        files = _fetch("step10", work, keep_weights=True)
        release(files, keep=True)
        assert json.loads((files.path / MARKER).read_text())["keep_weights"] is True
        assert clear_leftovers(work, owner) == []  # a later run's clean-up
        files = _fetch("step10", work)  # a later run without keep_weights
        assert json.loads((files.path / MARKER).read_text())["keep_weights"] is True
        release(files)
    assert (files.path / "model.safetensors").is_file()


# ---------------------------------------------------------------------------------------------
# Review of issue 32 (r32)

def test_more_bytes_than_the_hub_lists_are_thrown_away_and_cost_the_budget(repo, use,
                                                                           tmp_path) -> None:
    """A CDN that sends more bytes than the listing's size: the partial file is thrown away
    each time, so no try is progress and the back-off grows. Before: the grown partial counted
    as progress (no budget spent, back-off restarted) and was deleted at the next try: dozens of
    whole transfers within a 1 s budget."""
    with use(FakeHub(REPO, repo, extra_bytes=10)) as hub:
        finished, error, _ = _in_thread(lambda: _fetch(
            "step20", tmp_path / "work", retry_budget_s=1.0, first_wait_s=0.05), 40)
    tries = sum(1 for r, _, _ in hub.served if r.kind == "file")
    assert finished and isinstance(error, DownloadError), error
    assert "retry_budget_s=" in str(error)
    assert tries <= 7  # a doubling back-off from 0.025 s fits 1 s about 5 times (before: 29)


def test_offline_a_file_missing_from_the_cache_fails_at_once_without_retries(repo, use,
                                                                            monkeypatch) -> None:
    """Offline, ``hf_hub_download`` raises ``LocalEntryNotFoundError`` *from*
    ``OfflineModeIsEnabled`` (a ``ConnectionError``): no retry can mend it. Before: the cause
    made it look like a dropped connection, and the config download of `model_stacks` (the
    first call of ``probe.py hf=... hf_revisions=...``) backed off for the whole 15-minute
    budget while offline."""
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    from repgeom.models.hf import model_stacks
    from repgeom.models.hub.calls import transient

    wrapped = LocalEntryNotFoundError("not in the cache")
    wrapped.__cause__ = OfflineModeIsEnabled("offline")
    assert not transient(wrapped)
    with use(FakeHub(REPO, repo)) as hub:
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        finished, error, seconds = _in_thread(lambda: model_stacks(REPO, revision="step10"), 20)
    assert finished, "offline, still retrying a file the cache lacks"
    assert isinstance(error, OSError), error
    assert hub.requests == []  # nothing asked the network


@pytest.mark.slow  # tries of TIMEOUT_S against a silent hub for 2 s
def test_the_config_of_model_stacks_is_fetched_within_the_runs_budget(repo, use,
                                                                      monkeypatch) -> None:
    """`model_stacks` (the config ``probe.py hf=... hf_revisions=...`` reads first) spends the
    run's ``retry_budget_s``, and its end names the hub and the option. Before: a fresh
    ``Retrier()`` with the 15-minute default, whatever ``retry_budget_s`` said."""
    from repgeom.models.hf import model_stacks

    _short_timeouts(monkeypatch)

    with use(FakeHub(REPO, repo, silent=True)) as hub:
        finished, error, seconds = _in_thread(
            lambda: model_stacks(REPO, revision="step10", retry_budget_s=2.0), 60)
    assert finished, "the config download ignored retry_budget_s"
    assert isinstance(error, OSError), error
    assert hub.url in str(error) and "retry_budget_s=" in str(error)
    assert seconds < 2.0 + 2 * TIMEOUT_S + 5  # the budget, the last try, a loaded machine


def test_a_proved_file_cut_short_by_a_crash_is_fetched_again(repo, use, tmp_path) -> None:
    """A node that crashes after the rename can leave a renamed file short (its bytes were
    never flushed) beside a proof that was: the proof names the hub's sha256, and a file of
    another size cannot hold it. Before: the recorded proof alone was trusted, and the rerun
    probed an empty weights file."""
    with use(FakeHub(REPO, repo)):
        files = _fetch("step10", tmp_path / "work")
        files.lock.close()  # the node crashed: no release
        (files.path / "model.safetensors").write_bytes(b"")  # what the crash left
        files = _fetch("step10", tmp_path / "work")
    assert _sha256(files.path / "model.safetensors") == _sha256(
        repo["step10"] / "model.safetensors")
    release(files)


# ---------------------------------------------------------------------------------------------
# Issue 32's leftovers: a hub tokenizer inside the budget, a 206 from the wrong byte


_PROBE_ARGS = ["window=32", "n_states=64", "settings.state_batch_size=64", "settings.max_order=8",
               "settings.distributions=false", "metrics=[anisotropy]", "plot_metrics=[]",
               "device=cpu"]


def test_a_hub_tokenizer_is_fetched_by_huggingface_hub_into_the_cache_within_the_budget(
        use, tiny_hf_folder, tiny_text, tmp_path, monkeypatch) -> None:
    """``tokenizer=org/name``: its file list (once), then its configs and tokenizer files, each
    by one ``hf_hub_download`` (one HEAD and one GET) at the listed commit, and one HEAD by the
    branch's name for its ref, all inside the run's retry budget (`Retrier.call`), into the
    user's Hugging Face cache; the weights are not fetched, and the temporary folder repgeom
    made is gone. Before (issue 48): repgeom's own GETs into a temporary folder, then copied
    into the cache by hand."""
    import tempfile

    from transformers import AutoTokenizer

    from repgeom.models.hf import load_hf_model

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    folder = tiny_hf_folder("gpt2")
    with use(FakeHub("org/tok", {"main": folder})) as hub:
        loaded = load_hf_model(tiny_hf_folder("gpt2", tokenizer=False), tokenizer="org/tok",
                               retry_budget_s=5.0)
    reference = AutoTokenizer.from_pretrained(folder)
    assert loaded.tokenizer(tiny_text)["input_ids"] == reference(tiny_text)["input_ids"]
    kinds = [request.kind for request, _, _ in hub.served]
    fetched = {name for _, name in hub.downloads()}
    assert kinds.count("info") == 1 and kinds.count("file") == len(fetched), kinds
    assert kinds.count("head") == len(fetched) + 1, kinds  # no retry of the library's own
    assert "tokenizer.json" in fetched and "model.safetensors" not in fetched
    snapshot = (Path(huggingface_hub.constants.HF_HUB_CACHE) / "models--org--tok" / "snapshots"
                / hub.commit("main"))
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(fetched)
    assert not list(temporary.glob("repgeom-*"))  # the folder repgeom made is gone again


def test_offline_a_hub_tokenizer_is_read_from_the_cache_without_the_network(
        use, tiny_hf_folder, tiny_text, monkeypatch) -> None:
    """``HF_HUB_OFFLINE=1``: a hub tokenizer in the user's Hugging Face cache is read from
    there, and nothing asks the network (a guard: the base code did so too)."""
    from huggingface_hub import snapshot_download

    from repgeom.models.hf import load_tokenizer_or_explain

    folder = tiny_hf_folder("gpt2")
    with use(FakeHub("org/tok", {"main": folder})) as hub:
        snapshot_download("org/tok", revision="main")  # the user had it before
        asked = len(hub.requests)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        tokenizer = load_tokenizer_or_explain(tiny_hf_folder("gpt2", tokenizer=False),
                                              "org/tok", retry_budget_s=5.0)
    assert len(hub.requests) == asked  # nothing asked of the network
    assert len(tokenizer(tiny_text)["input_ids"]) > 0


@pytest.mark.slow  # probe.py twice, one against a silent hub
def test_probe_py_with_a_hub_tokenizer_ends_by_itself_when_the_hub_never_answers(
        tiny_hf_folder, tiny_text, tmp_path) -> None:
    """``probe.py hf=<folder without tokenizer> tokenizer=org/name`` against a hub that accepts
    the connection and never answers: a try ends at the read timeout, the console says what it
    waits for, and the run ends by itself within ``retry_budget_s`` plus 60 s, naming the hub and
    the command to rerun; with the hub answering, the same command probes. Before: the
    tokenizer's HEAD was retried by huggingface_hub, silently, outside the budget (the run did
    not end within the bound: ``subprocess.TimeoutExpired``)."""
    from cli_runs import run_probe_py

    from repgeom.probes.core import table

    budget = 6  # tries of TIMEOUT_S (HF_HUB_DOWNLOAD_TIMEOUT below), so several, with waits
    text = tmp_path / "text.txt"
    text.write_text(tiny_text * 3)
    args = [f"hf={tiny_hf_folder('gpt2', tokenizer=False)}", "tokenizer=org/tok",
            f"retry_budget_s={budget}", f"text_file={text}", *_PROBE_ARGS]
    env = {"HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_DOWNLOAD_TIMEOUT": str(TIMEOUT_S),
           "HF_HUB_ETAG_TIMEOUT": str(TIMEOUT_S)}
    # The bound: the budget, plus 60 s for the last try's read timeout and the run's own start
    # and end, plus 120 s for starting Python and its imports on a loaded 2-core machine (they
    # took over a minute there); a wait outside the budget, as before, goes on for minutes.
    bound = budget + 60 + 120
    with FakeHub("org/tok", {"main": tiny_hf_folder("gpt2")}, silent=True) as hub:
        started = time.monotonic()
        try:
            done = run_probe_py([*args, f"hydra.run.dir={tmp_path / 'silent'}"],
                                timeout=bound, HF_ENDPOINT=hub.url, **env)
        except subprocess.TimeoutExpired:
            pytest.fail(f"probe.py still waited on a silent hub after {bound} s")
    seconds = time.monotonic() - started
    assert done.returncode != 0
    assert hub.url in done.stderr and "rerun the same command" in done.stderr, done.stderr[-3000:]
    assert "tokenizer='org/tok'" in done.stderr
    assert any(line.startswith("waiting ") for line in done.stderr.splitlines())  # said why
    assert seconds < bound

    with FakeHub("org/tok", {"main": tiny_hf_folder("gpt2")}) as hub:
        done = run_probe_py([*args, f"hydra.run.dir={tmp_path / 'out'}"], timeout=300,
                            HF_ENDPOINT=hub.url, **env)
    assert done.returncode == 0, done.stderr[-3000:]
    probed = table.read_table(tmp_path / "out")
    assert set(table.layer_rows(probed)["metric"]) == {"anisotropy"}  # beside the loss rows


@pytest.mark.parametrize("answered_from", [0, 50_000])
def test_a_206_from_another_byte_than_asked_is_never_appended(answered_from, repo, use,
                                                              tmp_path, monkeypatch) -> None:
    """A proxy answers ``Range: bytes=100000-`` with a 206 from another byte (its
    ``Content-Range`` says so). From byte 0 it is the whole file, which replaces the partial one;
    from any other byte the try fails, no progress, and the file is asked for whole. The file
    here has no hash nor size to check it by (proved by its commit alone), so a cut keeps the
    whole chunks that arrived (`CHUNK`), not every byte. Before: the bytes were appended, and
    the wrong file (100000 bytes longer, or 50000) was accepted."""
    from repgeom.models.hub.transfer import HubFile, Transfer, download_file

    cut = Fault(on="file", filename="model.safetensors", cut_after=100_000)
    said: list[str] = []
    dest = tmp_path / "dest"
    dest.mkdir()
    kept = 100_000 // CHUNK * CHUNK
    with use(FakeHub(REPO, repo, faults=[cut], wrong_range_start=answered_from)) as hub:
        monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", CHUNK)
        download_file(f"{hub.url}/{REPO}/resolve/step10/model.safetensors",
                      HubFile("model.safetensors", size=None, sha256=None), dest, "commit",
                      Retrier(first_wait_s=0.01, say=said.append), Transfer(), "step10")
    assert _sha256(dest / "model.safetensors") == _sha256(repo["step10"] / "model.safetensors")
    starts = [r.range_start for r, _, _ in hub.served if r.filename == "model.safetensors"]
    if answered_from:
        assert starts == [0, kept, 0]  # the cut, the wrong 206, the whole
        assert "asking for the whole file" in said[-1]
    else:
        assert starts == [0, kept]  # the whole file came as the 206


def test_a_proxy_with_another_range_that_cuts_at_the_same_byte_ends_within_the_budget(
        repo, use, tmp_path) -> None:
    """A proxy answers a resumed request from another byte (so the file is asked for whole from
    then on) and cuts every transfer at the same byte: each try replaces the partial file with
    the same bytes, which is not progress, so the budget ends it. Before this was measured
    against the emptied file: every try counted as progress and the fetch looped until
    aborted (20 tries in 20 s with retry_budget_s=1)."""
    from repgeom.models.hub.transfer import HubFile, Transfer, download_file

    cut = Fault(on="file", filename="model.safetensors", cut_after=100_000, times=float("inf"))
    dest = tmp_path / "dest"
    dest.mkdir()
    abort = threading.Event()
    with use(FakeHub(REPO, repo, faults=[cut], wrong_range_start=50_000)) as hub:
        timer = threading.Timer(30, abort.set)  # the loop before ran until this
        timer.start()
        finished, error, seconds = _in_thread(lambda: download_file(
            f"{hub.url}/{REPO}/resolve/step10/model.safetensors",
            HubFile("model.safetensors", size=None, sha256=None), dest, "commit",
            Retrier(budget_s=1.0, first_wait_s=0.05, say=lambda m: None, abort=abort),
            Transfer(), "step10"), 40)
        timer.cancel()
    tries = sum(1 for r, _, _ in hub.served if r.filename == "model.safetensors")
    assert finished and isinstance(error, RetriesExhausted), error
    assert seconds < 1.0 + 10  # the budget, plus the tries' own short seconds
    assert tries <= 7  # the back-off doubles, as for any try that keeps nothing new


def test_a_206_from_byte_0_is_not_a_wasted_transfer(repo, use, tmp_path) -> None:
    """A file with a sha256: a 206 from byte 0 (the whole file) to a resumed request is kept
    as the file. Before: appended to the partial one, it passed the file's size, was thrown
    away, and the whole file was downloaded once more."""
    cut = Fault(on="file", filename="model.safetensors", cut_after=100_000, revision="step10")
    with use(FakeHub(REPO, repo, faults=[cut], wrong_range_start=0)) as hub:
        files = _fetch("step10", tmp_path / "work")
    assert _sha256(files.path / "model.safetensors") == _sha256(
        repo["step10"] / "model.safetensors")
    gets = [r for r, _, _ in hub.served if r.filename == "model.safetensors" and r.kind == "file"]
    assert len(gets) == 2  # the cut one and the whole file: nothing downloaded twice
    release(files)


@pytest.mark.slow  # probe.py against the stand-in hub
def test_a_hub_tokenizer_out_of_budget_ends_a_trajectory_and_skips_no_step(
        tiny_hf_folder, tiny_text, tmp_path) -> None:
    """``hf=org/name hf_revisions=[...] tokenizer=org/name`` and a hub whose file list of the
    tokenizer's revision (main) answers 503 for ever: the budget ends the run, naming the hub and
    the command to rerun, and no step is recorded as skipped (a rerun would leave it out).
    Before: each step was skipped as "its weights failed to load" and the run went on."""
    from cli_runs import run_probe_py

    from repgeom.probes.core import table

    folders = {name: tiny_hf_folder("gpt2") for name in ("main", "step10", "step20")}
    text = tmp_path / "text.txt"
    text.write_text(tiny_text * 3)
    out = tmp_path / "out"
    forever = Fault(on="info", revision="main", status=503, times=float("inf"))
    with FakeHub(REPO, folders, faults=[forever]) as hub:
        done = run_probe_py(
            [f"hf={REPO}", "hf_revisions=[step10,step20]", f"tokenizer={REPO}",
             "retry_budget_s=3", f"text_file={text}", *_PROBE_ARGS, f"hydra.run.dir={out}"],
            timeout=300, HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf_home"))
    assert done.returncode != 0
    assert hub.url in done.stderr and "rerun the same command" in done.stderr, done.stderr[-3000:]
    assert not (table.probe_dir(out) / "skipped.json").exists()


def test_a_hub_tokenizer_fetched_online_is_found_offline_and_not_fetched_twice(
        use, tiny_hf_folder, tiny_text, monkeypatch) -> None:
    """``tokenizer=org/name`` (or a hub model's own tokenizer in compare mode and the analyses):
    the proved files are added to the user's Hugging Face cache, so that a later load asks the
    hub for its file list only, and a rerun with ``HF_HUB_OFFLINE=1`` (the hub gone) reads them
    from there, as it did when ``AutoTokenizer.from_pretrained(<hub name>)`` cached them. Before:
    kept only in a temporary folder, fetched anew by every load, and offline not found (the
    offline load built a tokenizer without vocabulary)."""
    from huggingface_hub import scan_cache_dir

    from repgeom.models.hf import load_tokenizer_or_explain

    bare = tiny_hf_folder("gpt2", tokenizer=False)
    with use(FakeHub("org/tok", {"main": tiny_hf_folder("gpt2")})) as hub:
        online = load_tokenizer_or_explain(bare, "org/tok", retry_budget_s=5.0)
        load_tokenizer_or_explain(bare, "org/tok", retry_budget_s=5.0)  # a second revision's
    fetched = [r.filename for r, _, _ in hub.served if r.kind == "file"]
    assert fetched.count("tokenizer.json") == 1  # the second load found it in the cache
    cache = scan_cache_dir(huggingface_hub.constants.HF_HUB_CACHE)  # read by huggingface_hub
    assert [r.repo_id for r in cache.repos] == ["org/tok"] and not cache.warnings
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    offline = load_tokenizer_or_explain(bare, "org/tok")
    assert offline(tiny_text)["input_ids"] == online(tiny_text)["input_ids"]


def test_a_hub_tokenizer_loads_when_the_cache_cannot_be_written(
        use, tiny_hf_folder, tiny_text, tmp_path, monkeypatch, capsys) -> None:
    """A Hugging Face cache that cannot be written (here its path runs through a file, which
    stops root as well as anyone; a read-only or a colleague's cache is refused the same way):
    ``hf_hub_download`` fetches the files into repgeom's temporary folder instead
    (``local_dir=``), the tokenizer is loaded from there, and the console says that an offline
    rerun will not find them. Nothing is written where the cache should be."""
    from repgeom.models.hf import load_tokenizer_or_explain

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache's folder should be")
    with use(FakeHub("org/tok", {"main": tiny_hf_folder("gpt2")})) as hub:
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(blocker / "hub"))
        tokenizer = load_tokenizer_or_explain(tiny_hf_folder("gpt2", tokenizer=False), "org/tok",
                                              retry_budget_s=5.0)
    assert len(tokenizer(tiny_text)["input_ids"]) > 0
    said = capsys.readouterr().err
    assert "an offline rerun (HF_HUB_OFFLINE=1) will not find them" in said
    assert str(blocker / "hub") in said and "repgeom-tokenizer-" in said
    assert blocker.read_text() == "a file where the cache's folder should be"
    assert "tokenizer.json" in {name for _, name in hub.downloads()}


def test_a_hub_tokenizer_leaves_the_trainers_state_on_the_hub(
        use, tiny_hf_folder, tmp_path) -> None:
    """A revision pushed by the Trainer holds ``trainer_state.json`` (its log history: megabytes
    over a long run), which ``*.json`` matches: not a config or tokenizer file, so fetched
    neither for a hub tokenizer nor with a revision's files
    (`repgeom.models.weights_rule.TRAINING_STATE`). Before: fetched with both."""
    import shutil

    from repgeom.models.hf import load_tokenizer_or_explain

    folder = tmp_path / "pushed"
    shutil.copytree(tiny_hf_folder("gpt2"), folder)
    (folder / "trainer_state.json").write_text('{"log_history": []}')
    with use(FakeHub("org/tok", {"main": folder})) as hub:
        load_tokenizer_or_explain(tiny_hf_folder("gpt2", tokenizer=False), "org/tok",
                                  retry_budget_s=5.0)
        files = fetch_revision("org/tok", "main", tmp_path / "work", say=lambda m: None)
    fetched = {name for _, name in hub.downloads()}
    assert "tokenizer.json" in fetched and "model.safetensors" in fetched
    assert "trainer_state.json" not in fetched
    release(files)


def test_a_gated_hub_tokenizer_is_named_as_a_revision_is(use, tiny_hf_folder) -> None:
    """``tokenizer=org/gated`` and a hub that answers 401 for its files: `HubAccessError`,
    naming ``HF_TOKEN`` and the licence page, as for a revision's files."""
    from repgeom.models.hf import load_tokenizer_or_explain
    from repgeom.models.hub.calls import HubAccessError

    with use(FakeHub("org/gated", {"main": tiny_hf_folder("gpt2")}, gated=True)), \
            pytest.raises(HubAccessError, match="HF_TOKEN") as raised:
        load_tokenizer_or_explain(tiny_hf_folder("gpt2", tokenizer=False), "org/gated",
                                  retry_budget_s=5.0)
    assert "https://huggingface.co/org/gated" in str(raised.value)


def _failing_subject(revision: str, step: int, error: BaseException) -> SimpleNamespace:
    def load(device):
        raise OSError(f"could not load tokenizer='org/tok': {error}") from error

    return SimpleNamespace(name="org/tok", revision=revision, step=step, source="local",
                           reference=False, model="org/tok", stack=None, path="", load=load)


@pytest.mark.parametrize("error", [
    RetriesExhausted("tokenizer='org/tok': no answer", None),
    HubAccessError("tokenizer='org/tok': the hub refuses it (HTTP 401) ... HF_TOKEN"),
    OSError(errno.ENOSPC, "No space left on device"),
], ids=["silent", "refused", "disk-full"])
def test_a_load_fault_of_no_revision_ends_a_trajectory_and_skips_no_step(error,
                                                                          tmp_path) -> None:
    """While a step loads, a fault that every later step would meet too and that a rerun may
    not (the hub's silence, its refusal of a hub tokenizer, a full disk) ends the run, and no
    step is recorded as skipped (a rerun would leave it out). Before: only the hub's silence
    did; a refused tokenizer or a full disk skipped every step "for good"."""
    import torch

    out = tmp_path / "out"
    subjects = [_failing_subject(f"step{s}", s, error) for s in (10, 20)]
    with pytest.raises(OSError):
        Trajectory(request=None, device=torch.device("cpu"), output_dir=out).run(subjects)
    assert not (out / "probes" / "skipped.json").exists()


def test_a_load_fault_of_one_revision_skips_that_step(tmp_path) -> None:
    """The counterpart: weights that fail to load (a revision's own fault) skip the step and
    the trajectory goes on."""
    import torch

    out = tmp_path / "out"
    subjects = [_failing_subject(f"step{s}", s, ValueError("bad shard")) for s in (10, 20)]
    Trajectory(request=None, device=torch.device("cpu"), output_dir=out).run(subjects)
    assert set(json.loads((out / "probes" / "skipped.json").read_text())) == {"step10",
                                                                              "step20"}


@pytest.mark.slow  # probe.py twice against the stand-in hub
def test_probe_py_compare_on_a_hub_model_runs_again_offline(tiny_hf_folder, tmp_path) -> None:
    """``probe.py hf=org/name compare.text_a=... compare.text_b=...`` online, then the same
    command with ``HF_HUB_OFFLINE=1`` and the hub gone: the second run reads the model and its
    tokenizer from the Hugging Face cache and gives the same per-layer cosines (same files, same
    CPU, same process code: equal to float32 rounding). Before (6e90828): the tokenizer was kept
    in a temporary folder only, and offline the run failed ("the tokenizer has no vocabulary")."""
    import pandas as pd
    from cli_runs import run_probe_py

    args = ["hf=org/name", "compare.text_a=the quick brown fox", "compare.text_b=a lazy dog",
            "device=cpu", "plot_metrics=[]"]
    env = {"HF_HOME": str(tmp_path / "hf_home")}
    with FakeHub("org/name", {"main": tiny_hf_folder("gpt2")}) as hub:
        online = run_probe_py([*args, f"hydra.run.dir={tmp_path / 'online'}"], timeout=300,
                              HF_ENDPOINT=hub.url, **env)
        url = hub.url
    assert online.returncode == 0, online.stderr[-3000:]
    offline = run_probe_py([*args, f"hydra.run.dir={tmp_path / 'offline'}"], timeout=300,
                           HF_ENDPOINT=url, HF_HUB_OFFLINE="1", **env)
    assert offline.returncode == 0, offline.stderr[-3000:]
    tables = [pd.read_csv(tmp_path / run / "compare" / "pooled_cosine.csv")
              for run in ("online", "offline")]
    pd.testing.assert_frame_equal(tables[0], tables[1], rtol=1e-6)


def test_a_full_disk_while_a_hub_tokenizer_downloads_names_the_folder_and_tmpdir(
        use, tiny_hf_folder, monkeypatch, capsys) -> None:
    """ENOSPC while ``hf_hub_download`` writes a hub tokenizer's file, in the Hugging Face cache
    (then repgeom fetches into its temporary folder instead and says so) and in that folder too:
    the error keeps its errno (a trajectory ends on it) and names the folder and ``TMPDIR=``.
    Before: "could not load tokenizer ... from the Hugging Face hub", blaming the hub."""
    import pathlib

    from repgeom.models.hf import load_tokenizer_or_explain

    real_open = pathlib.Path.open

    class Full:
        """A file whose every write finds the disk full."""

        def __init__(self, handle) -> None:
            self.handle = handle

        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name: str):
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.handle.close()

    def filling(self, mode="r", *args, **kwargs):  # huggingface_hub writes a download so
        handle = real_open(self, mode, *args, **kwargs)
        return Full(handle) if self.name.endswith(".incomplete") else handle

    with use(FakeHub("org/tok", {"main": tiny_hf_folder("gpt2")})):
        monkeypatch.setattr(pathlib.Path, "open", filling)
        with pytest.raises(OSError) as raised:
            load_tokenizer_or_explain(tiny_hf_folder("gpt2", tokenizer=False), "org/tok",
                                      retry_budget_s=5.0)
        monkeypatch.undo()
    assert raised.value.errno == errno.ENOSPC
    assert "repgeom-tokenizer-" in str(raised.value) and "TMPDIR=" in str(raised.value)
    assert "could not add its files to the Hugging Face cache" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# huggingface_hub's own retries, under the run's budget (the review of issue 48's change)


def test_a_request_asked_twice_in_one_try_is_the_librarys_retry_and_ends_it() -> None:
    """Within one try, distinct requests (a HEAD, then the GET of the same file, a redirect to
    another URL) go out; the same method and URL again is huggingface_hub retrying on its own
    (``http_get`` resumes after a cut, a second apart, for ever while bytes arrive;
    ``http_backoff`` after a timeout): `LibraryRetry` ends the try for the retrier to decide. A
    new try, or a request outside any try, goes out as the library makes it."""
    from huggingface_hub.utils import get_session

    from repgeom.models.hub.calls import LibraryRetry

    def send(method: str, url: str) -> None:
        session = get_session()  # the one the library uses now (the hooks made it anew)
        request = session.build_request(method, url)
        for hook in session.event_hooks["request"]:
            hook(request)

    retrier = Retrier()
    with retrier.attempt("a test"):
        send("HEAD", "http://127.0.0.1:9/a")
        send("GET", "http://127.0.0.1:9/a")
        send("GET", "http://127.0.0.1:9/cdn/a")
        with pytest.raises(LibraryRetry, match="asked again on its own for GET"):
            send("GET", "http://127.0.0.1:9/a")
    with retrier.attempt("the next try"):
        send("GET", "http://127.0.0.1:9/a")
    send("GET", "http://127.0.0.1:9/a")  # outside a try: not ours to judge


def test_a_budget_of_0_still_tries_each_call_once(repo, use, tiny_hf_folder, tmp_path) -> None:
    """``retry_budget_s=0`` means no retries, not no tries: a healthy hub serves a revision, a
    config and a tokenizer. Before the review: the hooks refused the first request of every
    try, the budget being spent."""
    from repgeom.models.hub.config_files import fetch_config, fetch_tokenizer_files

    with use(FakeHub(REPO, {**repo, "main": tiny_hf_folder("gpt2")})):
        files = _fetch("step10", tmp_path / "work", retry_budget_s=0)
        config = fetch_config(REPO, "main", str(tmp_path / "c"), 0)
        tokenizer = fetch_tokenizer_files(REPO, "main", str(tmp_path / "t"), 0)
    assert _sha256(files.path / "model.safetensors") == _sha256(
        repo["step10"] / "model.safetensors")
    assert (Path(config) / "config.json").is_file()
    assert (Path(tokenizer) / "tokenizer.json").is_file()
    release(files)


def test_a_refused_connection_ends_a_config_fetch_within_the_budget(use, tmp_path,
                                                                     capsys) -> None:
    """Nothing listens: huggingface_hub's ``http_backoff`` closes its session after a refused
    connection and retries on a new one (5 times, up to 8 s apart), which had none of the
    hooks, so its waits were silent and outside the budget (23 s on a 5 s budget, 125 s when
    the hub then answered 429 with ``Retry-After: 30``). Now every session the library makes has
    them: the retrier waits, says so, and ends within the budget."""
    import socket

    from repgeom.models.hub.config_files import fetch_config

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    use(SimpleNamespace(url=f"http://127.0.0.1:{port}"))
    started = time.monotonic()
    with pytest.raises(OSError, match="retry_budget_s="):
        fetch_config(REPO, "main", str(tmp_path / "c"), 5.0)
    assert time.monotonic() - started < 5.0 + 5  # the budget, + a loaded machine
    assert "waiting " in capsys.readouterr().err


def test_a_body_that_ends_early_but_cleanly_is_resumed(tmp_path) -> None:
    """A proxy's close-delimited answer (no ``Content-Length``) cut at 100 kB ends without an
    error from the connection: huggingface_hub's ``http_get`` raises its "Consistency check
    failed" ``OSError``, which no retry mended (the fetch ended, advising ``force_download``).
    Now it is a cut like any other: the try after it resumes from the byte kept."""
    import socket

    from repgeom.models.hub.transfer import HubFile, Transfer, download_file

    data = bytes(range(256)) * 1000
    starts: list[int] = []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            with connection:
                request = b""
                while b"\r\n\r\n" not in request:
                    request += connection.recv(65536)
                asked = [line for line in request.decode().split("\r\n")
                         if line.lower().startswith("range:")]
                start = int(asked[0].split("=")[1].split("-")[0]) if asked else 0
                starts.append(start)
                if len(starts) == 1:  # close-delimited, cut cleanly
                    connection.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
                                       + data[:100_000])
                    continue
                body = data[start:]
                head = (f"HTTP/1.1 206 Partial\r\nContent-Length: {len(body)}\r\nContent-Range: "
                        f"bytes {start}-{len(data) - 1}/{len(data)}\r\nConnection: close\r\n\r\n")
                connection.sendall(head.encode() + body)

    threading.Thread(target=serve, daemon=True).start()
    said: list[str] = []
    file = HubFile("model.safetensors", len(data), hashlib.sha256(data).hexdigest())
    try:
        download_file(f"http://127.0.0.1:{server.getsockname()[1]}/model.safetensors", file,
                          tmp_path, "c" * 40, Retrier(budget_s=30, first_wait_s=0.01,
                                                      say=said.append), Transfer(), "a test")
    finally:
        server.close()
    assert (tmp_path / "model.safetensors").read_bytes() == data
    assert starts[0] == 0 and 0 < starts[1] <= 100_000  # resumed where the partial file ends
    assert "bytes arrived" in said[0]


def test_a_429_on_a_configs_head_waits_its_retry_after(repo, use, tmp_path) -> None:
    """``hf_hub_download`` answered 429 (``Retry-After: 1``) on its HEAD asks again at once, on
    its own; that second HEAD ends the try, named by the 429 it follows, so the retrier waits
    the second the hub asked for, and says so. Before the review: the 429 was lost with the
    library's retry, and the waits were the back-off's, unrelated to what the hub asked."""
    from repgeom.models.hub.config_files import fetch_config

    said: list[str] = []
    limited = Fault(on="head", status=429, retry_after="1", times=2)
    with use(FakeHub(REPO, repo, faults=[limited])) as hub:
        retrier = Retrier(budget_s=30, first_wait_s=0.01, say=said.append)
        with contextlib.ExitStack() as stack:
            stack.enter_context(pytest.MonkeyPatch.context()).setattr(
                "repgeom.models.hub.config_files.budget_retrier", lambda budget: retrier)
            folder = fetch_config(REPO, "step10", str(tmp_path / "c"), 30.0)
    assert (Path(folder) / "config.json").is_file()
    assert [round(w) for w in retrier.waits] == [1, 1]  # the hub's Retry-After, each time
    assert all("HTTP 429" in line for line in said), said
    heads = [r for r, status, _ in hub.served if r.kind == "head"]
    assert len(heads) == 3  # a HEAD per try: the library's own second HEAD never went out
