"""probe.py's loop over a trajectory: every revision or checkpoint, streamed with bounded disk and
memory, resumable after a kill.

For each step (one revision or checkpoint; both stacks of an encoder-decoder model together):

1. **files**: a hub revision's files come from the user's cache (when complete), or are
   downloaded into a folder that repgeom creates and marks as this run's, inside
   ``<output_dir>/work/`` or ``work_dir=`` (`repgeom.models.hf.downloads`: ownership, retries,
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
   downloaded and the resident memory after the step, in ``probes/timings.csv`` and W&B.

Resume: a step whose rows are all in the table is skipped (a hub revision is known by its name,
a checkpoint by its step), so the same command after a kill starts at the step that was in
flight and ends with the table an uninterrupted run writes. The table and ``skipped.json`` are
fsynced before they are renamed into place; ``timings.csv`` is appended to (and fsynced), and
rewritten in place once when a column is added; a table found empty or unreadable on resume is
set aside
(``probes.csv.corrupt-<time>``), the other format is used when it reads, and the steps missing
from it are probed again; the console says which.

A step that cannot be probed is skipped, and the trajectory goes on: a revision without weights
or not on the hub (`repgeom.models.hf.downloads.RevisionUnavailable`), or whose weights fail to
load. It is named in the console, in ``probes/skipped.json`` (revision, step and reason, which
``probe_info.json`` and the summary repeat), and a rerun leaves it out unless
``retry_skipped=true``. A hub that does not answer within the retry budget, or refuses (HTTP
401/403), while a step loads (a hub ``tokenizer=``'s files), or a full disk, ends the run
instead, as it does a download: a rerun probes the step.

Weights identity: each step's weights files and their sha256, for every complete weights format
by the one rule (`repgeom.models.hf.weights_rule`; the hub's LFS sha256, no extra download; the
file's own for the user's cache), go into ``timings.csv``; two revisions hold the same weights
when a format both have is equal (`repgeom.models.hf.weights_rule.same_weights`). Revisions
that serve the same weights (Pythia-2.8b serves final-era weights under 86 of its step branches,
EleutherAI/pythia#205) or share a weights file (a shard: Pythia-12b, #206) are warned about once,
by name; a revision whose weights are all another's is a copy, and its rows carry that
revision's name in the table's ``weights_copy_of`` column, which phase detection reads to leave
the copies out (`copies`). Of a group of identical weights the latest step is kept as the true
one: a name cannot hold weights trained past it.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from repgeom.console import first_line
from repgeom.models.hf.downloads import (
    Prefetch,
    RevisionFiles,
    RevisionUnavailable,
    clear_leftovers,
    fetch_revision,
    release,
)
from repgeom.models.hf.hub_calls import RETRY_BUDGET_S, not_the_revisions_fault
from repgeom.models.hf.weights_rule import by_format
from repgeom.probes.core import catalogue, similarity, table, tokens
from repgeom.probes.core.spec import ProbeRequest
from repgeom.probes.report import phases, sink

TIMINGS = "timings.csv"
"""Per step costs, in the probe folder."""
SKIPPED = "skipped.json"
"""The steps that could not be probed and why, in the probe folder."""
COPY_COLUMN = phases.COPY_COLUMN
"""The table column naming the revision whose weights a copy serves (empty for the others)."""
WORK_DIR = "work"
"""Downloaded revisions inside the output folder (unless ``work_dir=``)."""


def _trim_heap() -> None:
    """Give freed memory back to the system (glibc ``malloc_trim``): a model's tensors and the
    table's frames are freed after each step, and without it the heap keeps growing by the
    fragments between them (issue 25: +1.5 MB per revision)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def _system_arrow_pool() -> None:
    """Parquet reads and writes through the system allocator: pyarrow's default pool
    (mimalloc) keeps what each step's table read and write used, and the table grows every
    step, so the resident memory grew ~0.8 MB per revision over a trajectory; with the system
    pool and `_trim_heap` it stays flat (benchmarks/README.md, "Trajectory")."""
    try:
        import pyarrow
    except ImportError:  # CSV only: nothing to set
        return
    pyarrow.set_memory_pool(pyarrow.system_memory_pool())


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


