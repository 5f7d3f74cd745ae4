"""Files that repgeom fetched itself, added to the user's Hugging Face cache so that an offline
rerun finds them there.

A hub tokenizer's files are fetched with repgeom's own bounded, proved GETs
(`repgeom.models.hf.loading.load_tokenizer_or_explain`), not with ``hf_hub_download``, whose HEAD
requests huggingface_hub retries by itself, silently, outside any budget. Before that,
``AutoTokenizer.from_pretrained(<hub name>)`` left them in the cache, and a rerun with
``HF_HUB_OFFLINE=1`` read them from there; so the proved files are added to the cache in the
layout huggingface_hub reads (https://huggingface.co/docs/huggingface_hub/guides/manage-cache):
``models--org--name/snapshots/<commit>/<file>`` (a plain file, as huggingface_hub itself writes
where symlinks are not available) and ``refs/<branch>`` naming the commit, each written whole or
not at all (`repgeom.files.atomic_write_bytes`). No file in the cache is deleted or replaced: a
file the cache already holds at that commit is kept as it is. The ref is set to the commit the
hub gave, as huggingface_hub's own downloads set it.
"""

from __future__ import annotations

import os
from pathlib import Path

from repgeom.files import atomic_write_bytes, atomic_write_text


def cached_commit(repo: str, commit: str, names: list[str]) -> Path | None:
    """The cache's snapshot folder of hub model `repo` at `commit` when it holds every file of
    `names` (top-level names), else None."""
    from huggingface_hub import try_to_load_from_cache

    found = [try_to_load_from_cache(repo, name, revision=commit) for name in names]
    if not names or not all(isinstance(path, str) for path in found):
        return None
    return Path(found[0]).parent


def add_to_cache(repo: str, revision: str | None, commit: str, folder: Path,
                 names: list[str]) -> Path:
    """Add the files `names` of `folder` (proved files of hub model `repo` at `commit`) to the
    Hugging Face cache, and the ref `revision` -> `commit` when `revision` is a branch or tag;
    returns the cache's snapshot folder of `commit`.

    Raises
    ------
    OSError
        The cache cannot be written (read-only, full disk, quota): what is written by then is
        whole.
    """
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    storage = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model")
    snapshot = storage / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for name in names:
        if not os.path.exists(snapshot / name):
            atomic_write_bytes(snapshot / name, (folder / name).read_bytes())
    if revision is not None and revision != commit:
        ref = storage / "refs" / revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(ref, commit)
    return snapshot
