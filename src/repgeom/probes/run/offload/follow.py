"""The probe worker that follows a training run: ``python probe.py follow=<run folder>``.

It probes each complete snapshot the training callback writes (``probe.offload``,
`repgeom.probes.run.offload.snapshots`), in step order, as it appears, with the training probe's own
spec and probe set (read from the snapshot as ``probe.py ckpt=`` reads a checkpoint: `probe_gpt`
on `probe_set` of `validation_windows_for`), and records it with the callback's own `ProbeRecorder`:
the same table ``<run>/probes/probes.{parquet,csv}``, phases, figures, and W&B scalars on the
``probe/step`` axis in a run of the training run's W&B group. So its table equals the one the
in-process probe writes on the same weights.

- Never an incomplete snapshot (no ``complete.json``): it is skipped, and named when the run
  ends.
- A probed snapshot is deleted (``keep_snapshots=true`` keeps it); the steps probed are in
  ``snapshots/worker.json``, written after the table, so after a kill -9 the same command goes on
  where it stopped and ends with the table an uninterrupted worker writes.
- It stops when the run writes ``done.json`` (then it draws the figures, the summary and
  ``phases.csv``), or when the run died: no new snapshot and no live training process (the
  heartbeat in ``training.json``) for ``follow_timeout_s`` seconds; at once when the run is
  certainly gone (its state ``failed``, or its pid gone on this host).
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

from repgeom.models.checkpoints import load_gpt, read_checkpoint, validation_windows_for
from repgeom.probes.core import table
from repgeom.probes.core.sampling import ProbeSet, probe_set
from repgeom.probes.core.spec import ProbeSpec, training_probe
from repgeom.probes.core.targets import probe_gpt
from repgeom.probes.report import sink
from repgeom.probes.run.offload import snapshots
from repgeom.probes.run.offload.lock import WorkerLock
from repgeom.probes.run.recorder import ProbeRecorder

POLL_S = 0.5
"""Seconds between two looks at the snapshot folder while nothing is waiting."""


class TrainingDiedError(RuntimeError):
    """The followed run stopped without its done marker; the message says what was probed."""


@dataclass
class FollowResult:
    """What a worker did: the steps it probed (this start), why it stopped, the table."""

    run_dir: Path
    probed: list[int]
    stopped: str
    frame: pd.DataFrame
    skipped: list[int] = field(default_factory=list)
    plots: list[Path] = field(default_factory=list)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def _written(path: Path) -> float:
    """When the snapshot in `path` was completed (its marker's ``time``)."""
    return float((snapshots.read_json(path / snapshots.COMPLETE) or {}).get("time", 0.0))


def training_alive(folder: Path, timeout_s: float, now: float | None = None) -> tuple[bool, str]:
    """Whether the training process of `folder` (``training.json``) lives, and why not.

    Alive: its state is ``running``, its heartbeat is less than `timeout_s` old, and, on this
    host, its pid exists.
    """
    beat = snapshots.read_json(folder / snapshots.TRAINING)
    if beat is None:
        return False, "no training process has started in this run folder yet"
    if beat.get("state") != "running":
        return False, f"the training process {beat.get('state')}"
    if beat.get("host") == socket.gethostname() and not _alive(int(beat.get("pid", -1))):
        return False, f"the training process (pid {beat.get('pid')}) is gone"
    age = (time.time() if now is None else now) - float(beat.get("time", 0))
    if age > timeout_s:
        return False, f"no heartbeat from the training process for {age:.0f} s"
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
        self.recorder: ProbeRecorder | None = None
        self.probes: ProbeSet | None = None
        self.spec: ProbeSpec | None = None
        self.runs: list = []

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> FollowResult:
        print(f"Following {self.run_dir}: probing its snapshots as they appear "
              f"({len(self.done)} probed before)", flush=True)
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
            todo = []
            for step, path in complete:
                if self.done.get(step) != _written(path):
                    todo.append((step, path))
                elif not self.keep:  # probed before a kill, not yet deleted
                    self.lock.check()
                    snapshots.remove_snapshot(path)
            if todo:
                step, path = todo[0]
                self._probe(step, path, waiting=len(todo) - 1)
                probed.append(step)
                last_news = time.monotonic()
                continue
            if finished:
                return self._finish(probed, [s for s, _ in incomplete])
            alive, why = training_alive(self.folder, self.timeout_s)
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
        self.spec = spec
        self.probes = probe_set(validation_windows_for(ckpt, self.run_dir, block_size), spec)
        options = ckpt.get("offload") or {}
        self.recorder = ProbeRecorder(
            self.run_dir, spec, plot_every_n_probes=int(options.get("plot_every_n_probes", 0)),
            plot_metrics=options.get("plot_metrics"))
        self.recorder.load_state_dict(self._phase_state)
        if self.use_wandb:
            self.runs = _wandb_runs(self.folder, self.run_dir, spec)

    def _probe(self, step: int, path: Path, *, waiting: int) -> None:
        started = time.perf_counter()
        weights = path / snapshots.WEIGHTS
        ckpt = read_checkpoint(weights)
        if self.recorder is None:
            self._prepare(path, ckpt)
        model = load_gpt(weights, self.device).model
        del ckpt
        output = probe_gpt(model, self.probes, batch_size=self.spec.batch_size,
                           settings=self.recorder.settings, keep_states=bool(self.recorder.pairs))
        del model
        for message in dict.fromkeys(output.warnings):
            print(f"warning: {message}", flush=True)
        self.seconds += time.perf_counter() - started
        self.lock.check()  # a worker that lost the run writes and deletes nothing more
        self.recorder.record(step, output, self.runs, n_done=len(self.done) + 1,
                             seconds=self.seconds)
        self.done[step] = _written(path)
        self._save()
        if not self.keep:
            snapshots.remove_snapshot(path)
        beat = snapshots.read_json(self.folder / snapshots.TRAINING) or {}
        lag = max(0, int(beat.get("step", step)) - step)
        print(f"probed step {step} in {time.perf_counter() - started:.1f} s; "
              f"{waiting} snapshot(s) waiting, {lag} steps behind training", flush=True)
        for run in self.runs:
            run.log({"probe/step": step, "probe/worker/waiting": waiting,
                     "probe/worker/lag_steps": lag})

    def _save(self) -> None:
        snapshots.write_json(self.folder / snapshots.WORKER, {
            "done": {str(k): v for k, v in sorted(self.done.items())}, "seconds": self.seconds,
            "phase_alerts": self.recorder.state_dict() if self.recorder else self._phase_state})

    def _finish(self, probed: list[int], skipped: list[int]) -> FollowResult:
        if skipped:
            print(f"warning: incomplete snapshots of steps {skipped} (no {snapshots.COMPLETE}: "
                  "training was killed while writing them) were not probed", flush=True)
        try:
            frame = table.read_table(self.run_dir)
        except FileNotFoundError:
            frame = table.rows_to_frame([])
        plots: list[Path] = []
        if self.recorder is not None and not frame.empty:
            self.recorder.finish(self.runs, n_done=len(self.done), seconds=self.seconds,
                                 where=" by the worker")
            plots = sorted(table.plot_dir(self.run_dir).glob("*.png"))
            frame = table.read_table(self.run_dir)
        self._finish_wandb()
        print(f"Run {self.run_dir} is done; probes in {table.probe_dir(self.run_dir)}", flush=True)
        return FollowResult(self.run_dir, probed, "done", frame, skipped, plots)

    def _finish_wandb(self) -> None:
        for run in self.runs:
            run.finish()
        self.runs = []


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
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env,
            preexec_fn=None if affinity is None else (lambda: os.sched_setaffinity(0, affinity)),
        )
