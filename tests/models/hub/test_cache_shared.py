"""A Hugging Face cache shared by a group (one ``HF_HOME`` on a cluster), written by repgeom's
hub tokenizer fetch (`repgeom.models.hub.config_files.fetch_tokenizer_files`) exactly as
huggingface_hub's own ``hf_hub_download`` writes it (issue 48): on the stand-in hub, under a
group's umask 002, the same blobs, links, refs and folders, of the same modes, contents and
owners, for a new ref, for a ref rewritten after the branch moved, and for a ref that was
read-only (0444), made under umask 022 (0644) or a colleague's (another user's): the library
replaces it whole. What the cache held before is left as it was: nothing deleted.

Before: repgeom fetched the files itself and wrote them into the cache by hand
(``hub/cache.py``'s ``add_to_cache``: plain files, its own temporary files, its own refusals),
which the issue forbids: the user's cache is written only by huggingface_hub.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import huggingface_hub.constants
import pytest
from hub_server import FakeHub

REPO = "org/tok"
FILES = {"tokenizer.json": b'{"model": {}}', "config.json": b'{"model_type": "gpt2"}'}
MOVED = {"tokenizer.json": b'{"model": {"vocab": {}}}', "config.json": b'{"model_type": "gpt2"}'}
OTHER_COMMIT = "b" * 40
OTHER_USER = 65534  # "nobody": a colleague's files in the group's cache
SIDES = ("huggingface_hub", "repgeom")


def _revision(folder: Path, files: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    (folder / "model.safetensors").write_bytes(b"\0" * 64)  # weights: never fetched
    return folder


def _storage(cache: Path) -> Path:
    return cache / "models--org--tok"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _tree(cache: Path) -> dict[str, tuple]:
    """Every folder, file and link under `cache`, by path: its kind, mode and owner, and a
    file's content or a link's target."""
    found = {}
    for path in sorted(cache.rglob("*")):
        info = path.lstat()
        if path.is_symlink():
            what = ("link", os.readlink(path))
        elif path.is_dir():
            what = ("folder",)
        else:
            what = ("file", path.read_bytes())
        found[str(path.relative_to(cache))] = (*what, _mode(path), info.st_uid)
    return found


@pytest.fixture
def group_umask():
    """The umask of a group's shared cache (002) for one test, restored after."""
    old = os.umask(0o002)
    yield
    os.umask(old)


@pytest.fixture
def hub(monkeypatch, tmp_path, group_umask):
    """The stand-in hub serving `REPO` (``main``: `FILES`), huggingface_hub pointed at it."""
    with FakeHub(REPO, {"main": _revision(tmp_path / "main", FILES)}) as served:
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", served.url)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            served.url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield served


def _fetch(who: str, cache: Path, tmp_path: Path, monkeypatch) -> str:
    """Fetch `REPO`'s tokenizer files at ``main`` into `cache`: by ``hf_hub_download`` itself
    (file by file, as ``AutoTokenizer.from_pretrained`` does), or by repgeom; the folder."""
    from huggingface_hub import hf_hub_download

    from repgeom.models.hub.config_files import fetch_tokenizer_files

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    if who == "huggingface_hub":
        paths = [hf_hub_download(REPO, name, revision="main") for name in sorted(FILES)]
        return str(Path(paths[0]).parent)
    spare = tmp_path / f"spare-{len(list(tmp_path.glob('spare-*')))}"
    spare.mkdir()
    folder = fetch_tokenizer_files(REPO, "main", str(spare), 30.0)
    assert not any(spare.iterdir()), "the files went to the spare folder, not the cache"
    return folder


def _users_cache(cache: Path, before: str) -> dict[str, tuple]:
    """What the user's cache held before: another model's snapshot, and `REPO`'s ``main`` ref
    naming another commit (`before`: ``none``, ``0644``, ``0444`` or ``colleague``)."""
    other = cache / "models--org--other" / "snapshots" / OTHER_COMMIT
    other.mkdir(parents=True)
    (other / "config.json").write_text('{"theirs": true}')
    if before != "none":
        ref = _storage(cache) / "refs" / "main"
        ref.parent.mkdir(parents=True)
        ref.write_text(OTHER_COMMIT)
        if before == "colleague":
            try:
                os.chown(ref, OTHER_USER, OTHER_USER)
            except PermissionError:
                pytest.skip("giving a file to another user needs root")
            ref.chmod(0o644)
        else:
            ref.chmod(int(before, 8))
    return {path: entry for path, entry in _tree(cache).items() if "org--other" in path}


@pytest.mark.parametrize("before", ["none", "0644", "0444", "colleague"])
def test_the_cache_is_left_as_huggingface_hub_leaves_it(before, hub, tmp_path,
                                                        monkeypatch) -> None:
    """A new ref, or a ``main`` ref naming another commit (made under umask 022, read-only, or a
    colleague's): repgeom and ``hf_hub_download`` leave the same tree, the ref replaced whole
    (0664, this user's: the group may write it), the files readable by the group, and the other
    model's files as they were. Before (4b64431), repgeom's own writes left a 0644 ref 0644 and
    refused the 0444 and the colleague's refs."""
    from huggingface_hub import scan_cache_dir

    left, theirs, folders = {}, {}, {}
    for who in SIDES:
        cache = tmp_path / who
        theirs[who] = _users_cache(cache, before)
        folders[who] = _fetch(who, cache, tmp_path, monkeypatch)
        left[who] = _tree(cache)
    assert left["repgeom"] == left["huggingface_hub"]
    cache = tmp_path / "repgeom"
    ref = _storage(cache) / "refs" / "main"
    assert (ref.read_text(), _mode(ref), ref.stat().st_uid) == (hub.commit("main"), 0o664,
                                                                os.geteuid())
    snapshot = _storage(cache) / "snapshots" / hub.commit("main")
    assert folders["repgeom"] == str(snapshot)
    assert {name: (snapshot / name).read_bytes() for name in FILES} == FILES
    assert all(_mode(Path(os.path.realpath(snapshot / name))) == 0o664 for name in FILES)
    assert {p: e for p, e in left["repgeom"].items() if "org--other" in p} == theirs["repgeom"]
    scanned = scan_cache_dir(str(cache))
    assert not scanned.warnings
    mine = [r for r in scanned.repos if r.repo_id == REPO]
    assert [sorted(f.file_name for f in rev.files) for rev in mine[0].revisions] == [sorted(FILES)]
    assert [set(rev.refs) for rev in mine[0].revisions] == [{"main"}]


