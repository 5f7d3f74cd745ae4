"""A hub model's config and tokenizer files, fetched for `repgeom.models.hf.loading` the way a
revision's files are (`repgeom.models.hub.downloads`): within the run's retry budget, by bounded
calls, each file proved.

`fetch_tokenizer_files` reads the revision's file list (`downloads.file_list`) and fetches its
configs and tokenizer files (`downloads.config_or_tokenizer`: not the Trainer's state) with the
revision path's own loop (`downloads.download_files`), each checked by its proof (the hub's
sha256, else its git blob id), into a temporary folder of the caller's, then adds them to the
Hugging Face cache at their commit (`repgeom.models.hub.cache`; files the cache holds at that
commit are not fetched again). `fetch_config` reads a model's ``config.json`` alone with one
bounded ``GET`` per try (`repgeom.models.hub.transfer.get_text`), the first thing ``probe.py
hf=...`` reads. Neither calls ``hf_hub_download`` or ``from_pretrained(<hub name>)``, whose HEAD
requests huggingface_hub retries by itself, silently, outside any budget. A spent budget ends
with the one wording of `repgeom.models.hub.calls.no_answer`; a refusal (401/403) is named
as for a revision's files (`downloads.as_download_error`).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from repgeom.models.hub import cache as hub_cache  # through the module: what a test patches is used
from repgeom.models.hub.calls import RetriesExhausted, budget_retrier, no_answer, status_of
from repgeom.models.hub.downloads import (
    as_download_error,
    config_or_tokenizer,
    download_files,
    file_list,
    hub_files,
)
from repgeom.models.hub.transfer import Transfer, get_text, resolve_url


def fetch_tokenizer_files(name: str, revision: str | None, folder: str,
                          retry_budget_s: float | None) -> str:
    """The folder of the configs and tokenizer files of hub model `name` at `revision`: the
    Hugging Face cache's snapshot of its commit, where the files are already there or were
    fetched into `folder` (within one retry budget of `retry_budget_s`, None: the default) and
    then added to it (an offline rerun finds them, as it found what ``AutoTokenizer`` cached);
    `folder` itself when the cache cannot be written.

    Raises
    ------
    OSError
        No answer within the budget (naming the hub and ``retry_budget_s=``), no such file
        (404), or a full disk where `folder` is (naming it and ``TMPDIR=``).
    repgeom.models.hub.calls.HubAccessError
        401/403, named as for a revision's files (``HF_TOKEN``, the licence page).
    """
    from huggingface_hub import constants

    retry, what = budget_retrier(retry_budget_s), f"tokenizer={name!r}"
    try:
        info = file_list(name, revision or "main", retry,
                         f"{what}: reading its file list at revision {revision or 'main'}")
        commit = info.sha or revision or "main"  # by commit: a branch that moves meanwhile
        wanted = [file for file in hub_files(info).values() if config_or_tokenizer(file.name)]
        names = [f.name for f in wanted]
        cached = hub_cache.cached_commit(name, info.sha, names) if info.sha else None
        if cached is not None:
            return str(cached)  # fetched by an earlier run or revision: nothing to download
        download_files(name, commit, wanted, Path(folder), retry, Transfer(), what)
    except RetriesExhausted as e:
        raise OSError(no_answer(e)) from e
    except OSError as e:  # huggingface_hub's HTTP errors (401/403/404) are OSErrors
        if status_of(e) in (401, 403):  # named as for a revision's files: HF_TOKEN, the licence
            raise as_download_error(e, name, revision, None) from e
        if e.errno in (errno.ENOSPC, errno.EDQUOT):  # the temporary folder's disk, not the hub
            raise OSError(e.errno, f"{what}: the disk of {folder} is full or over its quota "
                          f"({e.strerror or e}); free some space there, or set TMPDIR= to a "
                          "folder on a larger disk") from e
        raise OSError(f"could not load tokenizer={name!r} (revision={revision!r}) from the "
                      f"Hugging Face hub ({constants.ENDPOINT}): {e}") from e
    if not info.sha:
        return folder
    try:
        return str(hub_cache.add_to_cache(name, revision or "main", info.sha, Path(folder),
                                          names))
    except OSError as e:  # a read-only or full cache: this run goes on, an offline rerun cannot
        retry.say(f"{what}: could not add its files to the Hugging Face cache "
                  f"({constants.HF_HUB_CACHE}: {e}); an offline rerun (HF_HUB_OFFLINE=1) will "
                  "not find them")
        return folder


def fetch_config(name: str, revision: str | None, folder: str,
                 retry_budget_s: float | None) -> str:
    """`folder`, holding hub model `name`'s ``config.json`` at `revision`, read with one bounded
    ``GET`` per try within `retry_budget_s` (None: the default, 15 minutes).

    Raises
    ------
    OSError
        No answer within the budget (naming the hub and ``retry_budget_s=``).
    """
    try:
        text = get_text(resolve_url(name, revision or "main", "config.json"),
                        budget_retrier(retry_budget_s),
                        f"hf={name!r}: its config at revision {revision or 'main'}")
    except RetriesExhausted as e:
        raise OSError(no_answer(e)) from e
    with open(os.path.join(folder, "config.json"), "w") as handle:
        handle.write(text)
    return folder
