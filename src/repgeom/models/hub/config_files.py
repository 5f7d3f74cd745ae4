"""A hub model's config and tokenizer files, fetched by huggingface_hub itself into the user's
Hugging Face cache, within the run's one retry budget.

``hf_hub_download`` writes the cache as the library lays it out (blobs, snapshot links, refs
replaced whole, modes from the umask: 0664 under a group cache's umask 002) and returns a file
it holds without asking the network; with ``local_dir=`` it fetches into a folder instead. No
file of `repgeom.models.hub` writes into the user's cache by hand (issue 48).

What the library lacks, and repgeom adds: one retry budget. Its own retries (``http_backoff``'s,
up to 8 s apart) are silent and outside any budget; here each ``hf_hub_download`` is one try of
`repgeom.models.hub.calls.Retrier.call`, whose hooks bound its requests and end it at a 429, a
5xx or a retry of its own, so that the retrier waits as the hub asks and says so.

`fetch_tokenizer_files` fetches a revision's configs and tokenizer files at the listed commit (a
branch that moves meanwhile does not mix two commits), then once by the branch's name so that the
library writes its ref (for an offline rerun). An unwritable cache (read-only, another user's, a
full disk) falls back to a folder of the caller's (``local_dir=``), said in the console.
`fetch_config` fetches ``config.json`` alone, the same way.
"""

from __future__ import annotations

import errno
from pathlib import Path

from repgeom.models.hub.calls import Retrier, RetriesExhausted, budget_retrier, no_answer, status_of
from repgeom.models.hub.downloads import (
    as_download_error,
    config_or_tokenizer,
    file_list,
    hub_files,
)

MOVES = 3
"""Looks at a branch that moves while its files are fetched before giving up."""
_UNWRITABLE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST,
                         errno.ENOSPC, errno.EDQUOT})
"""The errnos of a cache that cannot be written: another user's or read-only folders, a cache
path under a file, a full disk or quota."""


def _cannot_write(error: BaseException) -> bool:
    """Whether `error` is a file system's refusal (`_UNWRITABLE`), not an answer of the hub."""
    return (isinstance(error, OSError) and error.errno in _UNWRITABLE
            and status_of(error) is None)


def _download(retry: Retrier, name: str, filename: str, revision: str, what: str,
              local_dir: str | None = None) -> Path:
    """``hf_hub_download`` of `filename` of hub model `name` at `revision` (into the cache, or
    into `local_dir`), one try of `retry` per call."""
    from huggingface_hub import hf_hub_download

    return Path(retry.call(lambda: hf_hub_download(name, filename, revision=revision,
                                                   local_dir=local_dir),
                           f"{what}: downloading {filename}"))


def _wanted(info, what: str, revision: str) -> list[str]:
    """The configs and tokenizer files of a file list (`downloads.config_or_tokenizer`)."""
    names = [f.name for f in hub_files(info).values() if config_or_tokenizer(f.name)]
    if not names:
        raise OSError(f"{what}: revision {revision} holds no config or tokenizer file")
    return names


def _to_cache(retry: Retrier, name: str, revision: str, info, what: str) -> Path:
    """Each config and tokenizer file of `info` (the file list of `revision`) at its commit into
    the cache, then the first by `revision`'s name, so that the library writes
    ``refs/<revision>`` (no GET while it names that commit); the snapshot folder. A branch that
    moved meanwhile: the new commit's files are fetched (its file list read first), so that the
    ref never names a commit whose snapshot lacks them."""
    for look in range(MOVES):
        commit = info.sha or revision
        paths = [_download(retry, name, file, commit, what)
                 for file in _wanted(info, what, revision)]
        if revision == commit:
            return paths[0].parent
        now = _download(retry, name, paths[0].name, revision, what).parent.name
        if now == commit:
            return paths[0].parent
        if look == MOVES - 1:
            break
        retry.say(f"{what}: revision {revision} moved to commit {now} while its files were "
                  "fetched; fetching that commit's files")
        info = file_list(name, now, retry, f"{what}: reading its file list at commit {now}")
    raise OSError(f"{what}: revision {revision} moved to another commit at each of {MOVES} "
                  f"looks while its files were fetched (now {now}); rerun the same command once "
                  "it stays still, or give the tokenizer a commit id as its revision")


def _named(e: BaseException, name: str, revision: str | None, what: str,
           folder: str) -> BaseException | None:
    """The error to raise for `e`, a failure of fetching `name`'s files (into `folder`, when
    the cache could not be written), or None for an error that says it all."""
    if isinstance(e, RetriesExhausted):
        return OSError(no_answer(e))
    if status_of(e) in (401, 403):  # named as for a revision's files: HF_TOKEN, the licence
        return as_download_error(e, name, revision, None)
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) and folder:
        return OSError(e.errno, f"{what}: the disk of {folder} is full or over its quota "
                       f"({e.strerror or e}); free some space there, or set TMPDIR= to a folder "
                       "on a larger disk")
    return None


def fetch_tokenizer_files(name: str, revision: str | None, folder: str,
                          retry_budget_s: float | None) -> str:
    """The folder of the configs and tokenizer files of hub model `name` at `revision` (None:
    ``main``), fetched within one budget of `retry_budget_s` (None: the default): the cache's
    snapshot of its commit, or `folder` when the cache cannot be written.

    Raises ``OSError`` (no answer within the budget, naming ``retry_budget_s=``; a 404; a full
    disk, naming `folder` and ``TMPDIR=``) or `HubAccessError` (401/403: ``HF_TOKEN``, the
    licence page)."""
    from huggingface_hub import constants

    retry, what, branch = budget_retrier(retry_budget_s), f"tokenizer={name!r}", revision or "main"
    try:
        info = file_list(name, branch, retry, f"{what}: reading its file list at revision {branch}")
        try:
            return str(_to_cache(retry, name, branch, info, what))
        except OSError as e:
            if not _cannot_write(e):
                raise
            retry.say(f"{what}: could not add its files to the Hugging Face cache "
                      f"({constants.HF_HUB_CACHE}: {e}); fetching them into {folder} instead: an "
                      "offline rerun (HF_HUB_OFFLINE=1) will not find them")
        for file in _wanted(info, what, branch):  # by commit: a branch that moves meanwhile
            _download(retry, name, file, info.sha or branch, what, local_dir=folder)
        return folder
    except (RetriesExhausted, OSError) as e:  # huggingface_hub's HTTP errors are OSErrors
        raise _named(e, name, revision, what, folder) or OSError(
            f"could not load {what} (revision={revision!r}) from the Hugging Face hub "
            f"({constants.ENDPOINT}): {e}") from e


def fetch_config(name: str, revision: str | None, folder: str,
                 retry_budget_s: float | None) -> str:
    """The folder holding hub model `name`'s ``config.json`` at `revision`, fetched as
    `fetch_tokenizer_files` fetches (and raising as it does)."""
    from huggingface_hub import constants

    retry, what, branch = budget_retrier(retry_budget_s), f"hf={name!r}", revision or "main"
    try:
        try:
            return str(_download(retry, name, "config.json", branch, what).parent)
        except OSError as e:
            if not _cannot_write(e):
                raise
            retry.say(f"{what}: could not add its config to the Hugging Face cache "
                      f"({constants.HF_HUB_CACHE}: {e}); fetching it into {folder} instead")
        return str(_download(retry, name, "config.json", branch, what, local_dir=folder).parent)
    except (RetriesExhausted, OSError) as e:  # the caller names any other OSError
        named = _named(e, name, revision, what, folder)
        if named is None:
            raise
        raise named from e
