"""The folders repgeom downloads hub revisions into, and the only things it ever deletes there.

Downloads go only into ``<work_dir>/repgeom-downloads/<run key>/<org--name>/<revision>/``, where
the run key comes from the probe's output folder (`run_key`). Each such folder holds a marker,
``.repgeom-download.json`` (repo, revision, the commit its files are of, run, and whether
``keep_weights`` asked to keep it), the proof of each finished file (``.repgeom-files.json``:
the hub's sha256, git blob id or commit it was checked against), and a lock file held
(`repgeom.files.try_lock`) while the revision is downloaded and probed.

What is deleted, and when:

- `release`: a probed revision's folder, unless ``keep_weights`` is asked now or was recorded in
  its marker by an earlier run;
- `clear_leftovers`: marked folders of the same run, not locked, not still to be probed and not
  kept (the marker's ``keep_weights``);
- `delete_partials`: a revision that cannot be probed loses only its unfinished
  ``<file>.incomplete`` files; its finished files stay (a 404 on one shard does not delete the
  others);
- `claim`: when the marker's commit is not the commit the hub resolves now (a branch moved
  between a kill and the rerun), the old commit's files, which the console names.

Never a user's file, the cwd, the Hugging Face cache, nor the folders of another job that shares
``work_dir``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from repgeom.files import atomic_write_text, read_json, try_lock
from repgeom.models.hub.calls import DownloadError

DOWNLOADS = "repgeom-downloads"
"""The folder inside ``work_dir`` that holds repgeom's downloads, one folder per run."""
MARKER = ".repgeom-download.json"
"""The file that marks a revision's folder as repgeom's, naming its repo, revision and run."""
PROOFS = ".repgeom-files.json"
"""Each finished file's proof: the hash or commit it was checked against when it arrived."""
LOCK = ".repgeom-download.lock"
"""Locked (``flock``) while a process downloads or probes the revision in that folder."""
CLAIM_TRIES = 20
"""How often `claim` makes its folder again when other processes' clean-ups delete it."""
PARTIAL = ".incomplete"
"""The suffix of a file still downloading: kept when a try fails, resumed by the next."""


@dataclass(frozen=True)
class RevisionFiles:
    """Where one revision's files are and whether repgeom may delete them.

    path : a folder ``from_pretrained`` reads; owned : True in repgeom's download folder
    (deleted by `release` unless kept), False in the user's cache or a local folder; bytes :
    bytes received from the hub by this call, failed tries included (0 when nothing was
    downloaded); seconds : the time the files took to arrive; weights : each weights file's name
    -> its sha256 (hex), for every complete format of the revision
    (`repgeom.models.weights_rule`), the same for two revisions that serve the same weights.
    """

    path: Path
    owned: bool
    bytes: int = 0
    seconds: float = 0.0
    weights: dict[str, str] = field(default_factory=dict)
    lock: IO | None = field(default=None, repr=False, compare=False)
    """The open lock file of an owned folder, closed by `release`."""


def run_key(owner: str | os.PathLike) -> str:
    """The name of a run's download folder: the output folder's name and a hash of its absolute
    path, so that two runs sharing ``work_dir`` never share a folder and a rerun of the same
    command finds its own.

    >>> run_key("/tmp/runs/a") != run_key("/tmp/other/a")
    True
    """
    path = os.path.abspath(os.path.expanduser(str(owner)))
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", os.path.basename(path))[:40] or "run"
    return f"{name}-{hashlib.sha256(path.encode()).hexdigest()[:12]}"


def _safe(name: str) -> str:
    return str(name).replace("/", "--")


def download_dir(work_dir: str | os.PathLike, owner: str | os.PathLike, repo: str,
                 revision: str | None) -> Path:
    """``<work_dir>/repgeom-downloads/<run key>/<org--name>/<revision>``."""
    return (Path(work_dir).absolute() / DOWNLOADS / run_key(owner) / _safe(repo)
            / _safe(revision or "main"))  # absolute: the same folder if the cwd changes


def claim(dest: Path, record: dict[str, Any], say: Callable[[str], None]) -> IO:
    """Make `dest` (marker and lock) and lock it for this process.

    The marker keeps ``keep_weights`` once any run asked for it. When it names another commit
    than `record` (a branch that moved since the files were fetched), the old commit's files
    are deleted (the folder is marked: they are repgeom's) and `say` names both commits.
    """
    lock = dest / LOCK
    for _ in range(CLAIM_TRIES):
        try:
            dest.mkdir(parents=True, exist_ok=True)
        except (FileNotFoundError, FileExistsError):
            continue  # a parent, or the folder itself, removed by another clean-up meanwhile
        handle = try_lock(lock)  # made here if missing (O_CREAT); None: held, or the folder gone
        if handle is not None:
            break
        if lock.exists():  # held by a live process
            raise DownloadError(
                f"{dest} is in use by another repgeom process probing the same revision with "
                "the same output folder; wait for it to end, or give this run another "
                "hydra.run.dir")
    else:
        raise DownloadError(f"{dest} was deleted by other processes {CLAIM_TRIES} times while "
                            "it was being made; run again once the other jobs' clean-ups end")
    old = read_json(dest / MARKER)
    if old is not None and old.get("commit") and old.get("commit") != record.get("commit"):
        say(f"revision {record.get('revision')} of {record.get('repo')} moved on the hub from "
            f"commit {str(old['commit'])[:12]} to {str(record.get('commit'))[:12]} since its "
            f"files were fetched into {dest}: fetching it again")
        for path in dest.iterdir():
            if path.name not in (MARKER, LOCK):
                _remove(path)
    record = {**record, "keep_weights": bool(record.get("keep_weights"))
              or bool(old and old.get("keep_weights"))}
    atomic_write_text(dest / MARKER, json.dumps(record, indent=1))
    return handle


