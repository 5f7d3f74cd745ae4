"""The probe worker as a process of its own (``probe.offload=worker``): its command, its start
by train.py (own session, cores, threads), its bounded stop, and `check_heartbeat`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from repgeom.probes.core import table

BEATS_PER_TIMEOUT = 2  # the fewest heartbeats in follow_timeout_s: one late beat is no death
WORKER_STOP_S = 30.0  # seconds a worker stopped by train.py (SIGTERM) has before SIGKILL


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
