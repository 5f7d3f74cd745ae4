"""One retry budget for every call repgeom makes to the Hugging Face hub: what huggingface_hub
lacks. The library makes every call; after each failed try `Retrier` waits and tries again, or
stops:

- **429**: wait what the hub asks (`retry_after`), else back off as below;
- **5xx, 408, timeouts, refused or dropped connections**: back off 1, 2, 4 ... s (at most
  `MAX_WAIT_S`, times a random factor in [0.5, 1] so that jobs hit together part);
- **anything else** (401/403/404, a full disk, offline mode, a bug): raised as is.

Waits and failed tries spend one budget (`RETRY_BUDGET_S` per revision); a try whose partial
file *kept* more bytes is progress (bytes thrown away are not): it costs nothing and restarts
the back-off. A wait that would overrun the budget raises `RetriesExhausted` at once. Every wait
is said first: ``waiting 60 s: HTTP 429 from <url> (try 3, 12 min of 15 left)``.

Each try runs in `Retrier.attempt`. Hooks on every session the library makes (`watch_session`)
act on that try's requests alone: `_bound_request` bounds each by `timeout()` (the library's
session, and ``list_repo_refs``, give none: a silent server was waited for for ever) and ends the
try when the library asks again on its own (its retries are silent and outside any budget);
`_judge_response` ends the call at a 429, 408 or 5xx, judges a resumed 206, and keeps what
arrived of a body that a cut ends (`_cut_kept`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import random
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import TypeVar

from repgeom.console import first_line

RETRY_BUDGET_S = 15 * 60.0
"""Seconds of waiting (and of tries that received nothing) allowed per revision."""
FIRST_WAIT_S = 1.0
"""The first back-off; each failure doubles it."""
MAX_WAIT_S = 60.0
"""The longest back-off between two tries (a 429's ``Retry-After`` may ask for more)."""
CONNECT_TIMEOUT_S = 10.0
"""Seconds to open a connection (huggingface_hub's ``DEFAULT_ETAG_TIMEOUT``)."""
READ_TIMEOUT_S = 20.0
"""Seconds without a byte before a try fails: under 30 s, so that a stall is said within 30 s
(huggingface_hub's own 10 s is short for a busy CDN)."""
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
"""HTTP statuses worth another try (any other 5xx too)."""

T = TypeVar("T")


class RetriesExhausted(RuntimeError):
    """The retry budget is spent; `last` is the last failure."""

    def __init__(self, message: str, last: BaseException | None) -> None:
        super().__init__(message)
        self.last = last


class DownloadError(RuntimeError):
    """A revision could not be fetched: the budget is spent, or the hub answered something no
    retry mends. Fatal; the partial files are kept."""


class RevisionUnavailable(DownloadError):
    """This revision cannot be probed but the others can (a 404, or no weights file)."""


class HubAccessError(DownloadError):
    """The hub refuses the repository (401/403: gated, private or missing). Fatal."""


class Aborted(RuntimeError):
    """The caller set the abort flag (Ctrl-C in the main thread): stop between two chunks."""


class LibraryRetry(ConnectionError):
    """huggingface_hub asked again on its own within one try: the try ends, the retrier decides."""


class RangeMismatch(ConnectionError):
    """A resumed request (``Range: bytes=N-``) answered by a 206 from another byte than N."""


def no_answer(error: BaseException, *, kept: str = "", rerun: str = "later") -> str:
    """The one wording of a call whose budget is spent: what was asked, what was `kept`, the
    hub, and what to do (rerun the same command `rerun`, or more ``retry_budget_s=``)."""
    from huggingface_hub import constants

    return (f"{error}{kept}. The hub ({constants.ENDPOINT}) did not answer in time: rerun the "
            f"same command {rerun}, or give the hub more time: retry_budget_s=")


def describe(error: BaseException) -> str:
    """``TypeName: first line of the message``."""
    return f"{type(error).__name__}: {first_line(error, 200)}" if str(error).strip() \
        else type(error).__name__


def _seconds(variable: str, default: float) -> float:
    """The positive seconds in environment `variable`, else `default`; read at each call (the
    library's ``constants`` are read at its import)."""
    try:
        value = float(os.environ.get(variable) or default)
    except ValueError:
        return default
    return value if value > 0 else default


def read_timeout_s() -> float:
    """``HF_HUB_DOWNLOAD_TIMEOUT`` when the user set it, else `READ_TIMEOUT_S`."""
    return _seconds("HF_HUB_DOWNLOAD_TIMEOUT", READ_TIMEOUT_S)


def connect_timeout_s() -> float:
    """``HF_HUB_ETAG_TIMEOUT`` when the user set it, else `CONNECT_TIMEOUT_S`."""
    return _seconds("HF_HUB_ETAG_TIMEOUT", CONNECT_TIMEOUT_S)


@functools.cache
def _httpx():
    """The httpx that huggingface_hub imported (httpx2 in its 2.x, httpx in 1.x), not any that
    is installed: a downgrade leaves httpx2 behind."""
    from huggingface_hub.utils import _http

    return getattr(_http, "httpx2", None) or _http.httpx


def timeout():
    """The bound of one request: connect, and each read, write and pool wait."""
    return _httpx().Timeout(read_timeout_s(), connect=connect_timeout_s())


class _Attempt(threading.local):
    """The try in flight on this thread (`Retrier.attempt`)."""

    retrier: Retrier | None = None
    what: str = ""
    asked: frozenset = frozenset()  # (method, URL) of each request of this try
    last: BaseException | None = None  # the error `_judge_response` last ended a call with
    keep_cut: bool = False  # a body cut short hands on what arrived (`_cut_kept`)
    cuts: list | tuple = ()  # the errors that cut this try's bodies (`_cut_kept`)


_attempt = _Attempt()


def _bound_request(request) -> None:
    """Before each request of a try: stop when the run is aborted; a request the try made
    already is the library's own retry (``http_backoff`` after a timeout, ``http_get`` after a
    cut, for ever while bytes arrive): `LibraryRetry` ends the try; else bound it by
    `timeout()` (a shorter bound the library gave is kept)."""
    retrier = _attempt.retrier
    if retrier is None:
        return
    retrier.check_abort()
    asked = (request.method, str(request.url))
    if asked in _attempt.asked:  # from the answer it asks again after (a 429's Retry-After)
        raise LibraryRetry(f"huggingface_hub asked again on its own for {request.method} "
                           f"{asked[1].split('?', 1)[0]}") from _attempt.last
    _attempt.asked |= {asked}
    bound = timeout()
    given = request.extensions.get("timeout") or {}
    request.extensions["timeout"] = {
        key: min(getattr(bound, key), given.get(key) or getattr(bound, key))
        for key in ("connect", "read", "write", "pool")}


def _judge_response(response) -> None:
    """On each answer of a try: a 429, 408 or 5xx ends the library's call at once (its
    ``http_backoff`` would retry silently, outside any budget); a body is read through
    `_cut_kept` where the try keeps cuts; a 206 to a resumed request is the 200 it is when it
    starts at byte 0, and `RangeMismatch` when it starts elsewhere."""
    if _attempt.retrier is None:
        return
    status = response.status_code
    if 300 <= status < 400 or status == 401:  # a redirect or an auth challenge: the same URL
        _attempt.asked -= {(response.request.method, str(response.request.url))}  # may follow
    if status in RETRY_STATUS or status >= 500:
        from huggingface_hub.utils import hf_raise_for_status

        response.read()  # the error's message is in the body
        try:
            hf_raise_for_status(response)
        except Exception as error:
            _attempt.last = error  # what a retry of the library's names (`_bound_request`)
            raise
    if _attempt.keep_cut and status in (200, 206) and response.headers.get(
            "Content-Encoding", "identity").lower() == "identity":
        response.stream = _cut_kept()(response.stream, _attempt.cuts)
    asked = response.request.headers.get("Range", "")
    if status == 206 and asked.startswith("bytes=") and asked.endswith("-"):
        start = first_byte(response)
        if start == 0:
            response.status_code = 200
        elif str(start) != asked[len("bytes="):-1]:
            raise RangeMismatch(
                f"asked for the bytes from {asked[len('bytes='):-1]}, the server answered 206 "
                f"with Content-Range {response.headers.get('Content-Range')!r}; asking for the "
                "whole file")


@functools.cache
def _cut_kept() -> type:
    """A body that ends where a timeout or a dropped connection cuts it, handing on what
    arrived: ``http_get`` reads chunks of ``constants.DOWNLOAD_CHUNK_SIZE`` (10 MiB) and lost the
    part in flight, so a link that dropped every transfer before 10 MiB never finished a file.
    The cut is kept on the try's list (`Retrier.attempt`), to name the short body's failure."""

    class _CutKept(_httpx().SyncByteStream):
        def __init__(self, stream, cuts: list) -> None:
            self.stream, self.cuts = stream, cuts  # its own try's, whenever it is read

        def __iter__(self):
            try:
                yield from self.stream
            except _network_errors() as error:
                self.cuts.append(error)

        def close(self) -> None:
            self.stream.close()

    return _CutKept


def first_byte(response) -> int | None:
    """The byte an answer's body starts at: 0 for a 200, ``START`` of a 206's
    ``Content-Range: bytes START-END/TOTAL`` (RFC 9110 section 14.4), else None."""
    if response.status_code != 206:
        return 0
    found = re.fullmatch(r"bytes\s+(\d+)-\d+/(?:\d+|\*)",
                         response.headers.get("Content-Range", "").strip())
    return int(found.group(1)) if found else None


def watch_session() -> None:
    """Hook `_bound_request` and `_judge_response` into huggingface_hub's session and every
    session its default factory makes (``http_backoff`` makes a new one after a refused
    connection); a factory the user set is kept, its session hooked at each try."""
    from huggingface_hub.utils import _http, get_session, set_client_factory

    with _installing:  # one thread at a time: a hook added twice would judge each request twice
        if _http._GLOBAL_CLIENT_FACTORY is _http.default_client_factory:
            set_client_factory(_hooked_client)
        _hook(get_session())


_installing = threading.Lock()


def _hooked_client():
    """huggingface_hub's default client (its offline check, request ids, redirects), hooked."""
    from huggingface_hub.utils import _http

    return _hook(_http.default_client_factory())


def _hook(client):
    """`client` with `_bound_request` and `_judge_response` among its event hooks (once)."""
    hooks = client.event_hooks
    if _bound_request not in hooks["request"]:
        hooks["request"].append(_bound_request)
    if _judge_response not in hooks["response"]:
        hooks["response"].append(_judge_response)
    return client


def cause_of(error: BaseException) -> BaseException:
    """The error a wrapper was raised from (``hf_hub_download`` raises a 5xx or a dropped
    connection as ``LocalEntryNotFoundError``, transformers wraps that in an ``OSError``)."""
    seen = {id(error)}
    while getattr(error, "response", None) is None and error.__cause__ is not None \
            and id(error.__cause__) not in seen:
        error = error.__cause__
        seen.add(id(error))
    return error


def status_of(error: BaseException) -> int | None:
    """The HTTP status of an ``HfHubHTTPError`` (or httpx status error), else None."""
    response = getattr(cause_of(error), "response", None)
    return getattr(response, "status_code", None)


def url_of(error: BaseException) -> str:
    """The URL a failed request asked for, or ``"the hub"``."""
    error = cause_of(error)
    for holder in (getattr(error, "response", None), error):
        try:
            request = getattr(holder, "request", None)
            if request is not None:
                return str(request.url).split("?", 1)[0]
        except RuntimeError:  # httpx raises when a request was never attached
            pass
    return "the hub"


def retry_after(headers) -> float | None:
    """The seconds a 429 or 503 asks to wait: ``Retry-After`` as seconds or an HTTP date (RFC
    9110 section 10.2.3), else the reset of the hub's ``RateLimit`` header, else None."""
    if headers is None:
        return None
    value = (headers.get("Retry-After") or "").strip()
    with contextlib.suppress(ValueError):
        return max(0.0, float(value))
    with contextlib.suppress(TypeError, ValueError, IndexError, OverflowError):
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    try:
        from huggingface_hub.utils import parse_ratelimit_headers

        limit = parse_ratelimit_headers(headers)
    except Exception:  # noqa: BLE001 - a missing helper (older hub) only loses a hint
        return None
    return float(limit.reset_in_seconds) if limit is not None and limit.remaining == 0 else None


def transient(error: BaseException) -> bool:
    """Whether another try may succeed: a 429, 408 or 5xx, a timeout, a refused or dropped
    connection; never offline mode (also as the cause of another error)."""
    from huggingface_hub.errors import OfflineModeIsEnabled

    if any(isinstance(e, OfflineModeIsEnabled) for e in _chain(error)):
        return False
    status = status_of(error)
    if status is not None:
        return status in RETRY_STATUS or status >= 500
    network = (*_network_errors(), ConnectionError, TimeoutError)
    return any(isinstance(e, network) for e in _chain(error))


def not_the_revisions_fault(error: BaseException) -> bool:
    """Whether `error` (or its cause) is a fault every later revision would meet too: a spent
    budget, a refusal (a token to give), a full disk or quota."""
    return any(isinstance(e, (RetriesExhausted, HubAccessError))
               or (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT))
               for e in _chain(error))


