"""The revisions of a Hugging Face hub repository that are training checkpoints.

Public training trajectories are published as hub revisions named after their step: Pythia's
branches ``step0``, ``step1``, ``step2``, ``step4`` ... ``step512``, then every 1,000 steps to
``step143000`` (Biderman et al. 2023, section 2). `step_revisions` lists a repository's branches
and tags with ``huggingface_hub.HfApi.list_repo_refs`` (offline: the refs already in the local
cache, from ``huggingface_hub.scan_cache_dir``) and keeps the step-named ones, sorted by step.

`step_of` is the one parser of a step from a revision name. A name is *step-named* when it
carries a step number after one of the words of `STEP_NAME`:

- Pythia ``step1000``, also ``step_1000``, ``step-1000``, ``checkpoint-1000``;
- Bloom ``global_step1000``; ``ckpt_1000``; Megatron ``iter_0001000``;
- OLMo ``step1000-tokens4B``, OLMo-2 and OLMo-3 ``stage1-step140000-tokens294B`` (the token
  count after the step is allowed; `stage_of` reads the stage), SmolLM3 ``stage1-step-40000``;
- possibly after a prefix (``run1/step1000``).

Tags such as ``v1.0`` are not steps. ``main`` is the final checkpoint: `hf_revisions=all` ends
on it when no step-named revision holds its weights (`final_main`), and in a list it stands
after every named step. Names that carry no step are counted and listed (`Listing.ignored`),
never dropped in silence.

`check_revisions` is the bad-input check of an explicit list: every name must be a branch or a
tag of the repository, or a commit id; otherwise it raises before any file is downloaded, naming
the revisions that do exist.
"""

from __future__ import annotations

import contextlib
import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from repgeom.models.hub.calls import Retrier

STEP_NAME = re.compile(
    r"(?:^|[/_.-])(?:global_?)?(?:step|steps|checkpoint|ckpt|iter|iteration)[_-]?(?P<step>\d+)"
    r"(?:[_-]tokens?\d+(?:\.\d+)?[kmbt]?)?$",
    re.IGNORECASE,
)
"""A step-named revision: one of these words, an optional ``_``/``-``, the step, optionally
OLMo's token count (``-tokens4B``), the end."""
STAGE = re.compile(r"(?:^|[/_.-])stage[_-]?(?P<stage>\d+)(?=[/_.-])", re.IGNORECASE)
"""OLMo-2's training stage before the step: ``stage1-step1000-tokens3B``."""
MAIN = "main"
"""The default branch: the final checkpoint of a trajectory."""
COMMIT = re.compile(r"[0-9a-f]{7,40}")
"""A (possibly abbreviated) git commit id: accepted without listing, as the hub resolves it."""


def step_of(name: str) -> int | None:
    """The training step a revision name carries, or None when it is not step-named.

    >>> [step_of(n) for n in ("step1000", "checkpoint-20", "global_step7", "v1.0", "main")]
    [1000, 20, 7, None, None]
    >>> [step_of(n) for n in ("step1000-tokens4B", "stage1-step140000-tokens294B", "iter_0002")]
    [1000, 140000, 2]
    """
    match = STEP_NAME.search(str(name))
    return None if match is None else int(match.group("step"))


def stage_of(name: str) -> int:
    """OLMo-2's training stage in a step-named revision (``stage2-...`` -> 2); 1 without one.

    >>> [stage_of(n) for n in ("stage1-step10-tokens1B", "stage2-ingredient1-step5-tokens1B",
    ...                        "step10")]
    [1, 2, 1]
    """
    match = STAGE.search(str(name))
    return 1 if match is None else int(match.group("stage"))


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
    """The branches and tags of model repository `repo_id`: from the hub
    (``HfApi.list_repo_refs``), or, in offline mode (``HF_HUB_OFFLINE=1``), the refs that the
    local Hugging Face cache holds for it (``scan_cache_dir``).

    The hub call is bounded (`repgeom.models.hub.calls.watch_session`: huggingface_hub's
    session has no timeout and ``list_repo_refs`` passes none) and goes through `retry` (the
    run's `repgeom.models.hub.calls.Retrier`; default: its 15-minute budget): a 429 waits for
    its ``Retry-After``, a 5xx, a dropped or silent connection is tried again, and the console
    says why it waits.

    Raises
    ------
    OSError
        The hub does not know the repository (or refuses it), the retry budget is spent, or,
        offline, the cache holds none of its refs; the message names the repository, the hub
        and what to do.
    """
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


