"""The revisions of a Hugging Face hub repository, listed for training trajectories: the hub
calls behind ``hf_revisions``.

`list_refs` lists a repository's branches and tags with ``huggingface_hub.HfApi.list_repo_refs``
(offline: the refs already in the local cache, from ``huggingface_hub.scan_cache_dir``).
`step_revisions` hands them to `repgeom.models.revision_names.trajectory`, the rules of names
(which are step-named, sorted by step, what is left out), then ends the trajectory on ``main``
when no step-named revision holds its weights (`weights_sha256`: the hub's LFS sha256, nothing
downloaded). `check_revisions` is the bad-input check of an explicit list
(`repgeom.models.revision_names.check_names`): it lists the refs only when some name is not a
commit id, and raises before any file is downloaded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from repgeom.models.revision_names import COMMIT, MAIN, Listing, check_names, trajectory

if TYPE_CHECKING:
    from repgeom.models.hub.calls import Retrier


@dataclass(frozen=True)
class Refs:
    """A repository's branch and tag names, and where they were read from."""

    repo_id: str
    branches: tuple[str, ...]
    tags: tuple[str, ...]
    source: str  # "on the hub" or "in the local cache (offline)"
    commits: tuple[tuple[str, str], ...] = ()  # (name, commit id) where the listing gives it

    @property
    def names(self) -> list[str]:
        return list(dict.fromkeys([*self.branches, *self.tags]))


def list_refs(repo_id: str, *, retry: Retrier | None = None) -> Refs:
    """The branches and tags of model repository `repo_id`: ``HfApi.list_repo_refs`` within
    `retry`'s budget (the run's), or offline (``HF_HUB_OFFLINE=1``) the refs the local cache
    holds (``scan_cache_dir``). ``OSError`` naming what to do when the hub refuses or does not
    know it, the budget is spent, or offline the cache holds none of its refs."""
    from huggingface_hub import HfApi, is_offline_mode

    from repgeom.models.hub.calls import budget_retrier

    if is_offline_mode():
        return _cached_refs(repo_id)
    retry = budget_retrier(retry=retry)
    with _hub_errors(repo_id, "listing its revisions"):
        refs = retry.call(lambda: HfApi().list_repo_refs(repo_id),
                          f"hf={repo_id!r}: listing its revisions")
    listed = [*refs.branches, *refs.tags]
    return Refs(repo_id, tuple(r.name for r in refs.branches), tuple(r.name for r in refs.tags),
                "on the hub", tuple((r.name, r.target_commit) for r in listed))


@contextlib.contextmanager
def _hub_errors(repo_id: str, doing: str):
    """Name a hub call's failure as an ``OSError`` that says what to do."""
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    from repgeom.models.hub.calls import DownloadError, RetriesExhausted, no_answer

    try:
        yield
    except RepositoryNotFoundError as e:
        raise OSError(
            f"hf={repo_id!r}: no such model repository on the Hugging Face hub, or it is private "
            f"or gated: log in with `hf auth login` (or set HF_TOKEN), and accept its licence at "
            f"https://huggingface.co/{repo_id}: {e}"
        ) from e
    except RetriesExhausted as e:
        raise OSError(no_answer(e)) from e
    except (HfHubHTTPError, DownloadError) as e:
        raise OSError(f"hf={repo_id!r}: {doing} on the hub ({constants.ENDPOINT}) failed: "
                      f"{e}") from e


def _cached_refs(repo_id: str) -> Refs:
    from huggingface_hub import constants, scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        # the cache the downloads use (read at call time): scan_cache_dir's own default is the
        # value HF_HUB_CACHE had when huggingface_hub was imported
        repos = scan_cache_dir(constants.HF_HUB_CACHE).repos
    except CacheNotFound:
        repos = frozenset()
    names = sorted({ref for repo in repos if repo.repo_id == repo_id and repo.repo_type == "model"
                    for revision in repo.revisions for ref in revision.refs})
    if not names:
        raise OSError(
            f"hf={repo_id!r}: offline (HF_HUB_OFFLINE is set) and the local Hugging Face cache "
            "holds no revision of it; go online once, or give hf_revisions as a list of cached "
            "revisions"
        )
    return Refs(repo_id, tuple(names), (), "in the local cache (offline)")


