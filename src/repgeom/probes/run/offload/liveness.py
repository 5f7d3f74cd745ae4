"""Whether the training process of a followed run lives (`training_alive`), judged from its
heartbeat ``training.json`` (`repgeom.probes.run.offload.snapshots`); the probe worker
(`repgeom.probes.run.offload.follow`) stops when it does not."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from repgeom.files import read_json
from repgeom.probes.run.offload.host import pid_of, same_host
from repgeom.probes.run.offload.layout import TRAINING
from repgeom.probes.run.offload.lock import process_alive


class TrainingDiedError(RuntimeError):
    """The followed run stopped without its done marker; the message says what was probed."""


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
    beat = read_json(folder / TRAINING)
    if beat is None:
        return False, "no training process has started in this run folder yet"
    if beat.get("state") != "running":
        return False, f"the training process {beat.get('state')}"
    here = same_host(beat)  # same hostname, boot and pid namespace: its pid means something
    pid = pid_of(beat)  # none (a malformed heartbeat): judged by its heartbeat alone
    if here and pid is not None and not process_alive(pid):
        return False, f"the training process (pid {beat.get('pid')}) is gone"
    if watch is not None and not here:
        seen = time.monotonic()
        if watch.get("time") != beat.get("time"):
            watch.update(time=beat.get("time"), seen=seen)
        if watch.get("step") != beat.get("step"):
            watch.update(step=beat.get("step"), step_seen=seen)
        age, stuck = seen - watch["seen"], seen - watch["step_seen"]
    else:
        now = time.time() if now is None else now
        try:
            age = now - float(beat.get("time", 0))
            stuck = now - float(beat.get("step_time", beat.get("time", 0)))
        except (TypeError, ValueError):
            return False, f"the training heartbeat's time is not a number: {beat.get('time')!r}"
    if age > timeout_s:
        return False, f"no heartbeat from the training process for {age:.0f} s"
    if stuck > timeout_s:
        return False, (f"the training process beats but has been at step {beat.get('step')} for "
                       f"{stuck:.0f} s (no progress)")
    return True, ""