def step_key(subject) -> tuple[str, str]:
    """How resume knows a step: (model, revision name) for a hub revision, (model, step) for a
    checkpoint or a model without revisions."""
    revision = getattr(subject, "revision", None)
    return (subject.model, f"revision={revision}" if revision else f"step={int(subject.step)}")


def _done(output_dir: Path, texts: str | None = None) -> set[tuple[str, str]]:
    """`step_key` of every step already in the table (`read_for_resume`); a ValueError, before
    any work, when the table holds other `texts` than those asked (``texts=``; None: as the
    checkpoint's training probe, known once it is read: `table.append_rows` refuses then)."""
    frame = read_for_resume(output_dir)
    if frame.empty:
        return set()
    held = table.texts_of(frame)
    if texts is not None and held != {texts}:
        raise ValueError(
            f"{table.probe_dir(output_dir)} holds probes of {' and '.join(sorted(held))} text, "
            f"and texts={texts} was asked: one table never mixes them; give another output "
            "folder (output_dir=... or hydra.run.dir=...), or the texts it was probed with")
    index = frame.index
    models = frame["model"].fillna("") if "model" in frame.columns else pd.Series("", index)
    revisions = frame["revision"] if "revision" in frame.columns else pd.Series(None, index)
    keys = [f"revision={r}" if isinstance(r, str) and r and r != "nan" else f"step={int(s)}"
            for r, s in zip(revisions, frame["step"], strict=True)]
    return set(zip(models, keys, strict=True))


