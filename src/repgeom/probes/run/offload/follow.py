"""The probe worker that follows a training run: ``python probe.py follow=<run folder>``.

It probes each complete snapshot the training callback writes (``probe.offload``,
`repgeom.probes.run.offload.snapshots`), in step order, as it appears, with the training probe's own
spec and probe set (read from the snapshot as ``probe.py ckpt=`` reads a checkpoint: `probe_gpt`
on `probe_set` of `validation_windows_for`), and records it with the callback's own `ProbeRecorder`:
the same table ``<run>/probes/probes.{parquet,csv}``, phases, figures, and W&B scalars on the
``probe/step`` axis in a run of the training run's W&B group. So its table equals the one the
in-process probe writes on the same weights.

- Never an incomplete snapshot (no ``complete.json``): it is skipped, and named when the run
  ends. So are the steps whose snapshots training skipped for lack of disk space (``done.json``
  lists them): they have no probe rows, and never will, since those weights are gone.
- Each snapshot is read once (`read_checkpoint`, the model built from what it read), between
  two reads of its ``complete.json``: a snapshot that changed meanwhile is not recorded under
  its step. A probed snapshot is deleted (``keep_snapshots=true`` keeps it), and only the one
  probed (the same ``complete.json``); the steps probed are in ``snapshots/worker.json``,
  written after the table, so after a kill -9 the same command goes on where it stopped and ends
  with the table an uninterrupted worker writes.
- It stops when the run writes ``done.json``, after the end-of-run work (the pairwise rows
  against the final step, the figures, the summary and ``phases.csv``); ``worker.json`` says
  when that work is done, so a worker killed during it does it again when rerun. Or it stops
  when the run died: no new snapshot and no live training process for ``follow_timeout_s``
  seconds, where live means a fresh heartbeat in ``training.json`` and a training step that
  moved within that time (a deadlocked trainer's heartbeat thread still beats; a trainer on
  another node is judged on the worker's own clock, from when it saw them change, since two
  nodes' clocks may differ by more than the timeout); at once when the
  run is certainly gone (its state ``failed``, or its pid gone on this host).
- One worker per run (`repgeom.probes.run.offload.lock`: flock on a local file system, a lease
  file with a heartbeat on a shared one or where flock is refused): a second one waits for the
  first to finish (at most ``follow_timeout_s``, then it says which one holds the run).
- Falling behind is reported at each probe: the snapshots waiting and the lag in steps behind
  the training step of the heartbeat. Nothing is dropped.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from repgeom.models.checkpoints import gpt_from_checkpoint, read_checkpoint, validation_windows_for
from repgeom.probes.core import table
from repgeom.probes.core.sampling import ProbeSet, probe_set
from repgeom.probes.core.spec import ProbeSpec, training_probe
from repgeom.probes.core.targets import checkpoint_masking, probe_gpt
from repgeom.probes.report import sink
from repgeom.probes.run.offload import snapshots
from repgeom.probes.run.offload.lock import WorkerLock, process_alive
from repgeom.probes.run.recorder import ProbeRecorder

POLL_S = 0.5
"""Seconds between two looks at the snapshot folder while nothing is waiting."""
BEATS_PER_TIMEOUT = 2
"""The fewest heartbeats that fit in ``follow_timeout_s``: one late beat is not a death."""
WORKER_STOP_S = 30.0
"""Seconds a worker stopped by train.py (SIGTERM) gets to exit before it is killed."""


class TrainingDiedError(RuntimeError):
    """The followed run stopped without its done marker; the message says what was probed."""


@dataclass
class FollowResult:
    """What a worker did: the steps it probed (this start), why it stopped, the table, the
    incomplete snapshots it skipped, and the steps training skipped for lack of space (step ->
    why)."""

    run_dir: Path
    probed: list[int]
    stopped: str
    frame: pd.DataFrame
    skipped: list[int] = field(default_factory=list)
    plots: list[Path] = field(default_factory=list)
    no_space: dict[int, str] = field(default_factory=dict)


def _written(path: Path) -> float:
    """When the snapshot in `path` was completed (its marker's ``time``)."""
    return float((snapshots.read_json(path / snapshots.COMPLETE) or {}).get("time", 0.0))


def check_heartbeat(heartbeat_s: float, timeout_s: float) -> None:
    """A ValueError unless `timeout_s` holds `BEATS_PER_TIMEOUT` heartbeats of `heartbeat_s`."""
    if timeout_s < BEATS_PER_TIMEOUT * heartbeat_s:
        raise ValueError(
            f"the worker's timeout ({timeout_s:g} s: probe.worker.timeout_s, or probe.py's "
            f"follow_timeout_s) must be at least {BEATS_PER_TIMEOUT} heartbeats of the training "
            f"run (probe.worker.heartbeat_s={heartbeat_s:g} s), or a late beat reads as a dead "
            f"run; raise the timeout to >= {BEATS_PER_TIMEOUT * heartbeat_s:g} s or lower "
            "heartbeat_s"
        )


def training_alive(folder: Path, timeout_s: float, now: float | None = None,
                   watch: dict[str, Any] | None = None) -> tuple[bool, str]:
    """Whether the training process of `folder` (``training.json``) lives, and why not.

    Alive: its state is ``running``, its heartbeat is less than `timeout_s` old, its training
    step moved less than `timeout_s` ago (the heartbeat thread of a deadlocked trainer still
    beats), and, on this host, its pid exists.

    The ages are read from the trainer's clock against this host's. With `watch` (kept by the
    caller between looks) a trainer on another host is judged on this host's clock alone, as
    the worker lease is: the ages count from when this process saw its heartbeat, and its step,
    last change. Two nodes' clocks can be minutes apart.
    """
    beat = snapshots.read_json(folder / snapshots.TRAINING)
    if beat is None:
        return False, "no training process has started in this run folder yet"
    if beat.get("state") != "running":
        return False, f"the training process {beat.get('state')}"
    if beat.get("host") == socket.gethostname() and not process_alive(int(beat.get("pid", -1))):
        return False, f"the training process (pid {beat.get('pid')}) is gone"
    if watch is not None and beat.get("host") != socket.gethostname():
        seen = time.monotonic()
        if watch.get("time") != beat.get("time"):
            watch.update(time=beat.get("time"), seen=seen)
        if watch.get("step") != beat.get("step"):
            watch.update(step=beat.get("step"), step_seen=seen)
        age, stuck = seen - watch["seen"], seen - watch["step_seen"]
    else:
        now = time.time() if now is None else now
        age = now - float(beat.get("time", 0))
        stuck = now - float(beat.get("step_time", beat.get("time", 0)))
    if age > timeout_s:
        return False, f"no heartbeat from the training process for {age:.0f} s"
    if stuck > timeout_s:
        return False, (f"the training process beats but has been at step {beat.get('step')} for "
                       f"{stuck:.0f} s (no progress)")
    return True, ""


class Follower:
    """One worker on one run folder (`follow`)."""

    def __init__(self, run_dir: Path, *, device: torch.device, timeout_s: float,
                 keep_snapshots: bool, wandb: bool = True, lock: str = "auto") -> None:
        if timeout_s <= 0:
            raise ValueError(f"follow_timeout_s must be > 0 seconds, got {timeout_s}")
        self.run_dir = Path(run_dir).expanduser().resolve()
        if not self.run_dir.is_dir():
            raise FileNotFoundError(
                f"follow={str(run_dir)!r}: no such folder; give the run folder of a train.py run "
                "with probe.offload=snapshots (it may not exist yet: start the worker after "
                "training has created its folder)"
            )
        self.folder = snapshots.snapshot_dir(self.run_dir)
        self.device = device
        self.timeout_s = float(timeout_s)
        self.keep = keep_snapshots
        self.use_wandb = wandb
        self.lock = WorkerLock(self.folder, kind=lock)
        state = snapshots.read_json(self.folder / snapshots.WORKER) or {}
        # step -> the `time` of the snapshot probed: a resumed training start that rewrites a
        # step's snapshot (from its own replay of the steps) makes it new, and it is probed again
        self.done: dict[int, float] = {int(k): float(v) for k, v in
                                       (state.get("done") or {}).items()}
        self.seconds = float(state.get("seconds", 0.0))
        self._phase_state = state.get("phase_alerts", [])
        self._spec_state = state.get("spec")  # the recorder's, for an end-of-run work alone
        self._options = state.get("options") or {}
        self.finished = state.get("finished")  # the final step whose end-of-run work is done
        self.recorder: ProbeRecorder | None = None
        self.probes: ProbeSet | None = None
        self.spec: ProbeSpec | None = None
        self.runs: list = []
        self._beats: dict[str, Any] = {}  # another host's heartbeat, judged on this clock
        self.broken: dict[int, float] = {}  # step -> the time of a marker without its weights

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> FollowResult:
        print(f"Following {self.run_dir}: probing its snapshots as they appear "
              f"({len(self.done)} probed before)", flush=True)
        beat = snapshots.read_json(self.folder / snapshots.TRAINING) or {}
        if beat.get("state") == "running" and "heartbeat_s" in beat:  # judged by its beats
            check_heartbeat(float(beat["heartbeat_s"]), self.timeout_s)
        self.lock.acquire(self.timeout_s, str(self.run_dir))
        try:
            return self._follow()
        finally:
            self.lock.release()

    def _follow(self) -> FollowResult:
        probed: list[int] = []
        last_news = time.monotonic()
        while True:
            finished = (self.folder / snapshots.DONE).is_file()  # before the scan: no race
            complete, incomplete = snapshots.snapshots(self.folder)
            for path in snapshots.leftovers(self.folder):  # probed; deleting it was cut
                self.lock.check()
                snapshots.remove_snapshot(path)
            todo = []
            for step, path in complete:
                written = _written(path)
                if self.broken.get(step) == written:  # complete.json without weights: skipped
                    continue
                if self.done.get(step) != written:
                    todo.append((step, path))
                elif not self.keep:  # probed before a kill, not yet deleted
                    self.lock.check()
                    self._remove(path, self.done[step])
            if todo:
                step, path = todo[0]
                if self._probe(step, path, waiting=len(todo) - 1):
                    probed.append(step)
                last_news = time.monotonic()
                continue
            if finished:
                return self._finish(probed, sorted({*(s for s, _ in incomplete), *self.broken}))
            alive, why = training_alive(self.folder, self.timeout_s, watch=self._beats)
            beat = snapshots.read_json(self.folder / snapshots.TRAINING) or {}
            # A failed run or a vanished process on this host is gone for sure: stop now, once
            # a last look has found nothing new (the done marker is written before "finished").
            certain = not alive and (beat.get("state") == "failed" or why.endswith("is gone"))
            if alive:
                last_news = time.monotonic()
            elif certain and (self.folder / snapshots.DONE).is_file():
                continue
            elif certain or time.monotonic() - last_news > self.timeout_s:
                self._finish_wandb()
                raise TrainingDiedError(
                    f"{self.run_dir} stopped without finishing: {why}"
                    + ("" if certain else f", and no new snapshot for {self.timeout_s:.0f} s "
                       "(follow_timeout_s)") + ". Probed steps "
                    f"{sorted(self.done) or 'none'}; resume training with its own command, then "
                    f"run this worker again (it goes on from there)"
                )
            time.sleep(POLL_S)

    # -- one snapshot ---------------------------------------------------------------------------

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
            plot_metrics=self._options.get("plot_metrics"))
        self.recorder.load_state_dict(self._phase_state)
        if self.use_wandb:
            self.runs = _wandb_runs(self.folder, self.run_dir, spec)

    def _probe(self, step: int, path: Path, *, waiting: int) -> bool:
        """Probe and record one snapshot, then delete it; False when it changed or vanished
        while being read (nothing recorded: the next look sees what is there now)."""
        started = time.perf_counter()
        marker = snapshots.read_json(path / snapshots.COMPLETE)
        try:
            ckpt = read_checkpoint(path / snapshots.WEIGHTS)
            if self.recorder is None:
                self._prepare(path, ckpt)
            loaded = gpt_from_checkpoint(ckpt, self.device)  # the file read once
            model, masking = loaded.model, checkpoint_masking(ckpt, loaded.vocab)
        except FileNotFoundError:
            ckpt = model = masking = None
        del ckpt
        again = snapshots.read_json(path / snapshots.COMPLETE)
        if model is None and marker is not None and again == marker:
            # the same complete.json before and after, its weights file missing: not a snapshot
            # being replaced (that changes complete.json) but one broken for good (its file
            # deleted by hand or lost); looking again would spin forever
            self.broken[step] = float(marker.get("time", 0.0))
            print(f"warning: the snapshot of step {step} ({path}) is complete but has no "
                  f"{snapshots.WEIGHTS}; it is not probed", flush=True)
            return False
        if marker is None or model is None or again != marker:
            print(f"snapshot of step {step} changed or vanished while being read; looking "
                  "again", flush=True)
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
        self.done[step] = float(marker.get("time", 0.0))
        self.finished = None  # a step probed after the end-of-run work: that work again
        self._save()
        if not self.keep:
            self._remove(path, self.done[step])
        beat = snapshots.read_json(self.folder / snapshots.TRAINING) or {}
        lag = max(0, int(beat.get("step", step)) - step)
        print(f"probed step {step} in {time.perf_counter() - started:.1f} s; "
              f"{waiting} snapshot(s) waiting, {lag} steps behind training", flush=True)
        for run in self.runs:
            run.log({"probe/step": step, "probe/worker/waiting": waiting,
                     "probe/worker/lag_steps": lag})
        return True

    def _remove(self, path: Path, probed: float) -> None:
        """Delete the snapshot in `path` if it is the one probed (its marker's `probed` time)."""
        if _written(path) == probed:
            snapshots.remove_snapshot(path)

    def _save(self) -> None:
        snapshots.write_json(self.folder / snapshots.WORKER, {
            "done": {str(k): v for k, v in sorted(self.done.items())}, "seconds": self.seconds,
            "phase_alerts": self.recorder.state_dict() if self.recorder else self._phase_state,
            "spec": self.spec.to_dict() if self.spec else self._spec_state,
            "options": self._options, "finished": self.finished})

    def _finish(self, probed: list[int], skipped: list[int]) -> FollowResult:
        """The end-of-run work, unless ``worker.json`` says it is done for this final step."""
        if skipped:
            print(f"warning: incomplete snapshots of steps {skipped} (no {snapshots.COMPLETE}: "
                  "training was killed while writing them) were not probed", flush=True)
        try:
            frame = table.read_table(self.run_dir)
        except FileNotFoundError:
            frame = table.rows_to_frame([])
        done = snapshots.read_json(self.folder / snapshots.DONE) or {}
        final = done.get("step")
        no_space = {int(k): str(v) for k, v in (done.get("skipped_for_space") or {}).items()
                    if int(k) not in self.done}
        if no_space:
            print(f"warning: steps {sorted(no_space)} have no probe rows: training skipped their "
                  "snapshots for lack of disk space ("
                  + "; ".join(f"step {k}: {v}" for k, v in sorted(no_space.items()))
                  + "). A step's weights are not kept once training moves on, so only training "
                  "again from before those steps, with more free space, can fill the gap",
                  flush=True)
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
        return FollowResult(self.run_dir, probed, "done", frame, skipped, plots, no_space)

    def _finish_wandb(self) -> None:
        for run in self.runs:
            run.finish()
        self.runs = []


