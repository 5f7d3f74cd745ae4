"""Files that repgeom fetched itself, added to the user's Hugging Face cache so that an offline
rerun finds them there.

A hub tokenizer's files are fetched with repgeom's own bounded, proved GETs
(`repgeom.models.hub.config_files.fetch_tokenizer_files`), not with ``hf_hub_download``, whose HEAD
requests huggingface_hub retries by itself, silently, outside any budget. Before that,
``AutoTokenizer.from_pretrained(<hub name>)`` left them in the cache, and a rerun with
``HF_HUB_OFFLINE=1`` read them from there; so the proved files are added to the cache in the
layout huggingface_hub reads (https://huggingface.co/docs/huggingface_hub/guides/manage-cache):
``models--org--name/snapshots/<commit>/<file>`` (a plain file, as huggingface_hub itself writes
where symlinks are not available) and ``refs/<branch>`` naming the commit.

A cache is often shared by a group (one ``HF_HOME`` on a cluster), so repgeom writes into it as
huggingface_hub does:

- each file is written whole or not at all (`repgeom.files.atomic_write_bytes`), through a
  temporary file in ``blobs/`` (named ``.<name>.<random>.tmp``, which huggingface_hub's
  ``scan_cache_dir`` never reads: it reads every file under ``snapshots/`` and ``refs/``, and only
  ``*.incomplete`` in ``blobs/``), so a kill leaves nothing that the scan lists;
- a new file gets the mode the umask gives, as huggingface_hub's own (0664 under umask 002),
  never mkstemp's 0600, which locked the group out;
- a ref is written only when it names another commit, and then replaced whole by a rename, as
  huggingface_hub 2.4's ``_cache_commit_hash_for_specific_revision`` does: a new file with the
  umask's mode (0664 under a group's umask 002), whatever the mode (0444 included) or owner of
  the ref it replaces (`tests/models/hub/test_cache_shared.py` compares with
  ``hf_hub_download``'s own writes on the stand-in hub); its temporary file is in ``blobs/``,
  not beside the ref as huggingface_hub's, so that a kill leaves nothing the cache scan reads;
- no file in the cache is deleted, and a file the cache already holds at that commit is kept as
  it is. A cache folder this user may not write (another user's, read-only) is reported
  (`PermissionError` naming it and the fix), never forced, whatever this process's privileges
  (root included).

What huggingface_hub lacks: a way to add files that were fetched and proved elsewhere (within
one retry budget) to its cache; its ``hf_hub_download`` fetches them itself, with HEAD retries of
its own outside any budget.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from repgeom.files import atomic_write_bytes, atomic_write_text

_FIX = ("leave it as it is for its owner, and give repgeom a cache of its own "
        "(HF_HUB_CACHE=<a folder you can write>), or ask the owner to make it group-writable")


def cached_commit(repo: str, commit: str, names: list[str]) -> Path | None:
    """The cache's snapshot folder of hub model `repo` at `commit` when it holds every file of
    `names` (top-level names), else None."""
    from huggingface_hub import try_to_load_from_cache

    found = [try_to_load_from_cache(repo, name, revision=commit) for name in names]
    if not names or not all(isinstance(path, str) for path in found):
        return None
    return Path(found[0]).parent


def may_write(path: Path) -> bool:
    """Whether this user may write `path` (a file or folder that exists): `os.access`, and for
    root the permission bits as well, so that root never overrides another user's file."""
    if not os.access(path, os.W_OK):
        return False
    if os.geteuid() != 0:
        return True
    info = path.stat()
    if info.st_uid == 0:
        return bool(info.st_mode & stat.S_IWUSR)
    if info.st_gid in os.getgroups() or info.st_gid == os.getegid():
        return bool(info.st_mode & stat.S_IWGRP)
    return bool(info.st_mode & stat.S_IWOTH)


def _owner(path: Path) -> str:
    info = path.stat()
    try:
        import pwd

        name = pwd.getpwuid(info.st_uid).pw_name
    except (ImportError, KeyError):
        name = str(info.st_uid)
    return f"owned by {name}, mode {stat.S_IMODE(info.st_mode):04o}"


def _check_writable(folder: Path) -> None:
    """A `PermissionError` naming `folder` (or the nearest existing folder above it) unless this
    user may write there."""
    existing = folder
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not may_write(existing):
        raise PermissionError(
            errno.EACCES, f"the Hugging Face cache folder {existing} is not writable by you "
            f"({_owner(existing)}); nothing was added to it. To keep the files for an offline "
            f"rerun, {_FIX}")


def _prepare(*folders: Path) -> None:
    """Make `folders` (checked first: `_check_writable`)."""
    for folder in folders:
        _check_writable(folder)
        folder.mkdir(parents=True, exist_ok=True)


def add_to_cache(repo: str, revision: str | None, commit: str, folder: Path,
                 names: list[str]) -> Path:
    """Add the files `names` of `folder` (proved files of hub model `repo` at `commit`) to the
    Hugging Face cache, and the ref `revision` -> `commit` when `revision` is a branch or tag
    (only if it names another commit); returns the cache's snapshot folder of `commit`.

    Raises
    ------
    PermissionError
        A cache folder is not writable by this user (another user's, read-only): named, with
        the fix; nothing of theirs is changed.
    OSError
        The cache cannot be written (read-only file system, full disk, quota): what is written
        by then is whole.
    """
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    storage = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model")
    snapshot = storage / "snapshots" / commit
    blobs = storage / "blobs"  # the temporary files: out of the scan's sight
    missing = [name for name in names if not os.path.exists(snapshot / name)]
    if missing:  # a cache that holds them all is not written at all
        _prepare(snapshot, blobs)
    for name in missing:
        atomic_write_bytes(snapshot / name, (folder / name).read_bytes(), tmp_dir=blobs)
    if revision is not None and revision != commit:
        ref = storage / "refs" / revision
        try:
            current = ref.read_text().strip()
        except (FileNotFoundError, NotADirectoryError):
            current = None
        if current != commit:  # replaced whole, as huggingface_hub 2.4 replaces a ref
            _prepare(ref.parent, blobs)
            atomic_write_text(ref, commit, tmp_dir=blobs)
    return snapshot
