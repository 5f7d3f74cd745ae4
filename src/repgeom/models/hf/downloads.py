"""One hub revision's files on disk for as long as it is probed: bounded disk over a trajectory,
in folders that repgeom owns, through the hub's faults.

Probing all 154 revisions of Pythia-160m through the user's Hugging Face cache would keep ~50 GB
there (~430 GB for Pythia-1.4B). `fetch_revision` downloads a revision's files into a folder of
its own and `release` deletes it once the revision is probed. A revision that is complete in the
user's cache (every shard its index names) is read from there and never deleted; so is a local
folder. Only the files a model needs are fetched: the top-level configs, tokenizer files and one
weights format (safetensors where the revision has them, else the PyTorch ``.bin``).

**Ownership.** Downloads go only into
``<work_dir>/repgeom-downloads/<run key>/<org--name>/<revision>/``, where the run key comes from
the probe's output folder (`run_key`), and each such folder holds a marker,
``.repgeom-download.json`` (repo, revision, commit, run), and a lock file held (``flock``) while
the revision is downloaded and probed. `clear_leftovers` deletes only marked folders of the same
run that are not locked and not still to be probed: never a user's file, the cwd, the Hugging
Face cache, nor the folders of another job that shares ``work_dir``.

**What happens on each fault** (every hub call, listing and file list included, goes through
`repgeom.models.hf.hub_calls.Retrier`, one retry budget per revision, ``retry_budget_s``):

- HTTP 429: waits the ``Retry-After`` the hub sends, then tries again;
- HTTP 5xx, timeouts, refused or dropped connections: backs off exponentially (1, 2, 4 ... s,
  at most 60 s), saying why on stderr (``waiting 4 s: HTTP 503 from <url> (try 3, 14 min of 15
  left)``); a broken file download keeps its ``<file>.incomplete`` and resumes it with an HTTP
  ``Range`` request; a finished file is checked against the hub's sha256;
- budget spent: `DownloadError`, fatal; the partial files stay, so the same command resumes;
- the revision, or a file of it, does not exist (404), or the revision has no weights file (a
  config-only branch, as some of Pythia's are): `RevisionUnavailable`; the other revisions can
  still be probed;
- HTTP 401/403 (a gated or private repository): `HubAccessError`, fatal, naming ``HF_TOKEN``,
  ``hf auth login`` and the page where the licence is accepted;
- a full disk or quota (ENOSPC, EDQUOT), before the download when the hub's sizes say it will
  not fit, or during it: ``OSError`` with the same errno, naming the folder and ``work_dir=``;
- Ctrl-C: `Prefetch` runs downloads on a daemon thread and sets their abort flag, so the
  process exits at once; the partial file stays for the next run.

Files are fetched here, one HTTP ``GET`` each (by commit, through huggingface_hub's session and
token), not with ``snapshot_download``: huggingface_hub 2.x downloads into a temporary file unique
to each call and deletes it when the call fails (``file_download._download_to_tmp_and_move``,
huggingface_hub PR 4228), so a file dropped at 2.8 of 2.9 GB started again from zero, and its own
retries (5, at most 8 s apart) are silent and outside any budget.

`RevisionFiles.weights` names each weights file's sha256: the hub's LFS sha256 (from the file
metadata: nothing extra is downloaded), or the hash of the content of a cached or local file, so
that revisions serving the same weights can be told apart from real training steps.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

from repgeom.models.hf.hub_calls import (
    FIRST_WAIT_S,
    RETRY_BUDGET_S,
    Aborted,
    Retrier,
    RetriesExhausted,
    describe,
    status_of,
)

WEIGHTS = ("*.safetensors", "*.bin")
"""Weights formats in order of preference; one is fetched."""
OTHER_FILES = ("*.json", "*.txt", "*.model", "*.py", "*.tiktoken")
"""Configs and tokenizer files (merges.txt, vocab.json, spiece.model, ...)."""
DOWNLOADS = "repgeom-downloads"
"""The folder inside ``work_dir`` that holds repgeom's downloads, one folder per run."""
MARKER = ".repgeom-download.json"
"""The file that marks a revision's folder as repgeom's, naming its repo, revision and run."""
LOCK = ".repgeom-download.lock"
"""Locked (``flock``) while a process downloads or probes the revision in that folder."""
PARTIAL = ".incomplete"
"""The suffix of a file still downloading: kept when a try fails, resumed by the next."""
API_TIMEOUT_S = 30.0
"""Seconds a hub API call (file list) may take before it counts as a failed try."""
READ_TIMEOUT_S = 60.0
"""Seconds without a byte before a file download counts as a dropped connection."""
CHUNK = 1 << 20
"""Bytes read at a time from a file being hashed."""


