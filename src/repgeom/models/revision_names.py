"""Which hub revisions make a training trajectory: revision names -> training steps.

Rules of names only: nothing here calls the Hugging Face hub. `repgeom.models.hub.revisions`
lists a repository's branches and tags (online or from the local cache) and hands the names
to `trajectory` and `check_names`.

Public training trajectories are published as hub revisions named after their step: Pythia's
branches ``step0``, ``step1``, ``step2``, ``step4`` ... ``step512``, then every 1,000 steps to
``step143000`` (Biderman et al. 2023, section 2). `trajectory` keeps the step-named ones of a
repository's names, sorted by step.

`step_of` is the one parser of a step from a revision name. A name is *step-named* when it
carries a step number after one of the words of `STEP_NAME`:

- Pythia ``step1000``, also ``step_1000``, ``step-1000``, ``checkpoint-1000``;
- Bloom ``global_step1000``; ``ckpt_1000``; Megatron ``iter_0001000``;
- OLMo ``step1000-tokens4B``, OLMo-2 ``stage1-step140000-tokens294B`` (the token count after
  the step is allowed; `stage_of` reads the stage), OLMo-3 ``stage1-step1413814``, SmolLM3
  ``stage1-step-40000``;
- possibly after a prefix (``run1/step1000``).

Tags such as ``v1.0`` are not steps. ``main`` is the final checkpoint: `hf_revisions=all` ends
on it when no step-named revision holds its weights (`Listing.final_main`, decided by
`repgeom.models.hub.revisions.step_revisions` from the hub's hashes), and in a list it stands
after every named step (`list_steps`). Names that carry no step are counted and listed
(`Listing.ignored`), never dropped in silence.

`check_names` is the bad-input check of an explicit list: every name must be a branch or a tag
of the repository, or a commit id; otherwise it raises, naming the revisions that do exist.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass
class Listing:
    """What `step_revisions` found: (step, name) sorted by step, and every name it left out.

    ``ignored`` maps a reason to the names it covers (tags without a step, a second name for one
    step, a later OLMo stage); `report` says them in one line each, so that nothing is dropped
    in silence. ``final_main`` is set when ``main`` was added as the final checkpoint;
    ``stages_left_out`` is the reason step-named revisions of other training stages were left
    out (a later stage, or a name without a stage beside staged ones; "" when none were).
    """

    found: list[tuple[int, str]]
    ignored: dict[str, list[str]]
    final_main: bool = False
    stages_left_out: str = ""

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
                      "give one stage at a time as a list)")
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


UNSTAGED = ("no stage in the name, beside names with one (which stage's steps it counts is not "
            "known: give it in a list)")
"""Why a step-named name without a stage is left out beside staged ones (`trajectory`)."""


def trajectory(names: Sequence[str], source: str, repo_id: str) -> Listing:
    """Every step-named name of `names` (the branches, then the tags, of repository
    `repo_id`, read `source`: ``"on the hub"`` or ``"in the local cache (offline)"``), sorted
    by step (`Listing`); ``main`` is not added here.

    Where two names carry the same step (a branch and a tag ``step1000``, or ``step1000`` and
    ``checkpoint-1000``), the branch comes first and the first name in the hub's order is kept.
    Where names carry stages (``stage1-...``), a later stage joins the trajectory when its steps
    go on from the stages before it (SmolLM3: ``stage1-step-40000`` ... ``stage2-step-3480000``
    ..., one count of steps over its three pre-training stages), and from the first stage that
    counts its steps from 0 again (OLMo-2's ``stage2-ingredient1-...``: stage 2 anneals from
    stage 1 in several parallel runs) or that has several runs side by side (``stage2-ingredient1``
    and ``stage2-ingredient2`` continuing stage 1's count: their steps would interleave) the later
    stages are listed as left out (give one at a time as a list). A bare step name beside staged
    ones (OLMo-2-1124-7B's ``step150-tokens1B`` beside ``stage1-step1000-tokens5B``) counts as the
    first stage when its step is at or below that stage's last step; it and any other name
    without a stage (SmolLM3's ``lc-step-4000``, whose count is not known) are otherwise left out.

    Raises
    ------
    ValueError
        The names hold no step-named revision; the message lists them.
    """
    names = list(dict.fromkeys(names))
    ignored: dict[str, list[str]] = {}
    stepped = [(name, step_of(name)) for name in names]
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
            ignored.setdefault(UNSTAGED, []).append(name)
    if not by_step:
        raise ValueError(
            f"hf_revisions=all: {repo_id} has no revision named after a training step (like "
            f"step1000 or checkpoint-1000) {source}; its branches and tags: "
            f"{_listing(names)}. Give hf_revisions as a list, e.g. hf_revisions=[main]"
            + "".join(f"; {len(names)} left out, {reason}" for reason, names in ignored.items()
                      if reason == later)
        )
    other_stages = [reason for reason in (later, UNSTAGED) if ignored.get(reason)]
    return Listing(sorted(by_step.items()), ignored,
                   stages_left_out=other_stages[0] if other_stages else "")


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


def check_names(revisions: Sequence[str], names: Sequence[str], source: str,
                repo_id: str) -> None:
    """Raise unless every name in `revisions` is one of `names` (the branches and tags of
    `repo_id`, read `source`) or a commit id.

    Raises
    ------
    ValueError
        Naming each unknown revision, its closest existing names, and the names that exist.
    """
    names = list(names)
    known = set(names)
    missing = [r for r in revisions if not COMMIT.fullmatch(str(r)) and r not in known]
    if not missing:
        return
    hints = "; ".join(f"{r!r} (closest: {', '.join(_closest(r, names)) or 'none'})"
                      for r in missing)
    raise ValueError(
        f"hf_revisions: {hints} not a branch or tag of {repo_id} {source}; it has "
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