@dataclass
class Listing:
    """What `step_revisions` found: (step, name) sorted by step, and every name it left out.

    ``ignored`` maps a reason to the names it covers (tags without a step, a second name for one
    step, a later OLMo stage); `report` says them in one line each, so that nothing is dropped
    in silence. ``final_main`` is set when ``main`` was added as the final checkpoint.
    """

    found: list[tuple[int, str]]
    ignored: dict[str, list[str]]
    final_main: bool = False

    def report(self) -> list[str]:
        """One console line per reason a name was left out."""
        return [f"hf_revisions=all: {len(names)} name(s) left out, {reason}: {_listing(names)}"
                for reason, names in self.ignored.items() if names]


def run_of(name: str) -> str:
    """The run a step-named revision belongs to: its name before the step (``stage1`` of
    ``stage1-step1000-tokens3B``, ``stage2-ingredient1`` of ``stage2-ingredient1-step500``,
    ``""`` of ``step150-tokens1B``).

    >>> [run_of(n) for n in ("stage2-ingredient1-step5-tokens1B", "stage1-step-40", "step150")]
    ['stage2-ingredient1', 'stage1', '']
    """
    match = STEP_NAME.search(str(name))
    return "" if match is None else str(name)[:match.start()]


def _continuing_stages(stepped: Sequence[tuple[str, int | None]]) -> tuple[set[str], int, str]:
    """The runs (`run_of`) of one trajectory, its first stage's last step, and why the runs
    after it are left out.

    From the first stage, each next stage joins whose steps go on from the last step of the
    stages before it (SmolLM3's ``stage2-step-3480000`` after ``stage1-step-3440000``), up to
    the first stage that counts its steps anew (OLMo-2's ``stage2-ingredient1-step500`` after
    ``stage1-step928000``) or that has several runs side by side (``stage2-ingredient1`` and
    ``stage2-ingredient2``, whose steps would interleave)."""
    runs: dict[int, dict[str, list[int]]] = {}
    for name, step in stepped:
        if step is not None and STAGE.search(name):
            runs.setdefault(stage_of(name), {}).setdefault(run_of(name), []).append(step)
    kept: set[str] = set()
    first_last, last, last_stage, reason = -1, -1, 0, ""
    for i, stage in enumerate(sorted(runs)):
        steps = [step for run in runs[stage].values() for step in run]
        if kept and min(steps) < last:
            reason = (f"a later training stage than stage {last_stage} (steps counted anew: "
                      "give them as a list)")
            break
        if len(runs[stage]) > 1:
            reason = (f"stage {stage} or later: stage {stage} has {len(runs[stage])} runs side "
                      f"by side ({', '.join(sorted(runs[stage]))}) whose steps would interleave "
                      "(give one of them as a list)")
            break
        kept |= set(runs[stage])
        last, last_stage = max(steps), stage
        if i == 0:
            first_last = last
    return kept, first_last, reason