class DownloadError(RuntimeError):
    """A revision could not be downloaded: the retry budget is spent, or the hub answered
    something that no retry mends. Fatal; the partial files are kept."""


class RevisionUnavailable(DownloadError):
    """This revision cannot be probed but the others can: it, or a file it lists, is not on
    the hub (404), or it has no weights file (a config-only branch). The message says which."""


class HubAccessError(DownloadError):
    """The hub refuses the repository (401/403: gated or private, or no such repository).
    Fatal: no revision of it can be downloaded without a token."""


@dataclass(frozen=True)
class RevisionFiles:
    """Where one revision's files are and whether repgeom may delete them.

    path : a folder ``from_pretrained`` reads; owned : True in repgeom's download folder
    (deleted by `release` unless kept), False in the user's cache or a local folder; bytes :
    bytes received from the hub by this call, failed tries included (0 when nothing was
    downloaded); seconds : the time the files took to arrive; weights : each weights file's name
    -> its sha256 (hex), which is the same for two revisions that serve the same weights.
    """

    path: Path
    owned: bool
    bytes: int = 0
    seconds: float = 0.0
    weights: dict[str, str] = field(default_factory=dict)
    lock: IO | None = field(default=None, repr=False, compare=False)
    """The open lock file of an owned folder, closed by `release`."""


# Ownership ---------------------------------------------------------------------------------

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


def _try_lock(path: Path, *, blocking: bool = False) -> IO | None:
    """The lock file `path` opened and locked, or None when another holder has it (or it is
    gone: a folder being deleted)."""
    try:
        handle = open(path, "a+")  # noqa: SIM115 - held open for as long as the lock
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        if os.fstat(handle.fileno()).st_ino != os.stat(path).st_ino:
            raise FileNotFoundError(path)  # deleted and made again while we waited
    except (BlockingIOError, FileNotFoundError):
        handle.close()
        return None
    return handle


def _claim(dest: Path, record: dict[str, Any]) -> IO:
    """Make `dest` (marker and lock) and lock it for this process."""
    for _ in range(5):
        try:
            dest.mkdir(parents=True, exist_ok=True)
        except FileNotFoundError:  # a parent removed by another job's clean-up meanwhile
            continue
        lock = dest / LOCK
        if not lock.exists():
            lock.touch()
        handle = _try_lock(lock)
        if handle is not None:
            break
        if lock.exists():  # held by a live process
            raise DownloadError(
                f"{dest} is in use by another repgeom process probing the same revision with "
                "the same output folder; wait for it to end, or give this run another "
                "hydra.run.dir")
    else:  # pragma: no cover - a folder deleted under us five times
        raise DownloadError(f"{dest} kept disappearing while it was being made")
    marker = dest / MARKER
    partial = marker.with_name(marker.name + ".tmp")
    partial.write_text(json.dumps(record, indent=1))
    os.replace(partial, marker)
    return handle