def work_left(run_dir: Path) -> bool:
    """Whether a finished run (``done.json``) still has probing to do: a complete snapshot
    not probed, or the end-of-run work not done (``worker.json``)."""
    folder = snapshots.snapshot_dir(run_dir)
    done = snapshots.read_json(folder / snapshots.DONE)
    if done is None:
        return False
    state = snapshots.read_json(folder / snapshots.WORKER) or {}
    probed = {int(k): float(v) for k, v in (state.get("done") or {}).items()}
    waiting = [s for s, path in snapshots.snapshots(folder)[0] if probed.get(s) != _written(path)]
    return bool(waiting) or state.get("finished") != done.get("step")


def _wandb_runs(folder: Path, run_dir: Path, spec: ProbeSpec) -> list:
    """A W&B run in the training run's group (``run.json``), named ``<its name>-probes``; none
    when training logged to no W&B run."""
    info = (snapshots.read_json(folder / snapshots.RUN) or {}).get("wandb")
    if not info:
        return []
    import wandb

    run = wandb.init(
        project=info.get("project"), group=info.get("group"), name=f"{info.get('name')}-probes",
        id=f"{info['id']}-probes", resume="allow", job_type="probe", dir=str(run_dir),
        mode="offline" if info.get("offline") else "online",
        config={"followed_run": info["id"]},
    )
    sink.prepare_wandb_run(run, {"probe": spec.to_dict()})
    return [run]


