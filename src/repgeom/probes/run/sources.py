"""What a ``probe.py`` job names, as targets: a hub model's revisions or our checkpoints.

A source answers two questions, the same way whichever option named it:

- `steps`: the (step, where) pairs it offers, thinned by ``max_revisions`` (`schedule`);
- `targets`: the `repgeom.probes.core.targets` objects for the pairs this job probes.

`HubRevisions` is ``hf=`` (with ``hf_revisions``), `Checkpoints` is ``run=`` or ``ckpt=``.
`subjects` picks this job's share (``shard``/``shards``) and adds the final step as a reference
when a pairwise metric compares every step with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from repgeom.models.checkpoints import find_checkpoints, read_checkpoint
from repgeom.models.hf import model_stacks
from repgeom.probes.core.targets import CheckpointTarget, HFTarget
from repgeom.probes.run import schedule
from repgeom.probes.run.job import ProbeJob

T = TypeVar("T")

Found = list[tuple[int, Any]]
"""(step, where): a revision name (None: the default revision) or a checkpoint path."""
Chosen = list[tuple[int, Any, bool]]
"""(step, where, reference): the pairs to probe; `reference` marks the final step added for the
pairwise metrics (compared with, not probed, when another shard owns it)."""


@dataclass(frozen=True)
class HubRevisions:
    """``hf=<name>`` with ``hf_revisions`` (a list, ``all`` or none) and ``max_revisions``:
    one `HFTarget` per revision and stack (the encoder and the decoder of a two-stack model)."""

    repo: str
    revisions: str | tuple[str, ...] | None
    max_revisions: int | None
    retry_budget_s: float
    dtype: str | None
    tokenizer: str | None
    alias: str

    def steps(self) -> Found:
        """The revisions, listed and checked on the hub (`schedule.hub_revisions`)."""
        revisions = self.revisions
        return schedule.hub_revisions(
            self.repo, list(revisions) if isinstance(revisions, tuple) else revisions,
            max_revisions=self.max_revisions, retry_budget_s=self.retry_budget_s)

    def targets(self, found: Found, chosen: Chosen) -> list[HFTarget]:
        """`chosen`'s revisions, each stack of the model (read from the first revision)."""
        budget = self.retry_budget_s
        stacks = model_stacks(self.repo, revision=found[0][1], retry_budget_s=budget)
        return [
            HFTarget(self.repo, revision, step, dtype=self.dtype, tokenizer=self.tokenizer,
                     stack=stack, alias=self.alias, reference=reference, retry_budget_s=budget)
            for step, revision, reference in chosen
            for stack in stacks
        ]


@dataclass(frozen=True)
class Checkpoints:
    """``run=<folder>`` (its checkpoints, thinned by ``max_revisions``) or ``ckpt=<file>``
    (one): one `CheckpointTarget` per checkpoint."""

    run: str | None
    ckpt: str | None
    max_revisions: int | None
    alias: str

    def steps(self) -> Found:
        """The checkpoints and their ``global_step``; a ``ckpt=`` is read here, so a missing or
        foreign file fails before anything else starts."""
        if self.ckpt is not None:
            path = Path(self.ckpt).expanduser()
            return [(int(read_checkpoint(path)["global_step"]), path)]
        return schedule.run_checkpoints(find_checkpoints(self.run), self.max_revisions)

    def targets(self, found: Found, chosen: Chosen) -> list[CheckpointTarget]:
        """One target per chosen checkpoint."""
        return [CheckpointTarget(path, step, model=self.alias, reference=reference)
                for step, path, reference in chosen]


def shard_of(items: Sequence[T], shard: int | None, shards: int | None) -> list[T]:
    """Every `shards`-th item from index `shard` (all of them without shards): revisions spread
    evenly, early and late, over the jobs of ``probe.py -m shard=0,1,2,3 shards=4``.

    >>> shard_of(["s0", "s1", "s2", "s3", "s4"], 1, 2)
    ['s1', 's3']
    """
    if shards is None:
        return list(items)
    return list(items[shard::shards])


def source_of(job: ProbeJob) -> HubRevisions | Checkpoints:
    """The source `job` names (``hf=``, ``run=`` or ``ckpt=``)."""
    alias = job.model_name or ""
    if job.mode == "hf":
        return HubRevisions(job.hf, job.hf_revisions, job.max_revisions, job.retry_budget_s,
                            job.dtype, job.tokenizer, alias)
    return Checkpoints(job.run, job.ckpt if job.mode == "ckpt" else None, job.max_revisions,
                       alias)


def subjects(job: ProbeJob, *, reference_final: bool = False
             ) -> list[CheckpointTarget | HFTarget]:
    """What `job` names, as targets; with ``shard``/``shards`` this job's share
    (`shard_of`), plus the final step as a `reference` when `reference_final` (pairwise
    metrics compare with it) and another shard owns it."""
    source = source_of(job)
    found = source.steps()
    chosen = [(step, where, False) for step, where in
              shard_of(found, job.shard, job.shards)]
    if not chosen:
        raise ValueError(
            f"shard={job.shard} of shards={job.shards} gets none of the {len(found)} "
            f"revisions or checkpoints; use at most shards={len(found)}"
        )
    if reference_final and found[-1] not in [(step, where) for step, where, _ in chosen]:
        chosen.append((*found[-1], True))
    return source.targets(found, chosen)