def read_for_resume(output_dir: Path) -> pd.DataFrame:
    """The table a resumed run continues, or an empty one.

    A table file that is empty or does not read (a node that crashed before the disk had it) is
    renamed ``<name>.corrupt-<time>`` and said in the console; the other format is read when it
    is sound, and the steps missing from what is read are probed again.
    """
    folder = table.probe_dir(output_dir)
    for name in (f"{table.TABLE_STEM}.parquet", f"{table.TABLE_STEM}.csv"):
        path = folder / name
        if not path.is_file():
            continue
        try:
            frame = table.read_table(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow, pandas and parser errors alike
            aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
            os.replace(path, aside)
            reason = first_line(exc, 120)
            print(f"Resuming: {path} is unreadable ({reason}); set aside as {aside.name}, the "
                  "steps it held are probed again unless the other table file has them")
            continue
        return frame
    return table.rows_to_frame([])


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
        _system_arrow_pool()
        steps = steps_of(subjects)
        self._final, self._many_steps = steps[-1].step, len(steps) > 1
        if self.pairwise:  # the final step first: every other step is compared with it
            steps = [steps[-1], *steps[:-1]]
        done = _done(self.output_dir, getattr(self.request, "texts", None))
        self.skipped = _read_skipped(self.output_dir)
        todo = [s for s in steps if not self._complete(s, done)]
        frame = table.rows_to_frame([])
        if len(todo) < len(steps):
            print(f"Resuming: {len(steps) - len(todo)} of {len(steps)} steps already in "
                  f"{table.probe_dir(self.output_dir)}")
        before = [s for s in todo if _label(s) in self.skipped]
        if before and not self.retry_skipped:
            todo = [s for s in todo if _label(s) not in self.skipped]
            print(f"Skipped again, as in an earlier run ({table.probe_dir(self.output_dir)}/"
                  f"{SKIPPED}): {', '.join(_label(s) for s in before)}; retry_skipped=true "
                  "tries them")
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
        copies = self.mark_copies()
        if (frame.empty or copies) and table.probe_dir(self.output_dir).is_dir():
            frame = read_for_resume(self.output_dir)
        if self.skipped:
            print(f"Not probed ({len(self.skipped)}): " + "; ".join(
                f"{k}: {v['reason']}" for k, v in self.skipped.items()))
        return frame

    def _clear_leftovers(self, todo: list[Step]) -> None:
        """Delete the downloads a killed run of this output folder left, but the revisions
        still to probe (their partial files resume) and those a run with ``keep_weights=true``
        downloaded (their marker says so). Only folders repgeom made and marked for this run are
        candidates (`repgeom.models.hf.downloads.clear_leftovers`): a user's files in
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
        return step.reference or all(step_key(s) in done for s in step.subjects)

    def _probe_step(self, step: Step, started: float) -> pd.DataFrame:
        waited = time.perf_counter()
        try:
            files = step.files.result() if step.files is not None else None
        except RevisionUnavailable as exc:
            self._skip(step, str(exc) or type(exc).__name__)
            return table.rows_to_frame([])
        costs = {"step": step.step, "revision": getattr(step.subjects[0], "revision", None),
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
                frame = self._probe_subject(subject, files, costs, started)
        except _LoadFailed as exc:
            self._skip(step, str(exc))
            return table.rows_to_frame([])
        finally:
            if files is not None:
                release(files, keep=self.keep_weights)
        if self.skipped.pop(_label(step), None) is not None:  # a retried step that now works
            _write_skipped(self.output_dir, self.skipped)
        if self.device.type == "cuda":
            costs["gpu_peak_mb"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        gc.collect()
        _trim_heap()
        costs["rss_mb"] = resident_mb()
        self._write_costs(costs)
        return frame

    def _skip(self, step: Step, reason: str) -> None:
        """Record a step that cannot be probed (`SKIPPED`), say it, and go on."""
        if not self._many_steps:  # one model asked for: its failure is the run's
            raise RuntimeError(reason)
        subject = step.subjects[0]
        self.skipped[_label(step)] = {"step": int(step.step),
                                      "revision": getattr(subject, "revision", None),
                                      "model": subject.model, "reason": reason}
        _write_skipped(self.output_dir, self.skipped)
        message = f"skipped {_label(step)}: {reason}"
        print(message)
        self.warnings.append(message)

    def mark_copies(self) -> dict[str, str]:
        """Find the revisions that serve another's weights (``timings.csv``), warn once naming
        them, and write each copy's rows with ``weights_copy_of`` = the revision it copies.

        A copy is a revision whose weights files are all, by sha256, another's; of a group of
        identical weights the latest step is the true one. A shared file without equal weights
        (one shard of several) is warned about too, and not marked. Returns {copy: original}.
        """
        self.copies, shared = copies(weights_by_revision(self.output_dir))
        if self.copies:
            groups: dict[str, list[str]] = {}
            for copy, original in self.copies.items():
                groups.setdefault(original, []).append(copy)
            message = ("same weights under several revisions (their rows are marked "
                       f"{COPY_COLUMN} in the table, and phase detection leaves them out): "
                       + "; ".join(f"{', '.join(c)} serve the weights of {o}"
                                   for o, c in groups.items()))
            warnings.warn(message, stacklevel=2)
            self.warnings.append(message)
        for (a, b), files in shared.items():
            message = f"{a} and {b} share weights file(s) {', '.join(files)} (same sha256)"
            warnings.warn(message, stacklevel=2)
            self.warnings.append(message)
        if self.copies:
            frame = read_for_resume(self.output_dir)
            if "revision" in frame.columns:
                frame[COPY_COLUMN] = frame["revision"].map(self.copies).fillna("")
                table.write_table(frame, table.probe_dir(self.output_dir))
        return self.copies

    def _probe_subject(self, subject, files: RevisionFiles | None, costs: dict,
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

    def _write_costs(self, costs: dict) -> None:
        path = table.probe_dir(self.output_dir) / TIMINGS
        path.parent.mkdir(parents=True, exist_ok=True)
        row = pd.DataFrame([costs])
        header = not path.is_file()
        if not header:  # the header alone, not the whole file, at each step
            columns = list(pd.read_csv(path, nrows=0).columns)
            if set(row.columns) - set(columns):  # a column added since: rewrite once
                old = pd.read_csv(path, dtype={"revision": str, "weights_sha256": str})
                row = pd.concat([old, row], ignore_index=True)
                header = True
            else:  # appended in the file's own column order
                row = row.reindex(columns=columns)
        with open(path, "w" if header else "a") as f:
            row.to_csv(f, header=header, index=False)
            f.flush()
            os.fsync(f.fileno())
        for run in self.loggers:
            run.log({"probe/step": costs["step"],
                     **{f"probe/cost/{k}": v for k, v in costs.items()
                        if isinstance(v, (int, float)) and k != "step" and v == v}})


class _LoadFailed(RuntimeError):
    """A step's weights could not be loaded: the step is skipped."""


def _label(step: Step) -> str:
    """A step's name in the console and in ``skipped.json``: its revision, else its step."""
    revision = getattr(step.subjects[0], "revision", None)
    return str(revision) if revision else f"step {int(step.step)}"


def _read_skipped(output_dir: Path) -> dict[str, dict]:
    path = table.probe_dir(output_dir) / SKIPPED
    try:
        return {str(k): v for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError):
        return {}


def _write_skipped(output_dir: Path, skipped: dict[str, dict]) -> None:
    folder = table.probe_dir(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    table.atomic_write_text(folder / SKIPPED, json.dumps(skipped, indent=2))


def weights_by_revision(output_dir: str | os.PathLike) -> dict[str, dict[str, str]]:
    """Revision -> {weights file: sha256} of every probed hub revision, in step order, from
    ``timings.csv`` (revisions without weights files left out)."""
    path = table.probe_dir(output_dir) / TIMINGS
    if not path.is_file():
        return {}
    costs = pd.read_csv(path, dtype={"revision": str, "weights_sha256": str})
    if "weights_sha256" not in costs.columns:
        return {}
    costs = costs.dropna(subset=["revision", "weights_sha256"])
    costs = costs.drop_duplicates("revision", keep="last").sort_values("step", kind="stable")
    return {r: json.loads(w) for r, w in zip(costs["revision"], costs["weights_sha256"],
                                             strict=True) if w and w != "{}"}


def copies(weights: dict[str, dict[str, str]]
           ) -> tuple[dict[str, str], dict[tuple[str, str], list[str]]]:
    """Which revisions serve other revisions' weights.

    Parameters
    ----------
    weights : dict
        Revision -> {weights file name: sha256}, in step order.

    Returns
    -------
    copies : dict
        Copy -> original, for each revision that holds another's weights: a weights format
        both have is equal, files and hashes (a ``.bin``-only revision and the safetensors
        conversion beside the same ``.bin``); the original is the latest revision of the group (a
        name cannot hold weights trained past it).
    shared : dict
        (revision a, revision b) -> the files of equal sha256 they share without being copies.

    >>> copies({"s1": {"m.bin": "a"}, "s2": {"m.bin": "b"}, "s3": {"m.bin": "b"}})[0]
    {'s2': 's3'}
    """
    group = {revision: revision for revision in weights}  # union-find over equal formats

    def root(revision: str) -> str:
        while group[revision] != revision:
            revision = group[revision]
        return revision

    holder: dict[tuple, str] = {}
    for revision, files in weights.items():
        for key in by_format(files).items():  # (format, its files and hashes)
            if key in holder:
                group[root(revision)] = root(holder[key])
            else:
                holder[key] = revision
    members: dict[str, list[str]] = {}
    for revision in weights:  # in step order
        members.setdefault(root(revision), []).append(revision)
    found = {copy: g[-1] for g in members.values() for copy in g[:-1]}
    originals = [r for r in weights if r not in found]
    by_hash: dict[str, list[tuple[str, str]]] = {}
    for revision in originals:
        for name, sha in weights[revision].items():
            by_hash.setdefault(sha, []).append((revision, name))
    shared: dict[tuple[str, str], list[str]] = {}
    for holders in by_hash.values():
        for i, (a, name) in enumerate(holders):
            for b, _ in holders[i + 1:]:
                if a != b:
                    shared.setdefault((a, b), []).append(name)
    return found, shared


def timings(output_dir: str | os.PathLike) -> pd.DataFrame:
    """``probes/timings.csv``: one row per probed step (a resumed run appends its own)."""
    return pd.read_csv(table.probe_dir(output_dir) / TIMINGS)