def follow(run_dir: str | os.PathLike, *, device: torch.device | str = "cpu",
           timeout_s: float = 600.0, keep_snapshots: bool = False,
           wandb: bool = True, lock: str = "auto") -> FollowResult:
    """Probe the snapshots of the training run in `run_dir` until it is done (see the module).

    Raises
    ------
    TrainingDiedError
        The run stopped without its done marker (no heartbeat, no new snapshot for
        `timeout_s` seconds); everything that was complete is probed first.
    repgeom.probes.run.offload.lock.LockLostError
        Another worker took the run over (this one's lease heartbeat was judged stale).

    `lock` is ``follow_lock``: ``auto`` (flock on a local file system, a lease file on a shared
    one), ``flock`` or ``file`` (`repgeom.probes.run.offload.lock`).
    """
    return Follower(Path(run_dir), device=torch.device(device), timeout_s=timeout_s,
                    keep_snapshots=keep_snapshots, wandb=wandb, lock=lock).run()


def worker_command(run_dir: Path, *, device: str, timeout_s: float, keep_snapshots: bool
                   ) -> list[str]:
    """The command of a worker for `run_dir`: ``repgeom-probe follow=<run_dir> ...`` (probe.py
    as the installed command, `repgeom.cli.probe`), its Hydra files in
    ``<run_dir>/probes/worker/``."""
    return [sys.executable, "-m", "repgeom.cli.probe",
            f"follow={run_dir}", f"device={device}", f"follow_timeout_s={timeout_s}",
            f"keep_snapshots={str(keep_snapshots).lower()}",
            f"hydra.run.dir={table.probe_dir(run_dir) / 'worker'}"]


