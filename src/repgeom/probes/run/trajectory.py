"""probe.py's loop over a trajectory: every revision or checkpoint, streamed with bounded disk and
memory, resumable after a kill.

For each step (one revision or checkpoint; both stacks of an encoder-decoder model together):

1. **files**: a hub revision's files come from the user's cache (when complete), or are
   downloaded into a folder that repgeom creates and marks as this run's, inside
   ``<output_dir>/work/`` or ``work_dir=`` (`repgeom.models.hub.downloads`: ownership, retries,
   resumed partial files), while the step before is probed (one daemon thread: at most two
   revisions' weights on disk, and Ctrl-C does not wait for it), and are deleted once probed
   (``keep_weights=true`` keeps them, and records that in their marker, so that no later run
   deletes them);
2. **probe**: the target loads the model, draws its probe set and measures it;
3. **rows**: its rows and, with pairwise metrics, each layer against the same layer of the final
   step go to the table in one atomic write (`sink.write_step`). The final step is probed first:
   only its states are kept on disk (``probes/states/``), every other step's are compared and
   dropped, so the states on disk are one step's however long the trajectory;
4. **costs**: seconds downloading, loading, in the forward passes and in the metrics, the bytes
   downloaded and the resident memory after the step, in ``probes/timings.csv`` and W&B
   (`repgeom.probes.run.costs`).

Resume (`repgeom.probes.run.resume`): a step whose rows are all in the table is skipped, so the
same command after a kill starts at the step that was in flight and ends with the table an
uninterrupted run writes. The table and ``skipped.json`` are fsynced before they are renamed
into place.

A step that cannot be probed is skipped, and the trajectory goes on: a revision without weights
or not on the hub (`repgeom.models.hub.calls.RevisionUnavailable`), or whose weights fail to
load. It is named in the console, in ``probes/skipped.json`` (revision, step and reason, which
``probe_info.json`` and the summary repeat), and a rerun leaves it out unless
``retry_skipped=true``. A hub that does not answer within the retry budget, or refuses (HTTP
401/403), while a step loads (a hub ``tokenizer=``'s files), or a full disk, ends the run
instead, as it does a download: a rerun probes the step.

Revisions that serve the same weights are found from each step's weights sha256 at the end, and
their rows marked (`repgeom.probes.run.copies`).
"""

from __future__ import annotations

import gc
import json
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from repgeom.console import first_line
from repgeom.models.hub.calls import RETRY_BUDGET_S, RevisionUnavailable, not_the_revisions_fault
from repgeom.models.hub.download_folders import RevisionFiles, clear_leftovers, release
from repgeom.models.hub.downloads import fetch_revision
from repgeom.probes.core import catalogue, table
from repgeom.probes.core.pairwise import similarity
from repgeom.probes.core.prediction import tokens
from repgeom.probes.core.spec import ProbeRequest
from repgeom.probes.report import sink
from repgeom.probes.run import copies, costs, resume
from repgeom.probes.run.prefetch import Prefetch

WORK_DIR = "work"
"""Downloaded revisions inside the output folder (unless ``work_dir=``)."""


@dataclass
class Step:
    """The targets of one step: one per stack, sharing one revision's files."""

    subjects: list
    files: Future | None = None

    @property
    def step(self) -> int:
        return self.subjects[0].step

    @property
    def reference(self) -> bool:
        return self.subjects[0].reference


def steps_of(subjects: Sequence) -> list[Step]:
    """Group the targets by step (an encoder-decoder revision is two targets), in order."""
    grouped: dict[tuple, Step] = {}
    for subject in subjects:
        key = (subject.step, getattr(subject, "revision", None), str(getattr(subject, "path", "")))
        grouped.setdefault(key, Step([])).subjects.append(subject)
    return list(grouped.values())


def label(step: Step) -> str:
    """A step's name in the console and in ``skipped.json``: its revision, else its step."""
    revision = getattr(step.subjects[0], "revision", None)
    return str(revision) if revision else f"step {int(step.step)}"


