"""A hub model's config and tokenizer files, fetched by huggingface_hub itself into the user's
Hugging Face cache, within the run's one retry budget.

What the library does: ``huggingface_hub.hf_hub_download`` fetches one file (a ``HEAD`` for its
commit and ETag, then a ``GET``) into the cache as it lays it out
(https://huggingface.co/docs/huggingface_hub/guides/manage-cache): the bytes in ``blobs/``, a
link from ``snapshots/<commit>/<file>``, ``refs/<branch>`` naming the commit (replaced whole
when it names another: a new file with the umask's mode, whatever the mode of the one it
replaces), files with the mode the umask gives (0664 under a group cache's umask 002), and a
file the cache holds at that commit returned without asking the network. With ``local_dir=`` it
fetches into a folder instead, leaving the cache as it is. No file of `repgeom.models.hub` writes
into the user's cache by hand (issue 48): only ``hf_hub_download`` does.

What it lacks, and repgeom adds: one retry budget for everything a run asks of the hub. The
library's own retries (a HEAD's timeout tried again with a 60 s timeout, 5xx and 429 retried by
``http_backoff`` up to 8 s apart) are silent and outside any budget. Here each
``hf_hub_download`` is one try of `repgeom.models.hub.calls.Retrier.call`, whose session hooks
(`calls.Retrier.attempt`) bound each of the library's requests by a timeout and end its call
at a 429 or 5xx and at its own retry of a request, so that the retrier waits as the hub
asks, says so, and stops when the budget (``retry_budget_s=``) is spent. Xet transfers
(``hf_xet``, where installed) are the library's own, with their own retries.

`fetch_tokenizer_files` reads the revision's file list (`downloads.file_list`, within the budget),
takes its configs and tokenizer files (`downloads.config_or_tokenizer`: not the Trainer's state)
and fetches each at the listed commit (a branch that moves meanwhile does not mix two commits),
then once by the branch's name, so that the library writes the branch's ref (an offline rerun,
``HF_HUB_OFFLINE=1``, resolves the branch through it). When the cache cannot be written (a
colleague's or read-only cache, a full disk), the files are fetched into a folder of the
caller's (``local_dir=``, still by the library) and the console says that an offline rerun will
not find them. `fetch_config` fetches a model's ``config.json`` alone, the first thing
``probe.py hf=...`` reads, the same way.

A spent budget ends with the one wording of `repgeom.models.hub.calls.no_answer`; a refusal
(401/403) is named as for a revision's files (`downloads.as_download_error`); a full disk where
the files were fetched names the folder and ``TMPDIR=``.
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
    ``main``), fetched by ``hf_hub_download`` within one retry budget of `retry_budget_s` (None:
    the default): the Hugging Face cache's snapshot of its commit (files the cache holds there
    are not fetched again), or `folder` when the cache cannot be written.

    Raises
    ------
    OSError
        No answer within the budget (naming the hub and ``retry_budget_s=``), no such file
        (404), or a full disk where `folder` is (naming it and ``TMPDIR=``).
    repgeom.models.hub.calls.HubAccessError
        401/403, named as for a revision's files (``HF_TOKEN``, the licence page).
    """
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
    """The folder holding hub model `name`'s ``config.json`` at `revision` (None: ``main``),
    fetched by ``hf_hub_download`` within `retry_budget_s` (None: the default, 15 minutes): the
    Hugging Face cache's snapshot, or `folder` when the cache cannot be written (the console
    says so).

    Raises
    ------
    OSError
        No answer within the budget (naming the hub and ``retry_budget_s=``), no such file
        (404), or a full disk where `folder` is (naming it and ``TMPDIR=``).
    repgeom.models.hub.calls.HubAccessError
        401/403, named as for a revision's files (``HF_TOKEN``, the licence page).
    """
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
