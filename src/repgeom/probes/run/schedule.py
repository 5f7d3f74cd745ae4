"""Which steps of a trajectory to probe: one thinning rule for the training probe, hub revisions
and a run's checkpoints.

Early training moves fast and late training slowly (the intrinsic dimension rises and falls
within the first few percent of the steps, Razzhigaev et al. 2023 Fig. 2), so a schedule is
log-spaced early and evenly spaced later. `thin_steps` keeps at most ``max_count`` of a list of
available steps in that shape: the first and the last, and between them the steps nearest to
targets spread evenly on a scale that is half logarithmic, half linear in the step. The
training probe's schedule (`probe_schedule`, ``probe.max_probes``) and
``probe.py``'s ``max_revisions`` (revisions of a hub model, checkpoints of a run) both use it.

``probe.py`` options (``conf/probe.yaml``), resolved by `hub_revisions` and `run_checkpoints`:

- ``hf_revisions=all``: every step-named branch or tag of the hub repository, sorted by step
  (`repgeom.models.hub.revisions.step_revisions`); ``hf_revisions=[a,b]``: those, checked to exist
  before anything is downloaded (`repgeom.models.hub.revisions.check_revisions`);
- ``max_revisions=N``: at most N of them (or of a ``run=``'s checkpoints), by `thin_steps`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from repgeom.models.hub import revisions as hub
from repgeom.models.hub.calls import budget_retrier
from repgeom.models.revision_names import list_steps

ALL = "all"
"""``hf_revisions=all``: every step-named revision of the repository."""


def thin_steps(steps: Sequence[int], max_count: int | None, *, option: str = "max_count"
               ) -> list[int]:
    """At most `max_count` of `steps`: first and last, log-spaced early, evenly spaced later.

    Each step gets a position ``u = (L + E) / 2`` in [0, 1], the mean of its log position
    ``L = log(s / s₁) / log(s_last / s₁)`` (``s₁`` the first positive step; 0 below it) and its
    linear position ``E = (s − s_first) / (s_last − s_first)``; `max_count` targets are spread
    evenly over [0, 1] and each takes the free step nearest in ``u``. Half the density is thus
    log-spaced (many early steps, as early training moves fast) and half even (the late steps
    are not starved), and the result has no near-duplicates.

    Parameters
    ----------
    steps : sequence of int
        The available steps (any order; duplicates count once), >= 0.
    max_count : int or None
        How many to keep, at least 2 (the first and the last step); None keeps all.
    option : str
        The option's name in the error message (``probe.max_probes``, ``max_revisions``).

    Returns
    -------
    list of int
        Sorted; exactly ``min(max_count, len(set(steps)))`` steps, the first and last included.

    Examples
    --------
    >>> pythia = [0, *[2**i for i in range(10)], *range(1000, 143001, 1000)]  # 154 revisions
    >>> thin_steps(pythia, 10)
    [0, 16, 256, 2000, 13000, 33000, 58000, 86000, 114000, 143000]
    """
    if max_count is not None and max_count < 2:
        raise ValueError(f"{option} must be >= 2 (first and last step), got {max_count}")
    ordered = sorted({int(s) for s in steps})
    if max_count is None or len(ordered) <= max_count:
        return ordered
    s = np.asarray(ordered, dtype=float)
    first, last = s[0], s[-1]
    linear = (s - first) / (last - first)
    s1 = s[s > 0][0]
    log = np.log(np.maximum(s, s1) / s1) / np.log(last / s1) if s1 < last else linear
    position = (log + linear) / 2
    free = list(range(1, len(s) - 1))
    chosen = [0, len(s) - 1]
    for target in np.linspace(0.0, 1.0, max_count)[1:-1]:
        nearest = min(free, key=lambda i: abs(position[i] - target))  # the earlier on a tie
        free.remove(nearest)
        chosen.append(nearest)
    return [ordered[i] for i in sorted(chosen)]


def probe_schedule(
    max_steps: int,
    *,
    every_n_steps: int,
    log_spaced_until: int,
    n_log_spaced: int,
    max_probes: int | None = None,
) -> list[int]:
    """The training steps at which to probe: 0, log-spaced early, evenly spaced later, the end.

    Early training moves fast, so `n_log_spaced` steps are spread geometrically over
    [1, log_spaced_until]; after that every `every_n_steps`-th step is probed, and `max_steps`
    itself. With `max_probes`, the list is thinned by `thin_steps` (the first and last
    step kept, log-spaced early and even later), the rule ``probe.py max_revisions=`` uses.
    """
    if max_steps < 1:
        raise ValueError(f"trainer.max_steps must be set (> 0) to schedule probes, got {max_steps}")
    if every_n_steps < 1:
        raise ValueError(f"probe.every_n_steps must be >= 1, got {every_n_steps}")
    steps = {0, max_steps}
    until = min(log_spaced_until, max_steps)
    if until >= 1 and n_log_spaced > 0:
        steps |= {int(s) for s in np.unique(np.round(np.geomspace(1, until, n_log_spaced)))}
    steps |= set(range(every_n_steps, max_steps + 1, every_n_steps))
    ordered = sorted(steps)
    return thin_steps(ordered, max_probes, option="probe.max_probes")


def check_options(hf_revisions: Any, max_revisions: Any, mode: str) -> None:
    """Raise ValueError on a bad ``hf_revisions``/``max_revisions`` before anything runs."""
    if isinstance(hf_revisions, str) and hf_revisions != ALL:
        raise ValueError(
            f"hf_revisions={hf_revisions!r}: give 'all' (every step-named branch or tag) or a "
            "list, e.g. hf_revisions=[step1000,step143000]"
        )
    if max_revisions is None:
        return
    if isinstance(max_revisions, bool) or not isinstance(max_revisions, int) or max_revisions < 2:
        raise ValueError(
            f"max_revisions must be an integer >= 2 (the first and last are kept) or null, got "
            f"{max_revisions!r}"
        )
    if mode == "ckpt" or (mode == "hf" and not hf_revisions):
        raise ValueError(
            f"max_revisions thins a trajectory: it needs run=<train run folder> or hf=<name> "
            f"with hf_revisions=all or a list (got {mode}= alone)"
        )


def check_shard(shard: Any, shards: Any, mode: str) -> None:
    """Raise ValueError on a bad ``shard``/``shards`` pair before anything runs."""
    if shard is None and shards is None:
        return
    if shard is None or shards is None:
        raise ValueError(
            f"give shard= and shards= together (got shard={shard}, shards={shards}); e.g. "
            "python probe.py -m hf=... hf_revisions=all shard=0,1,2,3 shards=4"
        )
    for name, value in (("shard", shard), ("shards", shards)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if not 0 <= shard < shards:
        raise ValueError(f"shard={shard} must lie in 0..shards-1 = 0..{shards - 1}")
    if mode == "ckpt":
        raise ValueError("shards split a trajectory: give run=<train run folder> or hf=<name> "
                         "with hf_revisions, not ckpt=")


def hub_revisions(repo: str, hf_revisions: Any, *, max_revisions: int | None = None,
                  retry_budget_s: float | None = None) -> list[tuple[int, str | None]]:
    """(step, revision) of each revision of hub model `repo` that ``hf_revisions`` names,
    thinned on their training steps by `thin_steps`.

    ``None``/``[]``: ``[(0, None)]`` (the default revision). ``"all"``: the step-named branches
    and tags sorted by step, ending on ``main`` when no step-named revision holds its weights
    (`repgeom.models.hub.revisions.step_revisions`; the names left out are printed). A list: as
    given, each checked to be a branch, a tag or a commit id of `repo` first, with the steps of
    `repgeom.models.revision_names.list_steps`. Nothing is downloaded here; the hub calls share one
    retry budget, `retry_budget_s` (``retry_budget_s=``; None: the default).

    Raises
    ------
    ValueError
        An unknown revision; ``all`` on a repository without step-named revisions; a list whose
        steps cannot be read; or a local folder named `repo` (its files would be read for every
        revision). Each message names what to do.
    """
    if not hf_revisions:
        return [(0, None)]
    if os.path.exists(os.path.expanduser(repo)):
        raise ValueError(
            f"hf={repo!r} is a local folder here, and hf_revisions={hf_revisions} asks for "
            "revisions of a hub repository: a folder has one revision, and its files would be "
            "probed at every step. Drop hf_revisions to probe the folder, or run from another "
            "folder (or rename it) to probe the hub repository"
        )
    retry = budget_retrier(retry_budget_s)
    if hf_revisions == ALL:
        listing = hub.step_revisions(repo, retry=retry)
        for line in listing.report():
            print(line)
        if listing.final_main:
            print(f"hf_revisions=all: main holds weights no step-named revision has; probed as "
                  f"the final checkpoint, step {listing.found[-1][0]} in the table")
        found = listing.found
    else:
        names = [str(r) for r in hf_revisions]
        hub.check_revisions(repo, names, retry=retry)
        found = list_steps(names)
    kept = set(thin_steps([s for s, _ in found], max_revisions, option="max_revisions"))
    return [(step, name) for step, name in found if step in kept]


def run_checkpoints(found: Sequence[tuple[int, Any]], max_revisions: int | None
                    ) -> list[tuple[int, Any]]:
    """``run=``'s (step, checkpoint) pairs thinned to at most `max_revisions` by `thin_steps`."""
    kept = set(thin_steps([s for s, _ in found], max_revisions, option="max_revisions"))
    return [(step, path) for step, path in found if step in kept]
