"""The probe worker that follows a training run (``python probe.py follow=<run folder>``): it
probes each complete snapshot in step order, with the training probe's own spec and recorder,
under the run's lease; docs/probing.md ("Probes off the training clock") states the guarantees."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from repgeom import files
from repgeom.models.checkpoints import gpt_from_checkpoint, read_checkpoint, validation_windows_for
from repgeom.probes.core import table
from repgeom.probes.core.sampling import ProbeSet, probe_set
from repgeom.probes.core.spec import ProbeSpec, training_probe
from repgeom.probes.core.targets import checkpoint_masking, probe_gpt
from repgeom.probes.report import sink
from repgeom.probes.run.offload import snapshots, starts
from repgeom.probes.run.offload import state as records
from repgeom.probes.run.offload.layout import NUMBER, is_a
from repgeom.probes.run.offload.lease import Life, WorkerLock, check_heartbeat, training_alive
from repgeom.probes.run.offload.state import WorkerState, read_done, read_worker_state, run_done
from repgeom.probes.run.recorder import ProbeRecorder

POLL_S = 0.5  # seconds between two looks at the snapshot folder while nothing is waiting


class TrainingDiedError(RuntimeError):
    """The followed run stopped without its done marker; the message says what was probed."""


@dataclass
class FollowResult:
    """What a worker did: the steps probed, why it stopped, the table and the steps skipped."""

    run_dir: Path
    probed: list[int]
    stopped: str
    frame: pd.DataFrame
    skipped: list[int] = field(default_factory=list)
    plots: list[Path] = field(default_factory=list)
    no_space: dict[int, str] = field(default_factory=dict)
    quarantined: dict[int, str] = field(default_factory=dict)


class Follower:
    """One worker on one run folder; ``worker.json`` is read only once it holds the run."""

    def __init__(self, run_dir: Path, *, device: torch.device, timeout_s: float,
                 keep_snapshots: bool, wandb: bool = True, lock: str = "auto") -> None:
        if timeout_s <= 0:
            raise ValueError(f"follow_timeout_s must be > 0 seconds, got {timeout_s}")
        self.run_dir = Path(run_dir).expanduser().resolve()
        if not self.run_dir.is_dir():
            raise FileNotFoundError(
                f"follow={str(run_dir)!r}: no such folder; give the run folder of a train.py run "
                "with probe.offload=snapshots (it may not exist yet: start the worker after "
                "training has created its folder)")
        self.folder = snapshots.snapshot_dir(self.run_dir)
        self.device, self.timeout_s = device, float(timeout_s)
        self.keep, self.use_wandb = keep_snapshots, wandb
        self.lock = WorkerLock(self.folder, kind=lock)
        self._load_state(WorkerState())  # `worker.json` (`WorkerState`) is read once held
        self.recorder: ProbeRecorder | None = None
        self.probes: ProbeSet | None = None
        self.spec: ProbeSpec | None = None
        self.runs: list = []
        self._beats: dict[str, Any] = {}  # another host's heartbeat, judged on this clock

    def _load_state(self, state: WorkerState) -> None:
        self.done, self.seconds = state.done, state.seconds
        self._phase_state, self._spec_state = state.phase_alerts, state.spec
        self._options, self.finished = state.options, state.finished
        self.quarantined = state.quarantined

    def fenced(self) -> Any:
        """Every rename into place and deletion inside checks the lease (`WorkerLock.check`)."""
        return files.fenced(self.lock.check)

    def run(self) -> FollowResult:
        beat = snapshots.read_json(self.folder / snapshots.TRAINING) or {}
        if beat.get("state") == "running" and is_a[NUMBER](beat.get("heartbeat_s")):
            check_heartbeat(float(beat["heartbeat_s"]), self.timeout_s)  # judged by its beats
        self.lock.acquire(self.timeout_s, str(self.run_dir))
        try:
            self._load_state(read_worker_state(self.folder / snapshots.WORKER))
            print(f"Following {self.run_dir}: probing its snapshots as they appear "
                  f"({len(self.done)} probed before)", flush=True)
            with self.fenced():
                return self._follow()
        finally:
            self.lock.release()

    def _follow(self) -> FollowResult:
        probed: list[int] = []
        last_news = time.monotonic()
        while True:
            finished = run_done(self.folder)  # before the scan: no race
            complete, incomplete = snapshots.snapshots(self.folder)
            # probed; deleting it was cut (settled: not one on its way back)
            for path in snapshots.leftovers(self.folder, min_age_s=snapshots.SETTLED_S):
                snapshots.remove_snapshot(path)
            todo = []
            for step, path in complete:
                if step in self.quarantined and (
                        self.quarantined[step]["generation"] == records.generation(path)):
                    continue  # cannot be probed, and not rewritten since: skipped
                written = snapshots.snapshot_time(path)
                if written is None or self.done.get(step) != written:
                    todo.append((step, path))
                elif not self.keep:  # probed before a kill, not yet deleted
                    self._remove(path, self.done[step])
            if todo:
                step, path = todo[0]
                if self._probe(step, path, waiting=len(todo) - 1):
                    probed.append(step)
                last_news = time.monotonic()
                continue
            if finished:
                return self._finish(probed, dict(incomplete))
            verdict = training_alive(self.folder, self.timeout_s, watch=self._beats,
                                     newest=starts.newest(self.folder))
            certain = verdict.life.certain  # stop at once, after a last look found nothing new
            if verdict.life is Life.ALIVE:
                last_news = time.monotonic()
            elif certain and run_done(self.folder):
                continue
            elif certain or time.monotonic() - last_news > self.timeout_s:
                self._finish_wandb()
                raise TrainingDiedError(
                    f"{self.run_dir} stopped without finishing: {verdict.why}"
                    + ("" if certain else f", and no new snapshot for {self.timeout_s:.0f} s "
                       "(follow_timeout_s)") + ". Probed steps "
                    f"{sorted(self.done) or 'none'}; resume training with its own command, then "
                    f"run this worker again (it goes on from there)")
            time.sleep(POLL_S)

    def _prepare(self, path: Path, ckpt: dict) -> None:
        """The spec, probe set, recorder and W&B runs, from the first snapshot."""
        spec, origin = training_probe(ckpt, self.run_dir)
        if spec is None:
            raise ValueError(f"{path} carries no training probe spec; was it written by "
                             "repgeom's ProbeCallback (probe.offload)?")
        block_size = int(ckpt["hyper_parameters"]["model"]["block_size"])
        self.probes = probe_set(validation_windows_for(ckpt, self.run_dir, block_size), spec)
        self._options = dict(ckpt.get("offload") or {})
        self._recorder(spec)

    def _recorder(self, spec: ProbeSpec) -> None:
        """The recorder and W&B runs of `spec` (the probe set is only needed to probe)."""
        self.spec = spec
        self.recorder = ProbeRecorder(
            self.run_dir, spec,
            plot_every_n_probes=int(self._options.get("plot_every_n_probes", 0)),
            plot_metrics=self._options.get("plot_metrics"),
            n_probes=self._options.get("n_probes"))
        self.recorder.load_state_dict(self._phase_state)
        info = self.use_wandb and (snapshots.read_json(self.folder / snapshots.RUN) or {}).get(
            "wandb")
        if info:  # a W&B run in the training run's group (run.json), "<its name>-probes"
            import wandb

            run = wandb.init(
                project=info.get("project"), group=info.get("group"),
                name=f"{info.get('name')}-probes", id=f"{info['id']}-probes", resume="allow",
                job_type="probe", dir=str(self.run_dir), config={"followed_run": info["id"]},
                mode="offline" if info.get("offline") else "online")
            sink.prepare_wandb_run(run, {"probe": spec.to_dict()})
            self.runs = [run]

    def _read(self, path: Path) -> tuple[Any, tuple[Path, str] | None]:
        """The snapshot's model and masking, or None and the failing file and why."""
        weights, ckpt = path / snapshots.WEIGHTS, None
        try:
            ckpt = read_checkpoint(weights)
            if self.recorder is None:
                self._prepare(path, ckpt)
            loaded = gpt_from_checkpoint(ckpt, self.device)
            return (loaded.model, checkpoint_masking(ckpt, loaded.vocab)), None
        except MemoryError:
            raise
        except Exception as error:  # cut short, unreadable, not a checkpoint, not its model
            if ckpt is not None and self.recorder is None:
                raise  # the run's own setup (`_prepare`)
            gone = isinstance(error, FileNotFoundError) and ckpt is None
            return None, (weights, f"the snapshot {path} is complete but has no {weights.name}"
                          if gone else f"{type(error).__name__}: {error}")

    def _probe(self, step: int, path: Path, *, waiting: int) -> bool:
        """Probe, record and delete one snapshot; False: it changed while read, or quarantined."""
        started = time.perf_counter()
        before = records.generation(path)
        marker, unreadable = files.read_json_why(path / snapshots.COMPLETE)  # None, None: gone
        failed = None if unreadable is None else (path / snapshots.COMPLETE, unreadable)
        if failed is None and marker is not None:  # every field, before the weights are read
            failed = snapshots.marker_problem(path, marker)
        loaded, read_failed = self._read(path) if failed is None and marker else (None, None)
        failed = failed or read_failed
        model, masking = loaded if loaded is not None else (None, None)
        if records.generation(path) != before or (marker is None and unreadable is None):
            print(f"snapshot of step {step} changed or vanished while being read; looking "
                  "again", flush=True)
            return False
        if failed is not None:  # the same files before and after: broken for good
            file, reason = failed
            self.quarantined[step] = {"generation": before, "file": str(file), "reason": reason}
            print(f"warning: the snapshot of step {step} cannot be probed and is skipped: {file}: "
                  f"{reason}. It is named in {table.probe_dir(self.run_dir) / records.SKIPPED}; "
                  "if training writes this step again, the new snapshot is probed", flush=True)
            self._save()
            self._write_skipped({})
            return False
        output = probe_gpt(model, self.probes, batch_size=self.spec.batch_size,
                           settings=self.recorder.settings, keep_states=bool(self.recorder.pairs),
                           masking=masking)
        del model
        for message in dict.fromkeys(output.warnings):
            print(f"warning: {message}", flush=True)
        self.seconds += time.perf_counter() - started
        self.lock.check()  # a worker that lost the run writes and deletes nothing more
        self.recorder.record(step, output, self.runs, n_done=len(self.done) + 1,
                             seconds=self.seconds)
        self.done[step] = snapshots.marker_time(marker)
        self.finished = None  # a step probed after the end-of-run work: that work again
        if self.quarantined.pop(step, None) is not None:  # a broken one, written again since
            self._write_skipped({})
        self._save()
        if not self.keep:
            self._remove(path, self.done[step])
        beat = snapshots.read_json(self.folder / snapshots.TRAINING) or {}
        at = beat.get("step")
        lag = max(0, at - step) if isinstance(at, int) else 0
        print(f"probed step {step} in {time.perf_counter() - started:.1f} s; "
              f"{waiting} snapshot(s) waiting, {lag} steps behind training", flush=True)
        for run in self.runs:
            run.log({"probe/step": step, "probe/worker/waiting": waiting,
                     "probe/worker/lag_steps": lag})
        return True

    def _write_skipped(self, more: dict[int, dict[str, Any]]) -> None:
        """``skipped.json``: the quarantined steps and `more` (incomplete, no space)."""
        steps = {s: {"reason": q["reason"], "file": q["file"]}
                 for s, q in self.quarantined.items()}
        records.write_skipped(self.run_dir, {**more, **steps})

    def _remove(self, path: Path, probed: float) -> None:
        """Delete the snapshot in `path` if it is the one probed (at time `probed`)."""
        if snapshots.snapshot_time(path) == probed:
            snapshots.remove_snapshot(path, written=probed)

    def _save(self) -> None:
        with self.fenced():
            snapshots.write_json(self.folder / snapshots.WORKER, {
                "done": {str(k): v for k, v in sorted(self.done.items())},
                "seconds": self.seconds,
                "phase_alerts": self.recorder.state_dict() if self.recorder else
                self._phase_state,
                "spec": self.spec.to_dict() if self.spec else self._spec_state,
                "options": self._options, "finished": self.finished,
                "quarantined": {str(k): v for k, v in sorted(self.quarantined.items())},
                "token": self.lock.token})  # the fencing token of the holder that wrote it

    def _finish(self, probed: list[int], incomplete: dict[int, Path]) -> FollowResult:
        """The end-of-run work, unless ``worker.json`` says it is done for this final step."""
        if incomplete:
            print(f"warning: incomplete snapshots of steps {sorted(incomplete)} (no "
                  f"{snapshots.COMPLETE}: training was killed while writing them) were not "
                  "probed", flush=True)
        if self.quarantined:
            print(f"warning: steps {sorted(self.quarantined)} were skipped: their snapshots "
                  f"cannot be read (named in {records.SKIPPED} beside the table)", flush=True)
        try:
            frame = table.read_table(self.run_dir)
        except FileNotFoundError:
            frame = table.rows_to_frame([])
        final, gaps = read_done(self.folder / snapshots.DONE) or (None, {})
        no_space = {k: v for k, v in gaps.items() if k not in self.done}
        if no_space:
            print(f"warning: steps {sorted(no_space)} have no probe rows: training skipped their "
                  "snapshots for lack of disk space ("
                  + "; ".join(f"step {k}: {v}" for k, v in sorted(no_space.items()))
                  + "). A step's weights are not kept once training moves on, so only training "
                  "again from before those steps, with more free space, can fill the gap",
                  flush=True)
        self._write_skipped({
            **{s: {"reason": f"training skipped its snapshot for lack of disk space: {why}"}
               for s, why in no_space.items()},
            **{s: {"reason": "its snapshot is incomplete (training was killed while writing "
                             "it)", "file": str(p)} for s, p in incomplete.items()}})
        if self.finished != final and not frame.empty:
            if self.recorder is None and self._spec_state:
                # killed during the end-of-run work after its last probe: this start probed
                # nothing, so the recorder comes from the spec worker.json keeps
                self._recorder(ProbeSpec.from_checkpoint({"spec": self._spec_state}))
            if self.recorder is not None:
                self.recorder.finish(self.runs, n_done=len(self.done), seconds=self.seconds,
                                     where=" by the worker")
                frame = table.read_table(self.run_dir)
        if self.finished != final and (self.recorder is not None or frame.empty):
            self.finished = final  # written only once the work is on disk
            self._save()
        plots = sorted(table.plot_dir(self.run_dir).glob("*.png"))
        self._finish_wandb()
        print(f"Run {self.run_dir} is done; probes in {table.probe_dir(self.run_dir)}", flush=True)
        skipped = sorted({*incomplete, *self.quarantined})
        return FollowResult(self.run_dir, probed, "done", frame, skipped, plots, no_space,
                            {s: f"{q['file']}: {q['reason']}"
                             for s, q in sorted(self.quarantined.items())})

    def _finish_wandb(self) -> None:
        for run in self.runs:
            run.finish()
        self.runs = []


def work_left(run_dir: Path) -> bool:
    """Whether a finished run still has probing to do (a snapshot or its end-of-run work)."""
    folder = snapshots.snapshot_dir(run_dir)
    done = read_done(folder / snapshots.DONE)
    if done is None:
        return False
    state = read_worker_state(folder / snapshots.WORKER)
    broken = {k: v["generation"] for k, v in state.quarantined.items()}
    waiting = [s for s, path in snapshots.snapshots(folder)[0] if state.done.get(s) !=
               snapshots.snapshot_time(path) and broken.get(s) != records.generation(path)]
    return bool(waiting) or state.finished != done[0]


def follow(run_dir: str | os.PathLike, *, device: torch.device | str = "cpu",
           timeout_s: float = 600.0, keep_snapshots: bool = False,
           wandb: bool = True, lock: str = "auto") -> FollowResult:
    """Probe the run in `run_dir` until done (see the module); `TrainingDiedError` if it died."""
    return Follower(Path(run_dir), device=torch.device(device), timeout_s=timeout_s,
                    keep_snapshots=keep_snapshots, wandb=wandb, lock=lock).run()