def _chain(error: BaseException):
    """`error` and the errors it was raised from, outermost first."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__


@functools.cache
def _network_errors() -> tuple[type[BaseException], ...]:
    """Timeouts and broken connections of the httpx that huggingface_hub uses."""
    httpx = _httpx()
    return httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError


def _say(message: str) -> None:
    """Print above a tqdm bar, if one is drawn, on stderr."""
    from tqdm.auto import tqdm  # comes with huggingface_hub

    tqdm.write(message, file=sys.stderr)


def _minutes(seconds: float, budget: float) -> str:
    if budget >= 120:
        return f"{seconds / 60:.0f} min of {budget / 60:.0f}"
    return f"{seconds:.0f} s of {budget:.0f}"


@dataclass
class Retrier:
    """The retry state of one revision (or listing): `budget_s` of waits and failed tries in
    all, the back-off's first and longest wait, where a wait is said, and an `abort` flag that
    another thread sets to stop a wait or a download at once (`Aborted`)."""

    budget_s: float = RETRY_BUDGET_S
    first_wait_s: float = FIRST_WAIT_S
    max_wait_s: float = MAX_WAIT_S
    say: Callable[[str], None] = _say
    abort: threading.Event | None = None
    tries: int = 0
    spent_s: float = 0.0
    waits: list[float] = field(default_factory=list)
    _backoffs: int = 0

    def __post_init__(self) -> None:
        if not self.first_wait_s > 0 or self.max_wait_s < self.first_wait_s:
            raise ValueError(f"Retrier: first_wait_s={self.first_wait_s} must be > 0 and at most "
                             f"max_wait_s={self.max_wait_s}: a zero wait retries without bound")
        if self.budget_s < 0:
            raise ValueError(f"retry_budget_s={self.budget_s} must be >= 0 (0: no retries)")

    @property
    def left_s(self) -> float:
        return max(0.0, self.budget_s - self.spent_s)

    def check_abort(self) -> None:
        if self.abort is not None and self.abort.is_set():
            raise Aborted("stopped: the run was interrupted")

    def call(self, fn: Callable[[], T], what: str) -> T:
        """``fn()``, tried again after each transient failure; `RetriesExhausted` (naming
        `what`, the last error and the tries) once the budget is spent."""
        while True:
            self.check_abort()
            started = time.monotonic()
            try:
                with self.attempt(what):
                    return fn()
            except Exception as error:  # noqa: BLE001 - sorted by `failed`
                self.failed(error, what, seconds=time.monotonic() - started)

    @contextlib.contextmanager
    def attempt(self, what: str, *, keep_cut: bool = False):
        """One try of `what` on this thread: huggingface_hub's calls in it are bounded, and its
        own retries end the try, for this retrier to decide (`watch_session`); with `keep_cut`,
        a body cut short hands on what arrived, and the errors that cut it are the list this
        yields."""
        watch_session()
        state = vars(_attempt)  # this thread's; a field not set reads `_Attempt`'s default
        outer = dict(state)
        state.clear()
        state.update(retrier=self, what=what, keep_cut=keep_cut, cuts=[])
        try:
            yield state["cuts"]
        finally:
            state.clear()
            state.update(outer)

    def failed(self, error: BaseException, what: str, *, seconds: float = 0.0,
               progressed: bool = False) -> None:
        """Account for one failed try of `what` that took `seconds`: return after the wait, or
        raise (`error` when it is not transient, `RetriesExhausted` when the budget is spent).
        A try that `progressed` (its partial file kept more bytes) costs nothing."""
        self.tries += 1
        if not transient(error):
            raise error
        if progressed:
            self._backoffs = 0
        else:
            self.spent_s += seconds
        status = status_of(error)
        reason = f"HTTP {status}" if status is not None else describe(error)
        asked = retry_after(getattr(getattr(cause_of(error), "response", None), "headers", None))
        if asked is not None and status in (429, 503):
            wait = max(asked, self.first_wait_s)  # never 0 s: the tries stay bounded
        else:
            wait = min(self.max_wait_s, self.first_wait_s * 2**self._backoffs)
            wait *= random.uniform(0.5, 1.0)  # jitter: jobs hit together do not retry together
            self._backoffs += 1
        if wait > self.left_s:
            raise RetriesExhausted(
                f"{what}: {reason} from {url_of(error)} after {self.tries} tries; "
                + (f"the hub asks to wait {wait:.0f} s, more than the {self.left_s:.0f} s left "
                   if asked is not None and wait > 0 else
                   f"the {self.budget_s:.0f} s retry budget is spent ")
                + f"({describe(error)})", error)
        shown = f"{wait:.0f}" if wait >= 10 else f"{wait:.1f}"
        self.say(f"waiting {shown} s: {reason} from {url_of(error)} (try {self.tries}, "
                 f"{_minutes(self.left_s - wait, self.budget_s)} left)")
        self.spent_s += wait
        self.waits.append(wait)
        self.sleep(wait)

    def sleep(self, seconds: float) -> None:
        """Wait `seconds`, or less when `abort` is set (then raise `Aborted`)."""
        if self.abort is None:
            time.sleep(seconds)
        elif self.abort.wait(seconds):
            raise Aborted("stopped: the run was interrupted")


def budget_retrier(retry_budget_s: float | None = None, *,
                   retry: Retrier | None = None) -> Retrier:
    """`retry` when given (the run's, shared), else a `Retrier` of ``retry_budget_s=``."""
    if retry is not None:
        return retry
    return Retrier() if retry_budget_s is None else Retrier(budget_s=retry_budget_s)