@dataclass
class Trajectory:
    """What the loop needs besides the targets (`run`)."""

    request: ProbeRequest
    device: torch.device
    output_dir: Path
    loggers: list = field(default_factory=list)
    work_dir: Path | None = None
    keep_weights: bool = False
    pairwise: bool = False
    stack_dir: Callable[[Path, str | None], Path] = lambda folder, stack: folder
    prefix: Callable[[str | None], str] = lambda stack: "probe"
    warnings: list[str] = field(default_factory=list)
    settings: object = None
    retry_skipped: bool = False
    retry_budget_s: float = RETRY_BUDGET_S
    skipped: dict[str, dict] = field(default_factory=dict)
    """`step_key` (as text) -> {step, revision, model, reason} of every step not probed."""
    copies: dict[str, str] = field(default_factory=dict)
    """Revision -> the revision whose weights it serves (`mark_copies`)."""
    _final: int | None = None
    _many_steps: bool = False

    def mark_copies(self) -> dict[str, str]:
        """Mark the revisions that serve another's weights (`copies.mark_copies`), keep its
        warnings; returns {copy: original}."""
        self.copies, messages = copies.mark_copies(self.output_dir)
        self.warnings += messages
        return self.copies

    def _fetch(self, step: Step, abort=None) -> RevisionFiles | None:
        subject = step.subjects[0]
        if getattr(subject, "source", "") != "hf":
            return None
        work = self.work_dir or self.output_dir / WORK_DIR
        return fetch_revision(subject.name, subject.revision, work, owner=self.output_dir,
                              abort=abort, retry_budget_s=self.retry_budget_s,
                              keep_weights=self.keep_weights)

    def run(self, subjects: Sequence) -> pd.DataFrame:
        """Probe every target (see the module docstring); returns the whole table."""
        costs.system_arrow_pool()
        steps = steps_of(subjects)
        self._final, self._many_steps = steps[-1].step, len(steps) > 1
        if self.pairwise:  # the final step first: every other step is compared with it
            steps = [steps[-1], *steps[:-1]]
        done = resume.done_steps(self.output_dir, getattr(self.request, "texts", None))
        self.skipped = resume.read_skipped(self.output_dir)
        todo = [s for s in steps if not self._complete(s, done)]
        frame = table.rows_to_frame([])
        if len(todo) < len(steps):
            print(f"Resuming: {len(steps) - len(todo)} of {len(steps)} steps already in "
                  f"{table.probe_dir(self.output_dir)}")
        before = [s for s in todo if label(s) in self.skipped]
        if before and not self.retry_skipped:
            todo = [s for s in todo if label(s) not in self.skipped]
            print(f"Skipped again, as in an earlier run ({table.probe_dir(self.output_dir)}/"
                  f"{resume.SKIPPED}): {', '.join(label(s) for s in before)}; "
                  "retry_skipped=true tries them")
        self._clear_leftovers(todo)
        if len(todo) > 1:  # one bar for the whole trajectory, not one per file and model
            from huggingface_hub.utils import disable_progress_bars
            from transformers.utils import logging as transformers_logging

            disable_progress_bars()
            transformers_logging.disable_progress_bar()
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="Probing steps", unit="step", disable=len(todo) < 2)
        started = time.perf_counter()
        with Prefetch() as pool:  # Ctrl-C does not wait for the download in flight
            for i, step in enumerate(todo):
                if step.files is None:
                    step.files = pool.submit(self._fetch, step, pool.abort)
                if i + 1 < len(todo):  # the next revision downloads while this one is probed
                    todo[i + 1].files = pool.submit(self._fetch, todo[i + 1], pool.abort)
                frame = self._probe_step(step, started)
                bar.update()
        bar.close()
        marked = self.mark_copies()
        if (frame.empty or marked) and table.probe_dir(self.output_dir).is_dir():
            frame = resume.read_for_resume(self.output_dir)
        if self.skipped:
            print(f"Not probed ({len(self.skipped)}): " + "; ".join(
                f"{k}: {v['reason']}" for k, v in self.skipped.items()))
        return frame

    def _clear_leftovers(self, todo: list[Step]) -> None:
        """Delete the downloads a killed run of this output folder left, but the revisions
        still to probe (their partial files resume) and those a run with ``keep_weights=true``
        downloaded (their marker says so). Only folders repgeom made and marked for this run are
        candidates (`repgeom.models.hub.download_folders.clear_leftovers`): a user's files in
        ``work_dir``, and other jobs' downloads there, are never touched."""
        work = self.work_dir or self.output_dir / WORK_DIR
        keep = [(getattr(s.subjects[0], "name", ""), getattr(s.subjects[0], "revision", None))
                for s in todo]
        clear_leftovers(work, self.output_dir, keep)

    def _complete(self, step: Step, done: set[tuple[str, int]]) -> bool:
        """All of the step's rows are in the table (and, for the final step of a pairwise
        probe, its states are saved: the other steps compare with them)."""
        if self.pairwise and step.step == self._final:
            for subject in step.subjects:
                folder = self.stack_dir(table.probe_dir(self.output_dir), subject.stack)
                if step.step not in similarity.saved_steps(folder):
                    return False
        return step.reference or all(resume.step_key(s) in done for s in step.subjects)

    def _probe_step(self, step: Step, started: float) -> pd.DataFrame:
        waited = time.perf_counter()
        try:
            files = Prefetch.result(step.files) if step.files is not None else None
        except RevisionUnavailable as exc:
            self._skip(step, str(exc) or type(exc).__name__)
            return table.rows_to_frame([])
        spent = {"step": step.step, "revision": getattr(step.subjects[0], "revision", None),
                 "download_s": files.seconds if files else 0.0,
                 "wait_s": time.perf_counter() - waited,
                 "download_bytes": files.bytes if files else 0,
                 "load_s": 0.0, "forward_s": 0.0, "metrics_s": 0.0,
                 "weights_sha256": json.dumps(files.weights, sort_keys=True) if files else ""}
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        frame = table.rows_to_frame([])
        try:
            for subject in step.subjects:
                frame = self._probe_subject(subject, files, spent, started)
        except _LoadFailed as exc:
            self._skip(step, str(exc))
            return table.rows_to_frame([])
        finally:
            if files is not None:
                release(files, keep=self.keep_weights)
        if self.skipped.pop(label(step), None) is not None:  # a retried step that now works
            resume.write_skipped(self.output_dir, self.skipped)
        if self.device.type == "cuda":
            spent["gpu_peak_mb"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        gc.collect()
        costs.trim_heap()
        spent["rss_mb"] = costs.resident_mb()
        costs.write_costs(self.output_dir, spent, self.loggers)
        return frame

    def _skip(self, step: Step, reason: str) -> None:
        """Record a step that cannot be probed (`resume.SKIPPED`), say it, and go on."""
        if not self._many_steps:  # one model asked for: its failure is the run's
            raise RuntimeError(reason)
        subject = step.subjects[0]
        self.skipped[label(step)] = {"step": int(step.step),
                                     "revision": getattr(subject, "revision", None),
                                     "model": subject.model, "reason": reason}
        resume.write_skipped(self.output_dir, self.skipped)
        message = f"skipped {label(step)}: {reason}"
        print(message)
        self.warnings.append(message)

    def _probe_subject(self, subject, files: RevisionFiles | None, spent: dict,
                       started: float) -> pd.DataFrame:
        t0 = time.perf_counter()
        if files is not None:
            subject.files = str(files.path)
        try:
            loaded = subject.load(self.device)
        except Exception as exc:  # noqa: BLE001 - transformers, safetensors and torch alike
            if not self._many_steps or not_the_revisions_fault(exc):  # a hub tokenizer's
                raise  # silence or refusal, a full disk: fatal, so that a rerun probes the step
            raise _LoadFailed(f"its weights failed to load ({type(exc).__name__}: "
                              f"{first_line(exc)})") from exc
        t1 = time.perf_counter()
        output = subject.probe(self.request, loaded)
        t2 = time.perf_counter()
        del loaded
        spent["load_s"] += t1 - t0
        spent["forward_s"] += output.forward_seconds
        spent["metrics_s"] += (t2 - t1) - output.forward_seconds
        self.settings = output.settings
        for message in dict.fromkeys(output.warnings):
            warnings.warn(message, stacklevel=2)
        self.warnings += output.warnings
        folder = self.stack_dir(table.probe_dir(self.output_dir), subject.stack)
        pairs = catalogue.select(output.settings).pairs if output.settings else []
        vs_final: list[dict] = []
        if pairs and output.states:
            if subject.step == self._final:  # kept: every other step is compared with it
                similarity.save_states(folder, subject.step, output.states, output.layer_names)
        if pairs and output.states and self._many_steps:
            vs_final = similarity.vs_final_step_rows(
                output.states, folder, pairs, batch_size=output.settings.state_batch_size,
                seed=output.settings.seed, permutations=output.settings.null_permutations)
        output.states = []
        if subject.reference:  # another shard writes its rows
            return table.rows_to_frame([])
        if output.token_states is not None:  # settings.per_token
            tokens.save_step(folder, subject.step, output.token_states, subject.id_columns())
        own = [{"step": subject.step, **row, **subject.id_columns()} for row in output.rows]
        vs_final = [{**row, "step": subject.step, **subject.id_columns()} for row in vs_final]
        frame = sink.write_step(self.output_dir, own + vs_final,  # the whole step, atomically
                                texts=output.texts)
        sink.log_scalars(self.loggers, subject.step, table.rows_to_frame(own),
                         {"probe/seconds_total": time.perf_counter() - started},
                         prefix=self.prefix(subject.stack))
        if vs_final:
            sink.log_scalars(self.loggers, subject.step, table.rows_to_frame(vs_final), {},
                             prefix=self.prefix(subject.stack))
        return frame


class _LoadFailed(RuntimeError):
    """A step's weights could not be loaded: the step is skipped."""