def test_a_branch_that_moved_rewrites_the_ref_as_huggingface_hub_does(hub, tmp_path,
                                                                     monkeypatch) -> None:
    """``main`` fetched, then moved on the hub to a new commit, then fetched again: both leave
    the old commit's snapshot as it was (nothing deleted), the new one beside it, and the ref
    replaced whole, naming the new commit; repgeom's tree is huggingface_hub's. A second fetch at
    an unchanged commit downloads nothing again."""
    first = hub.commit("main")
    for who in SIDES:
        _fetch(who, tmp_path / who, tmp_path, monkeypatch)
    kept = {who: _tree(tmp_path / who) for who in SIDES}
    before = sum(1 for request, _, _ in hub.served if request.kind == "file")
    _fetch("repgeom", tmp_path / "repgeom", tmp_path, monkeypatch)  # unchanged: from the cache
    assert sum(1 for request, _, _ in hub.served if request.kind == "file") == before
    assert _tree(tmp_path / "repgeom") == kept["repgeom"]

    moved = hub.move("main", _revision(tmp_path / "moved", MOVED))
    left = {}
    for who in SIDES:
        _fetch(who, tmp_path / who, tmp_path, monkeypatch)
        left[who] = _tree(tmp_path / who)
    assert left["repgeom"] == left["huggingface_hub"]
    storage = _storage(tmp_path / "repgeom")
    assert (storage / "refs" / "main").read_text() == moved != first
    assert _mode(storage / "refs" / "main") == 0o664
    assert {n: (storage / "snapshots" / moved / n).read_bytes() for n in MOVED} == MOVED
    assert {n: (storage / "snapshots" / first / n).read_bytes() for n in FILES} == FILES
    assert all(path in left["repgeom"] for path in kept["repgeom"])  # nothing deleted


def test_a_branch_that_moves_during_the_fetch_leaves_a_ref_to_a_complete_snapshot(
        hub, tmp_path, monkeypatch, capsys) -> None:
    """``main`` moves on the hub just as repgeom asks for it by name (for its ref), after its
    files were fetched at the listed commit: the library writes the ref to the new commit, and
    repgeom then fetches that commit's files too (its file list first), so that an offline
    rerun, resolving ``main`` through the ref, finds them all; the console says why."""
    from repgeom.models.hub.config_files import fetch_tokenizer_files

    moved_files = {**MOVED, "tokenizer_config.json": b"{}"}  # the new commit has one file more
    moved_folder = _revision(tmp_path / "moved", moved_files)
    heads, moved = [], []

    def move_at_the_ref(request):
        if request.kind == "head":
            heads.append(request)
            if len(heads) == len(FILES) + 1:  # each file at its commit, then main by name
                moved.append(hub.move("main", moved_folder))
        return None

    hub.hook = move_at_the_ref
    first = hub.commit("main")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    folder = fetch_tokenizer_files(REPO, "main", str(tmp_path), 30.0)
    storage = _storage(tmp_path / "cache")
    assert moved and (storage / "refs" / "main").read_text() == moved[0] != first
    assert folder == str(storage / "snapshots" / moved[0])
    assert {n: (Path(folder) / n).read_bytes() for n in moved_files} == moved_files
    assert f"revision main moved to commit {moved[0]}" in capsys.readouterr().err


def test_a_models_config_is_left_in_the_cache_as_huggingface_hub_leaves_it(
        hub, tmp_path, monkeypatch, capsys) -> None:
    """``probe.py hf=org/name`` reads the config first (`fetch_config`): the cache holds what
    ``hf_hub_download(..., "config.json")`` leaves, and the folder returned is its snapshot. A
    cache that cannot be written (its path runs through a file): the config is fetched into the
    caller's folder instead (``local_dir=``), and the console says so."""
    from huggingface_hub import hf_hub_download

    from repgeom.models.hub.config_files import fetch_config

    left = {}
    for who in SIDES:
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / who))
        if who == "huggingface_hub":
            hf_hub_download(REPO, "config.json", revision="main")
        else:
            spare = tmp_path / "spare"
            spare.mkdir()
            folder = fetch_config(REPO, None, str(spare), 30.0)
            assert not any(spare.iterdir())
        left[who] = _tree(tmp_path / who)
    assert left["repgeom"] == left["huggingface_hub"]
    assert folder == str(_storage(tmp_path / "repgeom") / "snapshots" / hub.commit("main"))

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(blocker / "hub"))
    local = tmp_path / "local"
    local.mkdir()
    assert fetch_config(REPO, "main", str(local), 30.0) == str(local)
    assert (local / "config.json").read_bytes() == FILES["config.json"]
    assert f"could not add its config to the Hugging Face cache ({blocker / 'hub'}" in \
        capsys.readouterr().err
