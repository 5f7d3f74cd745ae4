"""The next revision's download while this one is probed: fetches run in order on one daemon
thread, and Ctrl-C exits at once (the trajectory's loop, `repgeom.probes.run.trajectory`)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any

from repgeom.models.hub.calls import Aborted


class Prefetch:
    """Run fetches in order on one daemon thread: leaving the ``with`` block on an exception
    sets `abort` and waits for nothing, so Ctrl-C exits at once (``ThreadPoolExecutor`` joins
    its threads at exit: Ctrl-C waited minutes for the download in flight)."""

    def __init__(self) -> None:
        self.abort = threading.Event()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name="prefetch", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        self._queue.put((future, fn, args))
        return future

    @staticmethod
    def result(future: Future, poll_s: float = 0.25) -> Any:
        """`future`'s result, waited for in slices of `poll_s` seconds: SIGINT may land on
        the download thread, and an untimed wait never ran the main thread's handler."""
        while not future.done():  # not result(timeout=): the fetch's own TimeoutError is
            wait([future], timeout=poll_s)  # the same class, and would be waited for again
        return future.result()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                if self.abort.is_set():
                    raise Aborted("stopped: the run was interrupted")
                future.set_result(fn(*args))
            except BaseException as error:  # noqa: BLE001 - handed to whoever waits for it
                future.set_exception(error)

    def close(self, *, abort: bool = False) -> None:
        if abort:
            self.abort.set()
        self._queue.put(None)

    def __enter__(self) -> Prefetch:
        return self

    def __exit__(self, kind: type | None, *exc: object) -> None:
        self.close(abort=kind is not None)
