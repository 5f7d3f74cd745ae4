"""The revisions of a Hugging Face hub repository that are training checkpoints.

Public training trajectories are published as hub revisions named after their step: Pythia's
branches ``step0``, ``step1``, ``step2``, ``step4`` ... ``step512``, then every 1,000 steps to
``step143000`` (Biderman et al. 2023, section 2). `step_revisions` lists a repository's branches
and tags with ``huggingface_hub.HfApi.list_repo_refs`` (offline: the refs already in the local
cache, from ``huggingface_hub.scan_cache_dir``) and keeps the step-named ones, sorted by step.

A name is *step-named* when it ends in a step number after one of the words of `STEP_NAME`:
``step1000``, ``step_1000``, ``step-1000``, ``global_step1000``, ``checkpoint-1000``,
``ckpt_1000``, ``iter_0001000`` (Megatron), possibly after a prefix (``run1/step1000``). Tags such
as ``v1.0`` or ``main`` are not steps. Names that carry more after the step (OLMo's
``step1000-tokens4B``) are not matched: give such revisions as a list.

`check_revisions` is the bad-input check of an explicit list: every name must be a branch or a
tag of the repository, or a commit id; otherwise it raises before any file is downloaded, naming
the revisions that do exist.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from repgeom.models.hf.hub_calls import Retrier

STEP_NAME = re.compile(
    r"(?:^|[/_.-])(?:global_?)?(?:step|steps|checkpoint|ckpt|iter|iteration)[_-]?(?P<step>\d+)$",
    re.IGNORECASE,
)
"""A step-named revision: one of these words, an optional ``_``/``-``, the step, the end."""
COMMIT = re.compile(r"[0-9a-f]{7,40}")
"""A (possibly abbreviated) git commit id: accepted without listing, as the hub resolves it."""


def step_of(name: str) -> int | None:
    """The training step a revision name carries, or None when it is not step-named.

    >>> [step_of(n) for n in ("step1000", "checkpoint-20", "global_step7", "v1.0", "main")]
    [1000, 20, 7, None, None]
    """
    match = STEP_NAME.search(str(name))
    return None if match is None else int(match.group("step"))


@dataclass(frozen=True)
class Refs:
    """A repository's branch and tag names, and where they were read from."""

    repo_id: str
    branches: tuple[str, ...]
    tags: tuple[str, ...]
    source: str  # "on the hub" or "in the local cache (offline)"

    @property
    def names(self) -> list[str]:
        return list(dict.fromkeys([*self.branches, *self.tags]))


def list_refs(repo_id: str, *, retry: Retrier | None = None) -> Refs:
    """The branches and tags of model repository `repo_id`: from the hub
    (``HfApi.list_repo_refs``), or, in offline mode (``HF_HUB_OFFLINE=1``), the refs that the
    local Hugging Face cache holds for it (``scan_cache_dir``).

    The hub call goes through `repgeom.models.hf.hub_calls.Retrier` (`retry`; default: its
    15-minute budget): a 429 waits for its ``Retry-After``, a 5xx or a dropped connection is
    tried again, and the console says why it waits.

    Raises
    ------
    OSError
        The hub does not know the repository (or refuses it), the retry budget is spent, or,
        offline, the cache holds none of its refs; the message names the repository and what
        to do.
    """
    from huggingface_hub import HfApi, is_offline_mode
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    from repgeom.models.hf.hub_calls import Retrier, RetriesExhausted

    if is_offline_mode():
        return _cached_refs(repo_id)
    retry = Retrier() if retry is None else retry
    try:
        refs = retry.call(lambda: HfApi().list_repo_refs(repo_id),
                          f"hf={repo_id!r}: listing its revisions")
    except RepositoryNotFoundError as e:
        raise OSError(
            f"hf={repo_id!r}: no such model repository on the Hugging Face hub, or it is private "
            f"or gated: log in with `hf auth login` (or set HF_TOKEN), and accept its licence at "
            f"https://huggingface.co/{repo_id}: {e}"
        ) from e
    except RetriesExhausted as e:
        raise OSError(f"{e}. Rerun the same command later") from e
    except HfHubHTTPError as e:
        raise OSError(f"hf={repo_id!r}: could not list its revisions on the hub: {e}") from e
    return Refs(repo_id, tuple(r.name for r in refs.branches), tuple(r.name for r in refs.tags),
                "on the hub")


def _cached_refs(repo_id: str) -> Refs:
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        repos = scan_cache_dir().repos
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


def step_revisions(repo_id: str, refs: Refs | None = None) -> list[tuple[int, str]]:
    """(step, name) of every step-named branch or tag of `repo_id`, sorted by step.

    Where two names carry the same step (a branch and a tag ``step1000``, or ``step1000`` and
    ``checkpoint-1000``), the branch comes first and the first name in the hub's order is kept.

    Raises
    ------
    ValueError
        The repository has no step-named revision; the message lists the names it has.
    """
    refs = list_refs(repo_id) if refs is None else refs
    by_step: dict[int, str] = {}
    for name in refs.names:
        step = step_of(name)
        if step is not None:
            by_step.setdefault(step, name)
    if not by_step:
        raise ValueError(
            f"hf_revisions=all: {repo_id} has no revision named after a training step (like "
            f"step1000 or checkpoint-1000) {refs.source}; its branches and tags: "
            f"{_listing(refs.names)}. Give hf_revisions as a list, e.g. hf_revisions=[main]"
        )
    return sorted(by_step.items())


def check_revisions(repo_id: str, revisions: Sequence[str], refs: Refs | None = None) -> None:
    """Raise unless every name in `revisions` is a branch or tag of `repo_id` or a commit id.

    Raises
    ------
    ValueError
        Naming each unknown revision, its closest existing names, and the names that exist.
    """
    unknown = [r for r in revisions if not COMMIT.fullmatch(str(r))]
    if not unknown:
        return
    refs = list_refs(repo_id) if refs is None else refs
    names = refs.names
    missing = [r for r in unknown if r not in set(names)]
    if not missing:
        return
    hints = "; ".join(f"{r!r} (closest: {', '.join(_closest(r, names)) or 'none'})"
                      for r in missing)
    raise ValueError(
        f"hf_revisions: {hints} not a branch or tag of {repo_id} {refs.source}; it has "
        f"{len(names)}: {_listing(names)}. Nothing was downloaded"
    )


def _closest(name: str, names: Sequence[str], n: int = 3) -> list[str]:
    """The existing names nearest to `name`: by step when both carry one, else by spelling."""
    step = step_of(name)
    stepped = [(step_of(m), m) for m in names if step_of(m) is not None]
    if step is not None and stepped:
        return [m for _, m in sorted(stepped, key=lambda sm: (abs(sm[0] - step), sm[0]))[:n]]
    return difflib.get_close_matches(name, names, n=n, cutoff=0.3)


def _listing(names: Sequence[str], head: int = 6, tail: int = 3) -> str:
    """``a, b, c``, or for many the first and last few in step order: ``step0, ..., step143000``."""
    ordered = sorted(names, key=lambda m: (step_of(m) is None, step_of(m) or 0, m))
    if len(ordered) <= head + tail + 1:
        return ", ".join(ordered) or "none"
    return ", ".join([*ordered[:head], "...", *ordered[-tail:]])