def step_revisions(repo_id: str, refs: Refs | None = None, *,
                   retry: Retrier | None = None) -> Listing:
    """Every step-named branch or tag of `repo_id`, sorted by step, by the rules of
    `repgeom.models.revision_names.trajectory` (``ValueError`` when there is none), ended by
    ``main`` when no step-named revision holds its weights (`_add_main`). Every hub call spends
    `retry`'s budget; ``OSError`` when one fails."""
    from repgeom.models.hub.calls import budget_retrier

    retry = budget_retrier(retry=retry)
    refs = list_refs(repo_id, retry=retry) if refs is None else refs
    listing = trajectory(refs.names, refs.source, repo_id)
    if MAIN in refs.branches:
        _add_main(repo_id, listing, refs, retry)
    return listing


def _add_main(repo_id: str, listing: Listing, refs: Refs, retry: Retrier) -> None:
    """Append ``main`` as the final checkpoint unless a step-named revision holds its weights.

    Same commit as a step-named revision (no request), or the same weights files by the hub's
    LFS sha256 as the last step-named revision (two ``model_info`` requests, nothing
    downloaded; compared on a weights format both have, so a ``main`` with the safetensors
    conversion of the last step's ``.bin`` is that step): ``main`` is that checkpoint and is left
    out. Offline, both are read from the cache. A ``main`` without weights is left out; so is one
    that ends training stages left out of the listing (OLMo-2's and OLMo-3's ``main`` comes after
    stage 2, or 3, which count their steps anew): placed one step after stage 1's last, it would
    draw those stages as one step. Otherwise it is the final checkpoint, one step after the last
    named one (its real step is not in its name), and `Listing.final_main` says so.
    """
    commits = dict(refs.commits)
    last_step, last = listing.found[-1]
    named = {commits.get(name) for _, name in listing.found} - {None}
    if commits.get(MAIN) in named:
        listing.ignored.setdefault("main: the commit of a step-named revision", []).append(MAIN)
        return
    from repgeom.models.weights_rule import same_weights

    main_weights = weights_sha256(repo_id, MAIN, retry=retry)
    if not main_weights:
        listing.ignored.setdefault("main: no weights files", []).append(MAIN)
    elif same_weights(main_weights, weights_sha256(repo_id, last, retry=retry)):
        listing.ignored.setdefault(f"main: the weights of {last}", []).append(MAIN)
    elif listing.stages_left_out:
        listing.ignored.setdefault(
            f"main: it ends the training stages left out, not one step after {last}",
            []).append(MAIN)
    else:
        listing.found.append((last_step + 1, MAIN))
        listing.final_main = True


def weights_sha256(repo_id: str, revision: str | None, *,
                   retry: Retrier | None = None) -> dict[str, str]:
    """Weights file name -> sha256 of `revision`, for every complete format by the one rule
    (`repgeom.models.weights_rule`): online the hub's LFS sha256 (``model_info``, and a sharded
    revision's index; nothing else downloaded), offline the cached snapshot's (empty when it is
    not cached, or has no weights). ``OSError`` when a hub call fails."""
    from huggingface_hub import is_offline_mode

    from repgeom.models.hub import downloads
    from repgeom.models.hub.calls import budget_retrier
    from repgeom.models.weights_rule import folder_weights

    if is_offline_mode():
        cached = downloads.cached_snapshot(repo_id, revision)
        return {} if cached is None else downloads.local_hashes(cached, folder_weights(cached))
    retry = budget_retrier(retry=retry)
    what = f"hf={repo_id!r}: the file list of {revision}"
    with _hub_errors(repo_id, f"reading the file list of {revision}"):
        info = downloads.file_list(repo_id, revision, retry, what)
        return downloads.weights_lfs_sha256(info, downloads.hub_weights(repo_id, info, retry))


def check_revisions(repo_id: str, revisions: Sequence[str], refs: Refs | None = None, *,
                    retry: Retrier | None = None) -> None:
    """``ValueError`` (naming each unknown name, its closest and the names that exist) unless
    every name in `revisions` is a branch or tag of `repo_id` or a commit id."""
    if all(COMMIT.fullmatch(str(r)) for r in revisions):
        return
    refs = list_refs(repo_id, retry=retry) if refs is None else refs
    check_names(revisions, refs.names, refs.source, repo_id)