def _remove_empty(folder: Path, stop: Path) -> None:
    """Remove `folder` and its parents up to (not including) `stop` while they are empty."""
    while folder != stop and stop in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def clear_leftovers(work_dir: str | os.PathLike, owner: str | os.PathLike,
                    keep: Iterable[tuple[str, str | None]] = ()) -> list[Path]:
    """Delete what a killed run left among its downloads, but the revisions in `keep` (repo,
    revision), whose partial files the next download resumes.

    Only folders under ``<work_dir>/repgeom-downloads/<run key of owner>/`` that carry this run's
    marker and that no process holds locked are deleted; anything else in `work_dir` is never
    looked at. Returns the deleted folders.
    """
    root = Path(work_dir).absolute() / DOWNLOADS
    mine = root / run_key(owner)
    wanted = {(str(repo), str(revision or "main")) for repo, revision in keep}
    deleted = []
    for marker in sorted(mine.glob(f"*/*/{MARKER}")) if mine.is_dir() else []:
        folder = marker.parent
        try:
            record = json.loads(marker.read_text())
        except (OSError, ValueError):
            continue  # not a marker we wrote: leave the folder alone
        if record.get("run") != mine.name or folder.is_symlink():
            continue
        if (str(record.get("repo")), str(record.get("revision") or "main")) in wanted:
            continue
        handle = _try_lock(folder / LOCK)
        if handle is None:
            continue  # in use (or being deleted) by another process
        try:
            shutil.rmtree(folder, ignore_errors=True)
        finally:
            handle.close()
        deleted.append(folder)
        _remove_empty(folder.parent, root.parent)
    return deleted


def release(files: RevisionFiles, *, keep: bool = False) -> None:
    """Delete the files of a probed revision if repgeom downloaded them (never the user's
    cache or a local folder), unless `keep`; then unlock its folder."""
    try:
        if files.owned and not keep and (files.path / MARKER).is_file():
            shutil.rmtree(files.path, ignore_errors=True)
            marked = [p for p in files.path.parents if p.name == DOWNLOADS]
            if marked:
                _remove_empty(files.path.parent, marked[0].parent)
    finally:
        if files.lock is not None:
            files.lock.close()


# Caches and local folders ------------------------------------------------------------------

def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _complete_weights(folder: Path) -> list[Path] | None:
    """The weights files of a complete revision in `folder` (one format: every shard its
    ``*.index.json`` names, or the single file), or None when none is complete."""
    for pattern in WEIGHTS:
        indexes = sorted(folder.glob(f"{pattern}.index.json"))
        if indexes:
            shards: set[str] = set()
            for index in indexes:
                try:
                    shards |= set(json.loads(index.read_text()).get("weight_map", {}).values())
                except (OSError, ValueError, AttributeError):
                    shards.add(f"<unreadable {index.name}>")
            files = [folder / shard for shard in sorted(shards)]
            if shards and all(f.is_file() for f in files):  # a broken cache link is not a file
                return files
            continue
        files = sorted(f for f in folder.glob(pattern) if f.is_file())
        if files:
            return files
    return None


def _hashes(files: Iterable[Path], folder: Path) -> dict[str, str]:
    """Name -> sha256 of each file. In the Hugging Face cache an LFS file links to a blob
    named by its sha256 (the hub's ETag), so that name is taken without reading the file."""
    hashes = {}
    for file in files:
        blob = Path(os.path.realpath(file)).name
        hashes[str(file.relative_to(folder))] = (
            blob if re.fullmatch(r"[0-9a-f]{64}", blob) else _sha256_of(file))
    return hashes


