"""A Hugging Face cache shared by a group (`repgeom.models.hub.cache`): what repgeom adds
gets the mode huggingface_hub gives its own files (the umask's), a ref is replaced as
huggingface_hub replaces it (issue 48), an unchanged ref is not rewritten, a kill leaves nothing
where huggingface_hub's cache scan reads, and a cache folder this user may not write is
reported, never forced (issue 38, hole 1)."""

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


@pytest.mark.parametrize("before", ["none", "0644", "0444", "colleague"])
def test_refs_and_files_get_what_huggingface_hubs_own_download_gives(before, tmp_path, umask,
                                                                     monkeypatch) -> None:
    """Under a group's umask 002, on the stand-in hub, repgeom's tokenizer fetch and
    huggingface_hub's ``hf_hub_download`` leave the same ref (its commit, mode and owner) and
    files of the same mode, for a new ref and for one rewritten from another commit: 0644 (made
    under umask 022), read-only 0444, or a colleague's. Before (4b64431): the 0644 ref was
    rewritten in place and stayed 0644 (huggingface_hub 2.4 replaces it: 0664, the group may
    write it), and the 0444 and the colleague's refs raised PermissionError."""
    from hub_server import FakeHub
    from huggingface_hub import hf_hub_download

    from repgeom.models.hub.config_files import fetch_tokenizer_files

    revision = tmp_path / "revision"
    revision.mkdir()
    for name, data in FILES.items():
        (revision / name).write_bytes(data)
    umask(0o002)
    left = {}
    with FakeHub(REPO, {"main": revision}) as hub:
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            hub.url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        for who in ("huggingface_hub", "repgeom"):
            cache = tmp_path / who
            ref = _storage(cache) / "refs" / "main"
            if before != "none":
                ref.parent.mkdir(parents=True)
                ref.write_text("b" * 40)
                if before == "colleague":
                    _give_away(ref, 0o644)
                else:
                    ref.chmod(int(before, 8))
            monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
            if who == "huggingface_hub":
                for name in FILES:
                    hf_hub_download(REPO, name, revision="main", cache_dir=cache)
            else:
                (tmp_path / "fetched").mkdir()
                fetch_tokenizer_files(REPO, "main", str(tmp_path / "fetched"), 30.0)
            snapshot = _storage(cache) / "snapshots" / hub.commit("main")
            left[who] = (ref.read_text(), _mode(ref), ref.stat().st_uid,
                         {name: _mode(snapshot / name) for name in FILES})  # through links
    assert left["repgeom"] == left["huggingface_hub"]
    assert left["repgeom"][:3] == (hub.commit("main"), 0o664, os.geteuid())


def test_a_cache_this_user_may_not_write_is_reported(cache, fetched) -> None:
    cache.mkdir()
    _give_away(cache, 0o755)
    with pytest.raises(PermissionError, match=r"Hugging Face cache .* not writable by you.*"
                                              r"HF_HUB_CACHE"):
        hub_cache.add_to_cache(REPO, "main", COMMIT, fetched, list(FILES))
    assert list(cache.iterdir()) == []


def test_a_ref_that_moves_gets_the_mode_of_this_write(cache, fetched, umask) -> None:
    # A ref that names another commit is replaced whole, as huggingface_hub 2.4 replaces it
    # (``_cache_commit_hash_for_specific_revision``: a temporary file, then a rename): it takes
    # the umask of this write, not the mode of the ref it replaces.
    umask(0o022)
    hub_cache.add_to_cache(REPO, "main", "b" * 40, fetched, list(FILES))
    ref = _storage(cache) / "refs" / "main"
    assert _mode(ref) == 0o644
    umask(0o002)
    hub_cache.add_to_cache(REPO, "main", "c" * 40, fetched, list(FILES))
    assert ref.read_text() == "c" * 40 and _mode(ref) == 0o664
