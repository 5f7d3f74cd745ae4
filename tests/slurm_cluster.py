"""A real one-node SLURM (munged, slurmctld, slurmd) in a temporary folder, for the SLURM tests.

Uses Debian's `slurm-wlm` and `munge` packages (`apt-get install slurm-wlm munge`); needs root,
because slurmd starts job steps as the submitting user. Everything lives under one folder: its own
munge key and socket, slurm.conf, state, spool, logs, and free ports, so it touches no system
service and several test sessions do not collide. Client commands find it through `SLURM_CONF`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "srun")


def missing_requirements() -> str | None:
    """Why a local SLURM cannot be started here, or None when it can."""
    missing = [name for name in BINARIES if shutil.which(name) is None]
    if missing:
        return (
            f"SLURM binaries not found: {', '.join(missing)} "
            "(install with `apt-get install slurm-wlm munge`; .ci/run does this)"
        )
    if os.geteuid() != 0:
        return "starting slurmd needs root (it launches jobs as the submitting user)"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _node_resources() -> tuple[int, int]:
    """CPUs and memory (MB) of this machine, as slurmd itself reports them."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
    cpus = int(re.search(r"CPUs=(\d+)", out).group(1))
    memory = int(re.search(r"RealMemory=(\d+)", out).group(1))
    return cpus, memory


class LocalSlurm:
    """Start with `start()`, stop with `stop()`; `env` is the environment for sbatch & co."""

    partition = "debug"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self._pids: list[tuple[str, Path]] = []  # (name, pid file) of the daemons we started
        # The node is this host by name: jobs resolve it (Lightning's DDP rendezvous address).
        self.node = socket.gethostname().split(".")[0]

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 60.0) -> None:
        t0 = time.monotonic()
        for sub in ("munge", "state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._start_munge()
        self._write_conf()
        self._daemon("slurmctld", ["slurmctld", "-f", str(self.conf)], "slurmctld.pid")
        self._daemon("slurmd", ["slurmd", "-f", str(self.conf)], "slurmd.pid")
        while time.monotonic() - t0 < timeout:
            out = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False).stdout.strip()
            if out in ("idle", "mixed", "allocated"):
                return
            time.sleep(0.5)
        raise RuntimeError(f"SLURM did not come up in {timeout:.0f} s; logs in {self.root / 'log'}")

    def _start_munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._daemon(
            "munged",
            ["munged", "--force", f"--key-file={key}", f"--socket={self.munge_socket}",
             f"--pid-file={self.root / 'munge' / 'munged.pid'}",
             f"--log-file={self.root / 'log' / 'munged.log'}",
             f"--seed-file={self.root / 'munge' / 'munged.seed'}"],
            "munge/munged.pid",
        )

    def _write_conf(self) -> None:
        cpus, memory = _node_resources()
        r = self.root
        self.conf.write_text(
            f"""\
ClusterName=repgeom-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
# A requeued job may start again only once its launch credential expired: 120 s by default.
AuthInfo=socket={self.munge_socket},cred_expire=10
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups in a container: track job processes through /proc, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
# The main scheduling loop picks up a requeued job once it is eligible again: every 2 s, not 60.
SchedulerParameters=sched_interval=2
# Requeue as a cluster would; short waits so the tests do not idle.
JobRequeue=1
KillWait=5
MinJobAge=600
InactiveLimit=0
ReturnToService=2
SlurmdTimeout=60
MessageTimeout=20
SlurmdParameters=config_overrides
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
"""
        )

    def _daemon(self, name: str, cmd: list[str], pid_file: str) -> None:
        subprocess.run(cmd, env=self.env, check=True, capture_output=True, timeout=30)
        self._pids.append((name, self.root / pid_file))

    def run(self, cmd: list[str], check: bool = True, env: dict[str, str] | None = None,
            **kwargs) -> subprocess.CompletedProcess:
        """A command against this cluster (SLURM_CONF set); output captured as text."""
        env = {**(env or os.environ), "SLURM_CONF": str(self.conf)}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, **kwargs)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-3000:]}")
        return proc

    def stop(self) -> None:
        """Cancel every job, then stop the daemons this object started (by their pid files)."""
        self.run(["scancel", "--full", "--user", "root"], check=False)
        for _name, pid_file in reversed(self._pids):
            try:
                pid = int(pid_file.read_text().strip())
            except (FileNotFoundError, ValueError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(50):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                with contextlib.suppress(ProcessLookupError):  # it exited just now: done
                    os.kill(pid, signal.SIGKILL)
        self._pids.clear()

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Restarts, ExitCode, ...); {} once forgotten."""
        out = self.run(["scontrol", "show", "job", "-o", job_id], check=False).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait(self, job_id: str, timeout: float, until=None) -> dict[str, str]:
        """Poll `scontrol show job` until the job ends (or `until(record)` holds); the record."""
        final = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                 "BOOT_FAIL", "DEADLINE"}
        deadline = time.monotonic() + timeout
        record: dict[str, str] = {}
        while time.monotonic() < deadline:
            record = self.job(job_id)
            if record.get("JobState") in final or (until is not None and until(record)):
                return record
            time.sleep(1)
        raise TimeoutError(f"job {job_id} not done after {timeout:.0f} s: {record}")
