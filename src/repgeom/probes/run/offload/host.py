"""Which machine and pid namespace a process runs in, so that a pid read from a shared file
(the worker lease, the trainer's heartbeat) is only trusted where it means something.

A hostname alone is not enough: containers on one node often share the node's hostname but not
its pid namespace, and a pid from another namespace says nothing here (it may be free, or
another process's). So "this host" is the hostname, the kernel's boot id
(``/proc/sys/kernel/random/boot_id``: a rebooted node is another host) and the pid namespace
(the inode named by ``/proc/self/ns/pid``), all equal. Where one of them cannot be read (off
Linux, or a record written without them), the pid is not trusted, and the process is judged by
its heartbeat alone, which is slower but never wrong.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path
from typing import Any

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
PID_NAMESPACE = "/proc/self/ns/pid"


@functools.lru_cache(maxsize=1)
def _boot_and_namespace() -> tuple[str | None, str | None]:
    try:
        boot = BOOT_ID.read_text().strip() or None
    except OSError:
        boot = None
    try:
        namespace = os.readlink(PID_NAMESPACE)  # "pid:[4026531836]"
    except OSError:
        namespace = None
    return boot, namespace


def host_identity() -> dict[str, Any]:
    """``host``, ``boot_id`` and ``pid_ns`` of this process, for a record others read."""
    boot, namespace = _boot_and_namespace()
    return {"host": socket.gethostname(), "boot_id": boot, "pid_ns": namespace}


def same_host(record: dict[str, Any]) -> bool:
    """Whether the process of `record` (`host_identity`'s fields) runs where a pid of it can be
    looked up here: same hostname, boot and pid namespace, none of them unknown."""
    mine = host_identity()
    return all(mine[key] is not None and record.get(key) == mine[key] for key in mine)


def pid_of(record: dict[str, Any]) -> int | None:
    """The pid `record` names, or None when it names none that can be looked up (missing, not a
    whole number, or not above 0: ``kill(0)`` and ``kill(-1)`` would ask about process groups):
    such a process is judged by its heartbeat alone."""
    pid = record.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return None
    return pid