def record_proof(folder: Path, name: str, proof: str) -> None:
    """Record that `name` in `folder` was checked against `proof` before it took its name."""
    proofs = read_json(folder / PROOFS) or {}  # file name -> the proof it was accepted with
    atomic_write_text(folder / PROOFS, json.dumps({**proofs, name: proof}, indent=1))


def delete_partials(folder: Path) -> list[Path]:
    """Delete the unfinished ``*.incomplete`` files of `folder` (nothing else); returns them."""
    deleted = [path for path in _listed(folder) if path.name.endswith(PARTIAL)]
    for path in deleted:
        path.unlink(missing_ok=True)
    return deleted


def _delete(folder: Path) -> None:
    """Delete one of repgeom's marked revision folders, its marker and lock last: a kill at any
    moment leaves the folder still marked (the next run's `clear_leftovers` deletes the rest)
    or holding at most an empty lock file, never files without their marker, which no run would
    delete. (``shutil.rmtree`` went in listing order: killed after the marker, it left the
    weights behind for good.) A file that cannot be deleted keeps the folder marked, for a
    later clean-up to try again; a link or a folder that cannot be listed is left as it is.
    The lock goes after the marker: while it is held, a process of the same run cannot claim
    the folder and have its new marker deleted here."""
    try:
        if folder.is_symlink():
            return
        for path in list(folder.iterdir()):
            if path.name not in (MARKER, LOCK):
                with contextlib.suppress(OSError):
                    _remove(path)
        if any(path.name not in (MARKER, LOCK) for path in folder.iterdir()):
            return
        (folder / MARKER).unlink(missing_ok=True)
        (folder / LOCK).unlink(missing_ok=True)
        folder.rmdir()
    except OSError:
        return


def _remove(path: Path) -> None:
    """Remove a file, a link (not what it points to) or a folder with its contents."""
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def _remove_empty(folder: Path, stop: Path) -> None:
    """Remove `folder` and its parents up to (not including) `stop` while they are empty."""
    while folder != stop and stop in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def _listed(folder: Path) -> list[Path]:
    """The entries of `folder`, sorted; none when it cannot be listed (deleted meanwhile by
    another process's clean-up: ``Path.glob`` raised FileNotFoundError then)."""
    try:
        return sorted(folder.iterdir())
    except OSError:
        return []


def _revision_folders(mine: Path) -> list[Path]:
    """The ``<org--name>/<revision>`` folders under a run's folder that hold a marker."""
    return [folder for repo in _listed(mine) for folder in _listed(repo)
            if (folder / MARKER).is_file()]


def clear_leftovers(work_dir: str | os.PathLike, owner: str | os.PathLike,
                    keep: Iterable[tuple[str, str | None]] = ()) -> list[Path]:
    """Delete what a killed run left among its downloads, but the revisions in `keep` (repo,
    revision), whose partial files the next download resumes, and the revisions whose marker
    records ``keep_weights``.

    Only folders under ``<work_dir>/repgeom-downloads/<run key of owner>/`` that carry this run's
    marker and that no process holds locked are deleted; anything else in `work_dir` is never
    looked at. Returns the deleted folders.
    """
    root = Path(work_dir).absolute() / DOWNLOADS
    mine = root / run_key(owner)
    wanted = {(str(repo), str(revision or "main")) for repo, revision in keep}
    deleted = []
    for folder in _revision_folders(mine):
        record = read_json(folder / MARKER)
        if record is None or record.get("run") != mine.name or folder.is_symlink():
            continue  # not a marker we wrote: leave the folder alone
        if record.get("keep_weights"):
            continue
        if (str(record.get("repo")), str(record.get("revision") or "main")) in wanted:
            continue
        handle = try_lock(folder / LOCK)
        if handle is None:
            continue  # in use (or being deleted) by another process
        try:
            _delete(folder)
        finally:
            handle.close()
        deleted.append(folder)
        _remove_empty(folder.parent, root.parent)
    return deleted


def release(files: RevisionFiles, *, keep: bool = False) -> None:
    """Delete the files of a probed revision if repgeom downloaded them (never the user's
    cache or a local folder), unless `keep` or its marker records ``keep_weights``; then unlock
    its folder."""
    try:
        record = read_json(files.path / MARKER) if files.owned else None
        if record is not None and not keep and not record.get("keep_weights"):
            _delete(files.path)
            marked = [p for p in files.path.parents if p.name == DOWNLOADS]
            if marked:
                _remove_empty(files.path.parent, marked[0].parent)
    finally:
        if files.lock is not None:
            files.lock.close()
