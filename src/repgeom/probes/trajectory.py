"""probe.py's loop over a trajectory: every revision or checkpoint, streamed with bounded disk and
memory, resumable after a kill.

For each step (one revision or checkpoint; both stacks of an encoder-decoder model together):

1. **files**: a hub revision's files come from the user's cache, or are downloaded into
   ``<output_dir>/work/`` (`repgeom.models.hf.downloads`) while the step before is probed (one
   background thread: at most two revisions' weights on disk), and are deleted once probed
   (``keep_weights=true`` keeps them);
2. **probe**: the target loads the model, draws its probe set and measures it;
3. **rows**: its rows and, with pairwise metrics, each layer against the same layer of the final
   step go to the table in one atomic write (`sink.write_step`). The final step is probed first:
   only its states are kept on disk (``probes/states/``), every other step's are compared and
   dropped, so the states on disk are one step's however long the trajectory;
4. **costs**: seconds downloading, loading, in the forward passes and in the metrics, the bytes
   downloaded and the resident memory after the step, in ``probes/timings.csv`` and W&B.

Resume: a step whose rows are all in the table is skipped, so the same command after a kill
starts at the step that was in flight and ends with the table an uninterrupted run writes.
"""

from __future__ import annotations

import gc
import os
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from repgeom.models.hf.downloads import (
    Prefetch,
    RevisionFiles,
    clear_leftovers,
    fetch_revision,
    release,
)
from repgeom.probes import catalogue, similarity, sink, table
from repgeom.probes.spec import ProbeRequest

TIMINGS = "timings.csv"
"""Per step costs, in the probe folder."""
WORK_DIR = "work"
"""Downloaded revisions inside the output folder (unless ``work_dir=``)."""


def resident_mb() -> float:
    """This process's resident memory in MB (Linux ``/proc``; NaN elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


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


def _done(output_dir: Path) -> set[tuple[str, int]]:
    """(model, step) of every step already in the table."""
    folder = table.probe_dir(output_dir)
    try:
        frame = table.read_table(output_dir)
    except FileNotFoundError:
        return set()
    if frame.empty or not folder.is_dir():
        return set()
    models = frame["model"].fillna("") if "model" in frame.columns else pd.Series("", frame.index)
    return set(zip(models, frame["step"].astype(int), strict=True))


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
    _final: int | None = None
    _several: bool = False

    def _fetch(self, step: Step, abort=None) -> RevisionFiles | None:
        subject = step.subjects[0]
        if getattr(subject, "source", "") != "hf":
            return None
        work = self.work_dir or self.output_dir / WORK_DIR
        return fetch_revision(subject.name, subject.revision, work, owner=self.output_dir,
                              abort=abort)

    def run(self, subjects: Sequence) -> pd.DataFrame:
        """Probe every target (see the module docstring); returns the whole table."""
        steps = steps_of(subjects)
        self._final, self._several = steps[-1].step, len(steps) > 1
        if self.pairwise:  # the final step first: every other step is compared with it
            steps = [steps[-1], *steps[:-1]]
        done = _done(self.output_dir)
        todo = [s for s in steps if not self._complete(s, done)]
        frame = table.rows_to_frame([])
        if len(todo) < len(steps):
            print(f"Resuming: {len(steps) - len(todo)} of {len(steps)} steps already in "
                  f"{table.probe_dir(self.output_dir)}")
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
        if frame.empty and table.probe_dir(self.output_dir).is_dir():
            frame = table.read_table(self.output_dir)
        return frame

    def _clear_leftovers(self, todo: list[Step]) -> None:
        """Delete the downloads a killed run of this output folder left, but the revisions
        still to probe (their partial files resume). Only folders repgeom made and marked for
        this run are candidates (`repgeom.models.hf.downloads.clear_leftovers`): a user's files
        in ``work_dir``, and other jobs' downloads there, are never touched."""
        if self.keep_weights:
            return
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
        return step.reference or all((s.model, s.step) in done for s in step.subjects)

    def _probe_step(self, step: Step, started: float) -> pd.DataFrame:
        waited = time.perf_counter()
        files = step.files.result() if step.files is not None else None
        costs = {"step": step.step, "revision": getattr(step.subjects[0], "revision", None),
                 "download_s": files.seconds if files else 0.0,
                 "wait_s": time.perf_counter() - waited,
                 "download_bytes": files.bytes if files else 0,
                 "load_s": 0.0, "forward_s": 0.0, "metrics_s": 0.0}
        frame = table.rows_to_frame([])
        try:
            for subject in step.subjects:
                frame = self._probe_subject(subject, files, costs, started)
        finally:
            if files is not None:
                release(files, keep=self.keep_weights)
        gc.collect()
        costs["rss_mb"] = resident_mb()
        self._write_costs(costs)
        return frame

    def _probe_subject(self, subject, files: RevisionFiles | None, costs: dict,
                       started: float) -> pd.DataFrame:
        t0 = time.perf_counter()
        if files is not None:
            subject.files = str(files.path)
        loaded = subject.load(self.device)
        t1 = time.perf_counter()
        output = subject.probe(self.request, loaded)
        t2 = time.perf_counter()
        del loaded
        costs["load_s"] += t1 - t0
        costs["forward_s"] += output.forward_seconds
        costs["metrics_s"] += (t2 - t1) - output.forward_seconds
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
        if pairs and output.states and self._several:
            vs_final = similarity.vs_final_step_rows(
                output.states, folder, pairs, batch_size=output.settings.state_batch_size,
                seed=output.settings.seed)
        output.states = []
        if subject.reference:  # another shard writes its rows
            return table.rows_to_frame([])
        own = [{"step": subject.step, **row, **subject.id_columns()} for row in output.rows]
        vs_final = [{**row, "step": subject.step, **subject.id_columns()} for row in vs_final]
        frame = sink.write_step(self.output_dir, own + vs_final)  # the whole step, atomically
        sink.log_scalars(self.loggers, subject.step, table.rows_to_frame(own),
                         {"probe/seconds_total": time.perf_counter() - started},
                         prefix=self.prefix(subject.stack))
        if vs_final:
            sink.log_scalars(self.loggers, subject.step, table.rows_to_frame(vs_final), {},
                             prefix=self.prefix(subject.stack))
        return frame

    def _write_costs(self, costs: dict) -> None:
        path = table.probe_dir(self.output_dir) / TIMINGS
        path.parent.mkdir(parents=True, exist_ok=True)
        row = pd.DataFrame([costs])
        row.to_csv(path, mode="a", header=not path.is_file(), index=False)
        for run in self.loggers:
            run.log({"probe/step": costs["step"],
                     **{f"probe/cost/{k}": v for k, v in costs.items()
                        if k not in ("step", "revision") and v == v}})


def timings(output_dir: str | os.PathLike) -> pd.DataFrame:
    """``probes/timings.csv``: one row per probed step (a resumed run appends its own)."""
    return pd.read_csv(table.probe_dir(output_dir) / TIMINGS)