def start_worker(run_dir: Path, options: dict[str, Any]) -> subprocess.Popen:
    """Start a worker process for `run_dir` on this node (``probe.offload=worker``).

    `options` are ``probe.worker``'s: ``threads`` (its torch threads, OMP_NUM_THREADS),
    ``device``, ``cpus`` (the cores it may run on, Linux), ``timeout_s``, ``keep_snapshots``.
    Its output goes to ``<run_dir>/probes/worker.log``.
    """
    threads = int(options.get("threads") or 1)
    check_heartbeat(float(options.get("heartbeat_s") or 10.0),
                    float(options.get("timeout_s") or 600.0))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    cpus = options.get("cpus")
    affinity = None if cpus is None else {int(c) for c in cpus}
    if affinity is not None and not hasattr(os, "sched_setaffinity"):
        raise ValueError("probe.worker.cpus needs Linux (os.sched_setaffinity); leave it null")
    log_path = table.probe_dir(run_dir) / "worker.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = worker_command(run_dir, device=str(options.get("device") or "cpu"),
                             timeout_s=float(options.get("timeout_s") or 600.0),
                             keep_snapshots=bool(options.get("keep_snapshots")))
    with open(log_path, "ab") as log:
        # start_new_session, not preexec_fn: preexec_fn is unsafe once threads run (the
        # heartbeat, Lightning's) (https://docs.python.org/3/library/subprocess.html#popen-
        # constructor); the worker's own session also keeps a Ctrl-C for train.py from it: it
        # stops on the failed state or when train.py's pid is gone, or train.py stops it
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    if affinity is not None:  # before its interpreter has started any thread of its own
        os.sched_setaffinity(process.pid, affinity)
    return process


def stop_worker(process: subprocess.Popen, limit_s: float) -> int | None:
    """Wait at most `limit_s` seconds for `process` (a worker of `start_worker`) to exit; then
    SIGTERM, `WORKER_STOP_S` seconds more, then SIGKILL. Its exit code, None when stopped."""
    try:
        return process.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        pass
    process.terminate()
    try:
        process.wait(timeout=WORKER_STOP_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    return None
