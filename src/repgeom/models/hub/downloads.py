"""One hub revision's files on disk for as long as it is probed: bounded disk over a trajectory,
in folders that repgeom owns, through the hub's faults.

Probing Pythia-160m's 154 revisions through the user's Hugging Face cache would keep ~50 GB
there. `fetch_revision` downloads a revision's files (its configs, tokenizer files and the
weights the one rule names, `repgeom.models.weights_rule`) into a folder of its own, which
`release` deletes once it is probed; a revision complete in the user's cache is read from there,
and a local folder as it is, and neither is ever deleted. This module decides *which* files of
*which* commit; `download_folders` owns the folders and `transfer` moves and proves the bytes.

Online, a branch is resolved to its commit (``model_info``) before any cache is used; offline
(``HF_HUB_OFFLINE=1``) the cache's ref is used, and the console says so.

Every hub call is made by huggingface_hub within one retry budget per revision
(`repgeom.models.hub.calls.Retrier`, ``retry_budget_s``): 429s wait their ``Retry-After``, 5xx,
timeouts and dropped connections back off, each wait said on stderr; a broken download keeps its
``<file>.incomplete`` for this run or the next. What ends a revision (`as_download_error`):

- the budget spent: `DownloadError`, fatal, naming the hub and the command to rerun;
- a 404, or no weights file (a config-only branch): `RevisionUnavailable`, the other revisions
  go on; only this revision's unfinished partial files are deleted;
- 401/403: `HubAccessError`, fatal, naming ``HF_TOKEN``, ``hf auth login`` and the licence page;
- a full disk or quota (before the download, from the hub's sizes, or during it): ``OSError``
  with its errno, naming the folder and ``work_dir=``;
- Ctrl-C: the caller sets `abort`; the download stops between two chunks.

`RevisionFiles.weights` gives each weights file's sha256 (the hub's LFS sha256, or the content's
hash for a cached or local file), so that revisions serving the same weights are told apart from
training steps (`repgeom.models.weights_rule.same_weights`).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from repgeom.models.hub.calls import (
    FIRST_WAIT_S,
    RETRY_BUDGET_S,
    Aborted,
    DownloadError,
    HubAccessError,
    Retrier,
    RetriesExhausted,
    RevisionUnavailable,
    describe,
    no_answer,
    status_of,
)
from repgeom.models.hub.download_folders import (
    PARTIAL,
    RevisionFiles,
    claim,
    delete_partials,
    download_dir,
)
from repgeom.models.hub.transfer import (
    HubFile,
    Transfer,
    download_file,
    get_text,
    resolve_url,
    sha256_of,
)
from repgeom.models.weights_rule import (
    FORMATS,
    INDEX,
    Weights,
    folder_weights,
    is_training_state,
    weights_of,
)

OTHER_FILES = ("*.json", "*.txt", "*.model", "*.py", "*.tiktoken")
"""Configs and tokenizer files (merges.txt, vocab.json, spiece.model, ...)."""


def config_or_tokenizer(name: str) -> bool:
    """Whether a revision's file `name` is one of its configs or tokenizer files (`OTHER_FILES`):
    not a weights index, nor the Trainer's state (``trainer_state.json``, its log history:
    megabytes over a long run; `repgeom.models.weights_rule.TRAINING_STATE`)."""
    return (not name.endswith(INDEX) and not is_training_state(name)
            and any(Path(name).match(p) for p in OTHER_FILES))


# Caches and local folders ------------------------------------------------------------------

def local_hashes(folder: Path, weights: Weights) -> dict[str, str]:
    """Name -> sha256 of every file of every complete format in `folder`. In the Hugging Face
    cache an LFS file links to a blob named by its sha256 (the hub's ETag), so that name is
    taken without reading the file."""
    hashes = {}
    for files in weights.formats.values():
        for name in files:
            blob = Path(os.path.realpath(folder / name)).name
            hashes[name] = blob if re.fullmatch(r"[0-9a-f]{64}", blob) else sha256_of(folder / name)
    return hashes


def cached_snapshot(repo: str, revision: str | None) -> Path | None:
    """The revision's snapshot in the user's Hugging Face cache (by commit, or by the cache's
    ref for a branch name), if it is complete there: the config and every weights file the rule
    names (every shard its index names; not just the config a first look at the model fetched,
    nor one shard of three)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(repo, revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        return None
    complete = (path / "config.json").is_file() and folder_weights(path).files
    return path if complete else None


def _cached_files(path: Path) -> RevisionFiles:
    return RevisionFiles(path, owned=False, weights=local_hashes(path, folder_weights(path)))


# Downloads ---------------------------------------------------------------------------------

def hub_files(info: Any) -> dict[str, HubFile]:
    """The top-level files of a ``model_info(files_metadata=True)``, by name."""
    return {s.rfilename: HubFile(s.rfilename, s.size,
                                 getattr(s.lfs, "sha256", None) if s.lfs else None,
                                 getattr(s, "blob_id", None))
            for s in info.siblings or [] if "/" not in s.rfilename}


def file_list(repo: str, revision: str | None, retrier: Retrier, what: str) -> Any:
    """``model_info(files_metadata=True)`` of `repo` at `revision` (None: ``main``): one bounded
    call per try, through `retrier`; `what` names it in the console and errors."""
    from huggingface_hub import HfApi

    return retrier.call(lambda: HfApi().model_info(  # bounded by the retrier's session hooks
        repo, revision=revision, files_metadata=True), what)


def download_files(repo: str, commit: str, files: list[HubFile], dest: Path, retrier: Retrier,
                   transfer: Transfer, name: str) -> None:
    """Each of `files` of `repo` at `commit` into `dest`, proved, in order
    (`repgeom.models.hub.transfer.download_file`); `name` says whose they are."""
    for file in files:
        download_file(resolve_url(repo, commit, file.name), file, dest, commit, retrier,
                      transfer, f"{name}: downloading {file.name}")


def hub_weights(repo: str, info: Any, retrier: Retrier, read_index=None) -> Weights:
    """`weights_of` a revision's hub listing; an index is read with `read_index` (default: a
    bounded GET of the file at the revision's commit, through `retrier`)."""

    def fetch_index(name: str) -> str:
        return get_text(resolve_url(repo, info.sha, name), retrier, f"{repo}: reading {name}")

    return weights_of(hub_files(info), read_index or fetch_index)


def weights_lfs_sha256(info: Any, weights: Weights) -> dict[str, str]:
    """Weights file name -> the hub's LFS sha256, for every complete format of `weights` (the
    rule's files of this revision) that the listing gives hashes for."""
    files = hub_files(info)
    hashes = {}
    for names in weights.formats.values():
        if all(files[n].sha256 for n in names):
            hashes.update({n: files[n].sha256 for n in names})
    return hashes


def _check_space(folder: Path, needed: int, name: str) -> None:
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise OSError(
            errno.ENOSPC,
            f"{name}: {needed / 1e9:.2f} GB needed in {folder}, {free / 1e9:.2f} GB "
            "free; free some space, or set work_dir= to a larger disk",
        )


def as_download_error(error: BaseException, repo: str, revision: str | None, dest: Path | None
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
        return DownloadError(no_answer(error, kept=kept,
                                       rerun="(the revisions already probed are kept)"))
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        if "work_dir=" in str(error):  # `_check_space`'s, which says it all
            return error
        full = "full" if error.errno == errno.ENOSPC else "over its quota"
        try:
            free = f", {shutil.disk_usage(dest).free / 1e9:.2f} GB free" if dest else ""
        except OSError:
            free = ""
        return OSError(error.errno, f"{name}: the disk of {dest or 'the download folder'} is "
                       f"{full} ({error.strerror or describe(error)}{free}); free some space "
                       f"or set work_dir= to a larger disk{kept}")
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
                   abort: threading.Event | None = None,
                   keep_weights: bool = False) -> RevisionFiles:
    """The files of hub model `repo` at `revision`: a local folder as it is, the user's cache
    where the revision's commit is complete there, else downloaded into repgeom's folder in
    `work_dir` (``repgeom-downloads/``, keyed by `owner`, the run's output folder). Waits spend
    `retry_budget_s` (0: no retry), from `first_wait_s`, said to `say`; `abort`, set by another
    thread, stops it between two chunks; `keep_weights` is recorded so that no run deletes it.
    Raises as the module docstring says."""
    local = Path(repo).expanduser()
    if local.is_dir():  # a local folder: nothing to fetch
        return _cached_files(local)
    retrier = Retrier(budget_s=retry_budget_s, first_wait_s=first_wait_s, abort=abort,
                      **({"say": say} if say is not None else {}))
    name = f"revision {revision or 'main'} of {repo}"
    cached = _offline_snapshot(repo, revision, retrier, name)
    if cached is not None:
        return _cached_files(cached)
    started = time.perf_counter()
    dest: Path | None = None
    lock: IO | None = None
    try:
        info = file_list(repo, revision, retrier, f"{name}: reading its file list")
        cached = cached_snapshot(repo, info.sha) if info.sha else None
        if cached is not None:  # by commit: a branch that moved meanwhile is not read
            return _cached_files(cached)
        files = _with_weights(hub_files(info), name)
        dest = download_dir(work_dir, owner if owner is not None else work_dir, repo, revision)
        lock = claim(dest, {"repo": repo, "revision": revision or "main", "commit": info.sha,
                            "run": dest.parent.parent.name,
                            "owner": os.path.abspath(owner if owner is not None else work_dir),
                            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                            "keep_weights": keep_weights}, retrier.say)
        transfer = Transfer()
        hashes = _download(repo, info.sha or revision or "main", info, files, dest, retrier,
                           transfer, name)
        return RevisionFiles(dest, owned=True, bytes=transfer.received,
                             seconds=time.perf_counter() - started, weights=hashes, lock=lock)
    except Aborted:
        if lock is not None:
            lock.close()
        raise
    except Exception as error:  # noqa: BLE001 - each named by `as_download_error`
        named = as_download_error(error, repo, revision, dest)
        if isinstance(named, RevisionUnavailable) and dest is not None and lock is not None:
            delete_partials(dest)  # unfinished, of a revision not probed; finished files stay
        if lock is not None:
            lock.close()
        if named is error:
            raise
        raise named from error


def _offline_snapshot(repo: str, revision: str | None, retrier: Retrier,
                      name: str) -> Path | None:
    """Offline (``HF_HUB_OFFLINE``), the cache's snapshot at the commit its ref names, said;
    online (or not in the cache) None: the hub resolves the branch first."""
    from huggingface_hub import is_offline_mode

    cached = cached_snapshot(repo, revision) if is_offline_mode() else None
    if cached is not None:
        retrier.say(f"offline (HF_HUB_OFFLINE): {name} read from the Hugging Face cache at "
                    f"the commit its ref names there, {cached.name[:12]}")
    return cached


def _with_weights(files: dict[str, HubFile], name: str) -> dict[str, HubFile]:
    """`files` (a revision's listing), or `RevisionUnavailable` when none is a weights file."""
    if not any(n.endswith(FORMATS) for n in files):
        raise RevisionUnavailable(
            f"{name} has no weights file (*.safetensors or *.bin), only "
            f"{', '.join(sorted(files)[:8]) or 'nothing'}"
            ": a branch without weights (some of Pythia's are), nothing to probe")
    return files


def _download(repo: str, commit: str, info: Any, files: dict[str, HubFile], dest: Path,
              retrier: Retrier, transfer: Transfer, name: str) -> dict[str, str]:
    """The indexes (small: read first), then the configs and tokenizer files, then the weights
    the rule names, into `dest` (once the disk is known to hold them), by `commit` (a branch
    that moves meanwhile is not mixed in); returns the weights' sha256 by name, of every
    complete format the listing hashes."""
    indexes = [f for n, f in files.items() if n.endswith(INDEX)]
    download_files(repo, commit, indexes, dest, retrier, transfer, name)
    weights = hub_weights(repo, info, retrier, lambda n: (dest / n).read_text())
    if not weights.files:
        missing = next(iter(weights.missing.values()), ())
        raise RevisionUnavailable(
            f"{name}: its weights index names shards the hub does not have: "
            f"{', '.join(missing[:5])}" if missing else
            f"{name} has no weights file (only training state), nothing to probe")
    wanted = [*(f for n, f in files.items() if not n.endswith(FORMATS)
                and config_or_tokenizer(n)), *(files[n] for n in weights.files)]
    partial = [dest / (f.name + PARTIAL) for f in wanted]
    _check_space(dest, sum(f.size or 0 for f in wanted if not (dest / f.name).is_file())
                 - sum(p.stat().st_size for p in partial if p.is_file()), name)
    download_files(repo, commit, wanted, dest, retrier, transfer, name)
    hashes = weights_lfs_sha256(info, weights)
    hashes.update({n: files[n].sha256 or sha256_of(dest / n) for n in weights.files})
    return hashes