def _cached(repo: str, revision: str | None) -> Path | None:
    """The revision's snapshot in the user's Hugging Face cache, if it is complete there: the
    config and every weights file (every shard its index names; not just the config a first
    look at the model fetched, nor one shard of three)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(repo, revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        return None
    complete = (path / "config.json").is_file() and _complete_weights(path) is not None
    return path if complete else None


# Downloads ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _File:
    name: str
    size: int | None
    sha256: str | None  # the hub's LFS sha256, None for a file kept in git


def _plan(info: Any) -> tuple[list[_File], list[str]]:
    """The files of one revision to download and which of them are weights."""
    siblings = [s for s in info.siblings or [] if "/" not in s.rfilename]  # top level only
    names = [s.rfilename for s in siblings]
    pattern = next((w for w in WEIGHTS if any(Path(n).match(w) for n in names)), None)
    patterns = [*OTHER_FILES, *([pattern] if pattern else [])]
    files = [_File(s.rfilename, s.size if s.size is not None else None,
                   getattr(s.lfs, "sha256", None) if s.lfs else None)
             for s in siblings if any(Path(s.rfilename).match(p) for p in patterns)]
    weights = [f.name for f in files if pattern and Path(f.name).match(pattern)]
    return files, weights


def weights_lfs_sha256(info: Any) -> dict[str, str]:
    """Weights file name -> the hub's LFS sha256, for the weights a download of this revision
    would fetch (`_plan`: top level, one format), from its ``model_info(files_metadata=True)``;
    empty when the revision has no weights file."""
    files, weights = _plan(info)
    return {f.name: f.sha256 for f in files if f.name in weights and f.sha256 is not None}


def _check_space(folder: Path, needed: int, revision: str | None) -> None:
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise OSError(
            errno.ENOSPC,
            f"revision {revision}: {needed / 1e9:.2f} GB needed in {folder}, {free / 1e9:.2f} GB "
            "free; free some space, or set work_dir= to a larger disk",
        )


class _Transfer:
    """Bytes received by one `fetch_revision`, failed tries included."""

    def __init__(self) -> None:
        self.received = 0


def _hash_prefix(path: Path, size: int) -> tuple[Any, int]:
    """The sha256 state of the first `size` bytes of `path`, and the bytes it read."""
    digest, hashed = hashlib.sha256(), 0
    if size:
        with open(path, "rb") as handle:
            while hashed < size and (chunk := handle.read(min(CHUNK, size - hashed))):
                digest.update(chunk)
                hashed += len(chunk)
    return digest, hashed


def _download(url: str, file: _File, dest: Path, retrier: Retrier, transfer: _Transfer,
              what: str) -> None:
    """`file` into `dest`, resuming ``<name>.incomplete`` where a try stopped, checked against
    its size and sha256 before it takes its name."""
    try:
        import httpx2 as httpx  # huggingface_hub 2.x
    except ImportError:  # pragma: no cover - huggingface_hub 1.x
        import httpx
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    final, part = dest / file.name, dest / (file.name + PARTIAL)
    if final.is_file() and (file.size is None or final.stat().st_size == file.size):
        return  # finished (and checked) by an earlier try or run
    digest, hashed = hashlib.sha256(), 0
    while True:
        retrier.check_abort()
        have = part.stat().st_size if part.exists() else 0
        if file.size is not None and have > file.size:
            part.unlink()
            have = 0
        if hashed != have:  # a partial file from an earlier run (or none): hash what it holds
            digest, hashed = _hash_prefix(part, have)
        started, before = time.monotonic(), transfer.received
        try:
            if file.size is None or have < file.size:
                headers = build_hf_headers()
                if have:
                    headers["Range"] = f"bytes={have}-"
                timeout = httpx.Timeout(READ_TIMEOUT_S, connect=API_TIMEOUT_S)
                with get_session().stream("GET", url, headers=headers, timeout=timeout,
                                          follow_redirects=True) as response:
                    if response.status_code >= 400:
                        response.read()  # the error's message is in the body
                        hf_raise_for_status(response)
                    mode = "ab"
                    if have and response.status_code != 206:  # the server ignored the Range
                        mode, digest, hashed = "wb", hashlib.sha256(), 0
                    with open(part, mode) as handle:
                        for chunk in response.iter_bytes():  # as they arrive: none lost
                            retrier.check_abort()
                            handle.write(chunk)
                            digest.update(chunk)
                            hashed += len(chunk)
                            transfer.received += len(chunk)
            size = part.stat().st_size if part.exists() else 0
            if file.size is not None and size != file.size:
                raise ConnectionError(f"{file.name}: {size} of {file.size} bytes arrived")
            if file.sha256 is not None and digest.hexdigest() != file.sha256:
                part.unlink()
                raise ConnectionError(f"{file.name}: the sha256 of the bytes received is not "
                                      "the hub's; downloading it again")
            if not part.exists():
                part.touch()  # an empty file
            os.replace(part, final)
            return
        except Aborted:
            raise
        except Exception as error:  # noqa: BLE001 - sorted by the retrier
            retrier.failed(error, what, seconds=time.monotonic() - started,
                           progressed=transfer.received > before)


def _named(error: BaseException, repo: str, revision: str | None, dest: Path | None
           ) -> BaseException:
    """The exception to raise for a failure that was not retried (see the module docstring)."""
    from huggingface_hub.errors import (
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    name = f"revision {revision or 'main'} of {repo}"
    kept = (f"; the partial files are kept in {dest}: the same command resumes them"
            if dest is not None and dest.is_dir() else "")
    status = status_of(error)
    if isinstance(error, RetriesExhausted):
        return DownloadError(f"{error}{kept}. Rerun the same command (the revisions already "
                             "probed are kept), or give the hub more time: retry_budget_s=")
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        if "work_dir=" in str(error):  # `_check_space`'s, which says it all
            return error
        full = "full" if error.errno == errno.ENOSPC else "over its quota"
        return OSError(error.errno, f"{name}: the disk of {dest or 'the download folder'} is "
                       f"{full} ({error.strerror or describe(error)}); free some space or set "
                       f"work_dir= to a larger disk{kept}")
    if isinstance(error, OfflineModeIsEnabled):
        return DownloadError(f"{name} is not complete in the Hugging Face cache and HF_HUB_OFFLINE "
                             "is set: go online, or probe only the revisions in the cache")
    if status in (401, 403) or isinstance(error, RepositoryNotFoundError):
        return HubAccessError(
            f"{name}: the hub refuses it (HTTP {status}): the repository is gated or private, or "
            f"does not exist. If it is gated, accept its licence at https://huggingface.co/{repo} "
            "while logged in; then give repgeom a token that may read it: `hf auth login`, or "
            f"HF_TOKEN=<token> in the environment ({describe(error)})")
    if isinstance(error, RevisionNotFoundError):
        return RevisionUnavailable(f"{name}: the hub has no such revision (HTTP 404)")
    if isinstance(error, RemoteEntryNotFoundError) or status == 404:
        return RevisionUnavailable(f"{name}: a file it lists is missing on the hub (HTTP 404: "
                                   f"{describe(error)})")
    if status is not None:
        return DownloadError(f"{name}: the hub answered HTTP {status} ({describe(error)}), which "
                             f"no retry mends{kept}")
    return error


def fetch_revision(repo: str, revision: str | None, work_dir: str | os.PathLike, *,
                   owner: str | os.PathLike | None = None,
                   retry_budget_s: float = RETRY_BUDGET_S, first_wait_s: float = FIRST_WAIT_S,
                   say: Callable[[str], None] | None = None,
                   abort: threading.Event | None = None) -> RevisionFiles:
    """The files of hub model `repo` at `revision`: a local folder as it is, the user's cache
    where the revision is complete there, else downloaded into repgeom's own folder in
    `work_dir` (see the module docstring).

    Parameters
    ----------
    repo, revision : the hub repository (or a local folder) and the branch, tag or commit.
    work_dir : where repgeom may make its ``repgeom-downloads/`` folder.
    owner : the run's output folder: its `run_key` keys the download folder; None: `work_dir`.
    retry_budget_s : seconds of waiting for the hub allowed for this revision (`Retrier`);
        0: no retry.
    first_wait_s : the first back-off (tests make it short).
    say : where waits are announced (default: stderr).
    abort : when set (by another thread), the download stops between two chunks (`Aborted`).

    Raises
    ------
    RevisionUnavailable
        This revision cannot be probed (404, or no weights file); the others can.
    HubAccessError
        401/403: gated or private; the message names ``HF_TOKEN`` and the licence page.
    DownloadError
        The retry budget is spent (the partial files are kept: the same command resumes).
    OSError
        ENOSPC/EDQUOT: the disk or quota of `work_dir` is full.
    """
    local = Path(repo).expanduser()
    if local.is_dir():  # a local folder: nothing to fetch
        return RevisionFiles(local, owned=False, weights=_hashes(_complete_weights(local) or [],
                                                                 local))
    cached = _cached(repo, revision)
    if cached is not None:
        return RevisionFiles(cached, owned=False,
                             weights=_hashes(_complete_weights(cached) or [], cached))
    from huggingface_hub import HfApi, constants

    started = time.perf_counter()
    retrier = Retrier(budget_s=retry_budget_s, first_wait_s=first_wait_s, abort=abort,
                      **({"say": say} if say is not None else {}))
    name = f"revision {revision or 'main'} of {repo}"
    dest: Path | None = None
    lock: IO | None = None
    try:
        info = retrier.call(lambda: HfApi().model_info(
            repo, revision=revision, files_metadata=True, timeout=API_TIMEOUT_S),
            f"{name}: reading its file list")
        files, weights = _plan(info)
        if not weights:
            raise RevisionUnavailable(
                f"{name} has no weights file (*.safetensors or *.bin), only "
                f"{', '.join(sorted(s.rfilename for s in info.siblings or [])[:8]) or 'nothing'}"
                ": a branch without weights (some of Pythia's are), nothing to probe")
        dest = download_dir(work_dir, owner if owner is not None else work_dir, repo, revision)
        lock = _claim(dest, {"repo": repo, "revision": revision or "main", "commit": info.sha,
                             "run": dest.parent.parent.name,
                             "owner": os.path.abspath(owner if owner is not None else work_dir),
                             "created": time.strftime("%Y-%m-%dT%H:%M:%S")})
        have = sum((dest / (f.name + PARTIAL)).stat().st_size
                   for f in files if (dest / (f.name + PARTIAL)).is_file())
        _check_space(dest, sum(f.size or 0 for f in files if not (dest / f.name).is_file())
                     - have, revision)
        transfer = _Transfer()
        commit = info.sha or revision or "main"  # by commit: a branch that moves meanwhile
        for file in files:
            url = f"{constants.ENDPOINT}/{repo}/resolve/{commit}/{quote(file.name)}"
            _download(url, file, dest, retrier, transfer, f"{name}: downloading {file.name}")
        missing = _missing_shards(dest, weights)
        if missing:
            raise RevisionUnavailable(f"{name}: its weights index names shards the hub does not "
                                      f"have: {', '.join(missing[:5])}")
        hashes = {f.name: f.sha256 or _sha256_of(dest / f.name)
                  for f in files if f.name in weights}
        return RevisionFiles(dest, owned=True, bytes=transfer.received,
                             seconds=time.perf_counter() - started, weights=hashes, lock=lock)
    except Aborted:
        if lock is not None:
            lock.close()
        raise
    except Exception as error:  # noqa: BLE001 - each named by `_named`
        named = _named(error, repo, revision, dest)
        if isinstance(named, RevisionUnavailable) and dest is not None and lock is not None:
            shutil.rmtree(dest, ignore_errors=True)  # nothing of it will be probed
            _remove_empty(dest.parent, Path(work_dir).absolute())
        if lock is not None:
            lock.close()
        if named is error:
            raise
        raise named from error


def _missing_shards(folder: Path, weights: list[str]) -> list[str]:
    """Shards that the index of the downloaded weights format (``model.safetensors.index.json``
    beside ``*.safetensors``; not the ``.bin`` index of a format not fetched) names but
    `folder` lacks."""
    suffixes = {Path(w).suffix for w in weights}
    missing = []
    for index in folder.glob("*.index.json"):
        if Path(index.name[:-len(".index.json")]).suffix not in suffixes:
            continue
        try:
            shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError):
            continue
        missing += [s for s in sorted(shards) if not (folder / s).is_file()]
    return missing


class Prefetch:
    """Run fetches in order on one daemon thread, so that Ctrl-C in the main thread exits at once.

    ``concurrent.futures.ThreadPoolExecutor`` joins its threads at exit, so Ctrl-C waited for the
    download in flight (minutes for a 2.9 GB revision). Here leaving the ``with`` block on an
    exception sets `abort` (which `fetch_revision` checks between chunks and during waits) and
    nothing waits for the thread; the partial file stays for the next run.
    """

    def __init__(self) -> None:
        self.abort = threading.Event()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name="prefetch", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        self._queue.put((future, fn, args))
        return future

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                if self.abort.is_set():
                    raise Aborted("stopped: the run was interrupted")
                future.set_result(fn(*args))
            except BaseException as error:  # noqa: BLE001 - handed to whoever waits for it
                future.set_exception(error)

    def close(self, *, abort: bool = False) -> None:
        if abort:
            self.abort.set()
        self._queue.put(None)

    def __enter__(self) -> Prefetch:
        return self

    def __exit__(self, kind: type | None, *exc: object) -> None:
        self.close(abort=kind is not None)