def step_revisions(repo_id: str, refs: Refs | None = None, *,
                   retry: Retrier | None = None) -> Listing:
    """Every step-named branch or tag of `repo_id`, sorted by step (`Listing`).

    Where two names carry the same step (a branch and a tag ``step1000``, or ``step1000`` and
    ``checkpoint-1000``), the branch comes first and the first name in the hub's order is kept.
    Where names carry stages (``stage1-...``), a later stage joins the trajectory when its steps
    go on from the stages before it (SmolLM3: ``stage1-step-40000`` ... ``stage2-step-3480000``
    ..., one count of steps over its three pre-training stages), and from the first stage that
    counts its steps from 0 again (OLMo-2's ``stage2-ingredient1-...``: stage 2 anneals from
    stage 1 in several parallel runs) or that has several runs side by side (``stage2-ingredient1``
    and ``stage2-ingredient2`` continuing stage 1's count: their steps would interleave) the later
    stages are listed as left out (give them as a list). A bare step name beside staged ones
    (OLMo-2-1124-7B's ``step150-tokens1B`` beside ``stage1-step1000-tokens5B``) counts as the
    first stage when its step is at or below that stage's last step; it and any other name
    without a stage (SmolLM3's ``lc-step-4000``, whose count is not known) are otherwise left out.
    ``main`` ends the trajectory when no step-named revision holds its weights (`final_main`).

    Every hub call (the listing, the file lists of ``main`` and the last step) goes through
    `retry`, the run's one retry budget.

    Raises
    ------
    ValueError
        The repository has no step-named revision; the message lists the names it has.
    OSError
        A hub call failed (`list_refs`).
    """
    from repgeom.models.hub.calls import budget_retrier

    retry = budget_retrier(retry=retry)
    refs = list_refs(repo_id, retry=retry) if refs is None else refs
    ignored: dict[str, list[str]] = {}
    stepped = [(name, step_of(name)) for name in refs.names]
    staged = any(STAGE.search(n) for n, s in stepped if s is not None)
    runs, first_last, later = _continuing_stages(stepped) if staged else (set(), -1, "")
    by_step: dict[int, str] = {}
    for name, step in stepped:
        if step is None:
            if name != MAIN:
                ignored.setdefault("no training step in the name", []).append(name)
        elif not staged or run_of(name) in runs:
            if step in by_step:
                ignored.setdefault("a second name for a step already listed", []).append(name)
            else:
                by_step[step] = name
        elif STAGE.search(name) is not None:
            ignored.setdefault(later, []).append(name)
        elif run_of(name) == "" and step <= first_last:
            # OLMo-2-1124-7B's step150-tokens1B beside stage1-step0-tokens0B and
            # stage1-step1000-tokens5B: a bare step within the first stage's steps is that stage's
            by_step.setdefault(step, name)
            if by_step[step] != name:
                ignored.setdefault("a second name for a step already listed", []).append(name)
        else:
            ignored.setdefault("no stage in the name, beside names with one (which stage's "
                               "steps it counts is not known: give it in a list)",
                               []).append(name)
    if not by_step:
        raise ValueError(
            f"hf_revisions=all: {repo_id} has no revision named after a training step (like "
            f"step1000 or checkpoint-1000) {refs.source}; its branches and tags: "
            f"{_listing(refs.names)}. Give hf_revisions as a list, e.g. hf_revisions=[main]"
            + "".join(f"; {len(names)} left out, {reason}" for reason, names in ignored.items()
                      if reason == later)
        )
    listing = Listing(sorted(by_step.items()), ignored)
    if MAIN in refs.branches:
        _add_main(repo_id, listing, refs, retry)
    return listing


def _add_main(repo_id: str, listing: Listing, refs: Refs, retry: Retrier) -> None:
    """Append ``main`` as the final checkpoint unless a step-named revision holds its weights.

    Same commit as a step-named revision (no request), or the same weights files by the hub's
    LFS sha256 as the last step-named revision (two ``model_info`` requests, nothing
    downloaded; compared on a weights format both have, so a ``main`` with the safetensors
    conversion of the last step's ``.bin`` is that step): ``main`` is that checkpoint and is left
    out. Offline, both are read from the cache. A ``main`` without weights is left
    out. Otherwise it is the final checkpoint, one step after the last named one (its real step
    is not in its name), and `Listing.final_main` says so.
    """
    commits = dict(refs.commits)
    last_step, last = listing.found[-1]
    named = {commits.get(name) for _, name in listing.found} - {None}
    if commits.get(MAIN) in named:
        listing.ignored.setdefault("main: the commit of a step-named revision", []).append(MAIN)
        return
    from repgeom.models.hub.weights_rule import same_weights

    main_weights = weights_sha256(repo_id, MAIN, retry=retry)
    if not main_weights:
        listing.ignored.setdefault("main: no weights files", []).append(MAIN)
    elif same_weights(main_weights, weights_sha256(repo_id, last, retry=retry)):
        listing.ignored.setdefault(f"main: the weights of {last}", []).append(MAIN)
    else:
        listing.found.append((last_step + 1, MAIN))
        listing.final_main = True


