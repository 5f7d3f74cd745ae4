"""A Hugging Face cache shared by a group (`repgeom.models.hub.cache`): what repgeom adds
gets the mode huggingface_hub gives its own files (the umask's), an unchanged ref is not
rewritten, a kill leaves nothing where huggingface_hub's cache scan reads, and a cache or a
file this user may not write is reported, never forced (issue 38, hole 1)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import textwrap
from pathlib import Path

import huggingface_hub.constants
import pytest
from cli_runs import PYTHON, ROOT, subprocess_env

from repgeom.files import atomic_write_bytes
from repgeom.models.hub import cache as hub_cache

REPO = "org/tok"
COMMIT = "a" * 40
FILES = {"tokenizer.json": b'{"model": {}}', "config.json": b'{"model_type": "gpt2"}'}
OTHER_USER = 65534  # "nobody": a colleague's files in the group's cache


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    root = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(root))
    return root


@pytest.fixture
def fetched(tmp_path) -> Path:
    folder = tmp_path / "fetched"
    folder.mkdir()
    for name, data in FILES.items():
        (folder / name).write_bytes(data)
    return folder


@pytest.fixture
def umask():
    """Set the process umask for one test (and restore it)."""
    old = os.umask(0o022)
    os.umask(old)

    def set_to(value: int) -> None:
        os.umask(value)

    yield set_to
    os.umask(old)


def _storage(cache: Path) -> Path:
    return cache / "models--org--tok"


def _give_away(path: Path, mode: int) -> None:
    """Make `path` another user's, with `mode` (needs root; skipped elsewhere)."""
    try:
        os.chown(path, OTHER_USER, OTHER_USER)
    except PermissionError:
        pytest.skip("giving a file to another user needs root")
    path.chmod(mode)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o002, 0o022])
def test_files_and_refs_added_to_the_cache_get_the_mode_the_umask_gives(
        cache, fetched, umask, mask) -> None:
    # huggingface_hub's own files get the umask's mode (0664 under the umask 002 of a group
    # cache); repgeom's mkstemp gave 0600, and a colleague then got "Permission denied".
    umask(mask)
    snapshot = hub_cache.add_to_cache(REPO, "main", COMMIT, fetched, list(FILES))
    expected = 0o666 & ~mask
    assert _mode(_storage(cache) / "refs" / "main") == expected
    for name in FILES:
        assert _mode(snapshot / name) == expected, name


def test_the_atomic_writer_takes_a_mode(tmp_path, umask) -> None:
    umask(0o022)
    atomic_write_bytes(tmp_path / "default", b"x")
    atomic_write_bytes(tmp_path / "given", b"x", mode=0o640)
    assert _mode(tmp_path / "default") == 0o644  # what open() gives under this umask
    assert _mode(tmp_path / "given") == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["default", "given"]


def test_an_unchanged_ref_is_not_rewritten(cache, fetched) -> None:
    hub_cache.add_to_cache(REPO, "main", COMMIT, fetched, list(FILES))
    ref = _storage(cache) / "refs" / "main"
    before = ref.stat()
    hub_cache.add_to_cache(REPO, "main", COMMIT, fetched, list(FILES))
    after = ref.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    hub_cache.add_to_cache(REPO, "main", "b" * 40, fetched, list(FILES))  # the branch moved
    assert ref.read_text() == "b" * 40


def test_a_write_killed_midway_leaves_nothing_the_cache_scan_reads(cache, fetched) -> None:
    # kill -9 at the rename of the first file: huggingface_hub's scan must list no temporary
    # file as a file of the revision (or as a ref), then a rerun completes the cache.
    code = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        import huggingface_hub.constants
        huggingface_hub.constants.HF_HUB_CACHE = {str(cache)!r}
        from repgeom.models.hub import cache as hub_cache
        os.replace = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
        hub_cache.add_to_cache({REPO!r}, "main", {COMMIT!r}, Path({str(fetched)!r}),
                               {list(FILES)!r})
    """)
    done = subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=subprocess_env(PYTHONPATH=str(ROOT / "src")))
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    from huggingface_hub import scan_cache_dir

    scanned = scan_cache_dir(str(cache))
    listed = [f.file_name for repo in scanned.repos for rev in repo.revisions for f in rev.files]
    assert listed == [] and not scanned.warnings, listed
    for part in ("snapshots", "refs"):
        assert not [p for p in (_storage(cache) / part).rglob("*") if p.is_file()], part
    hub_cache.add_to_cache(REPO, "main", COMMIT, fetched, list(FILES))
    rescanned = scan_cache_dir(str(cache))
    files = sorted(f.file_name for r in rescanned.repos for v in r.revisions for f in v.files)
    assert files == sorted(FILES) and not rescanned.warnings


def test_a_ref_this_user_may_not_write_is_reported_and_left_as_it_is(cache, fetched) -> None:
    # A colleague's refs/main (0644, theirs) names another commit: repgeom says so and leaves
    # it; it never replaces another user's file it may not write (root included).
    hub_cache.add_to_cache(REPO, "main", "b" * 40, fetched, list(FILES))
    ref = _storage(cache) / "refs" / "main"
    _give_away(ref, 0o644)
    with pytest.raises(PermissionError, match=r"refs/main.*not writable by you.*left as it is"):
        hub_cache.add_to_cache(REPO, "main", COMMIT, fetched, list(FILES))
    assert ref.read_text() == "b" * 40 and ref.stat().st_uid == OTHER_USER


def test_a_cache_this_user_may_not_write_is_reported(cache, fetched) -> None:
    cache.mkdir()
    _give_away(cache, 0o755)
    with pytest.raises(PermissionError, match=r"Hugging Face cache .* not writable by you.*"
                                              r"HF_HUB_CACHE"):
        hub_cache.add_to_cache(REPO, "main", COMMIT, fetched, list(FILES))
    assert list(cache.iterdir()) == []


def test_a_ref_that_moves_keeps_its_mode_and_its_owner(cache, fetched, umask) -> None:
    # A colleague's group-writable refs/main (0664, theirs) names another commit: repgeom
    # rewrote it by a rename, so it became repgeom's own and took this umask's 0644, and the
    # colleague could no longer update it. It is rewritten in place, as huggingface_hub does.
    umask(0o002)
    hub_cache.add_to_cache(REPO, "main", "b" * 40, fetched, list(FILES))
    ref = _storage(cache) / "refs" / "main"
    umask(0o022)
    hub_cache.add_to_cache(REPO, "main", "c" * 40, fetched, list(FILES))
    assert ref.read_text() == "c" * 40 and _mode(ref) == 0o664
    try:  # a colleague's ref, in this user's group (the group of a shared cache)
        os.chown(ref, OTHER_USER, os.getegid())
    except PermissionError:
        return  # giving a file to another user needs root; the mode was checked above
    ref.chmod(0o664)
    hub_cache.add_to_cache(REPO, "main", COMMIT, fetched, list(FILES))
    info = ref.stat()
    assert ref.read_text() == COMMIT
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (OTHER_USER, 0o664)