def weights_sha256(repo_id: str, revision: str | None, *,
                   retry: Retrier | None = None) -> dict[str, str]:
    """Weights file name -> sha256 of `revision`, for every complete weights format by the one
    rule (`repgeom.models.hub.weights_rule`): online, the hub's LFS sha256 from ``model_info``
    (and its index, when sharded; nothing else is downloaded), through `retry`; offline, the
    cached snapshot's files (empty when it is not cached). Empty when the revision has no
    weights file.

    Raises
    ------
    OSError
        A hub call failed; the message names the hub and what to do.
    """
    from huggingface_hub import is_offline_mode

    from repgeom.models.hub import downloads
    from repgeom.models.hub.calls import budget_retrier
    from repgeom.models.hub.weights_rule import folder_weights

    if is_offline_mode():
        cached = downloads.cached_snapshot(repo_id, revision)
        return {} if cached is None else downloads.local_hashes(cached, folder_weights(cached))
    retry = budget_retrier(retry=retry)
    what = f"hf={repo_id!r}: the file list of {revision}"
    with _hub_errors(repo_id, f"reading the file list of {revision}"):
        info = downloads.file_list(repo_id, revision, retry, what)
        return downloads.weights_lfs_sha256(info, downloads.hub_weights(repo_id, info, retry))


def list_steps(names: Sequence[str]) -> list[tuple[int, str]]:
    """(step, name) of an explicit ``hf_revisions`` list, in the order given.

    Each name's step is `step_of`'s; ``main`` comes after the largest named step. A list in
    which no name carries a step (``[v1, v2]``) is numbered 0, 1, ... in the given order.

    Raises
    ------
    ValueError
        Some names carry a step and others do not (other than ``main``), or two names carry the
        same step: the message names them.

    >>> list_steps(["step1000", "step8000", "main"])
    [(1000, 'step1000'), (8000, 'step8000'), (8001, 'main')]
    >>> list_steps(["v1", "v2"])
    [(0, 'v1'), (1, 'v2')]
    """
    names = [str(n) for n in names]
    steps = {name: step_of(name) for name in names}
    if all(step is None for step in steps.values()):
        return [(i, name) for i, name in enumerate(names)]
    unparsed = [n for n, step in steps.items() if step is None and n != MAIN]
    if unparsed:
        raise ValueError(
            f"hf_revisions: {', '.join(unparsed)} carry no training step in the name, and the "
            f"others do ({_listing([n for n in names if steps[n] is not None])}); the table "
            "needs a step for each revision: give only step-named revisions (and main), or only "
            "names without steps (probed in the order given as steps 0, 1, ...)"
        )
    last = max(s for s in steps.values() if s is not None)
    steps = {n: (last + 1 if s is None else s) for n, s in steps.items()}
    seen: dict[int, list[str]] = {}
    for name in dict.fromkeys(names):
        seen.setdefault(steps[name], []).append(name)
    twice = {step: group for step, group in seen.items() if len(group) > 1}
    if twice:
        raise ValueError(
            "hf_revisions: "
            + "; ".join(f"{' and '.join(g)} carry the same step {s}" for s, g in twice.items())
            + ": keep one of each"
        )
    return [(steps[name], name) for name in dict.fromkeys(names)]


def check_revisions(repo_id: str, revisions: Sequence[str], refs: Refs | None = None, *,
                    retry: Retrier | None = None) -> None:
    """Raise unless every name in `revisions` is a branch or tag of `repo_id` or a commit id.

    Raises
    ------
    ValueError
        Naming each unknown revision, its closest existing names, and the names that exist.
    """
    unknown = [r for r in revisions if not COMMIT.fullmatch(str(r))]
    if not unknown:
        return
    refs = list_refs(repo_id, retry=retry) if refs is None else refs
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
