"""A local stand-in for the Hugging Face Hub's file API (importable as `hub_server`), with the real
hub's faults on demand.

There is no internet here, so hub downloads are tested against this server: point
`HF_ENDPOINT` at `FakeHub.url` and `huggingface_hub` (under transformers' `from_pretrained`)
downloads, checks and caches files exactly as it does from huggingface.co. It serves
`/{repo_id}/resolve/{revision}/{filename}` from one folder per revision, with the headers the
client reads (`X-Repo-Commit`, `ETag`, `Content-Length`), HTTP `Range` requests (206, as the
hub's CDN answers a resumed download) and the hub's error codes on a 404;
`/api/models/{repo_id}/refs` (what `HfApi.list_repo_refs` reads): every revision as a branch, or
as a tag when named in `tags`; `/api/models/{repo_id}/revision/{ref}` (`HfApi.model_info`), whose
siblings carry `lfs: {sha256, size}` for weights files when asked (`?blobs=true`), and the tree API.

What the real hub does, on demand (each tested through `fetch_revision` or `list_refs`):

- `faults`: a list of `Fault` (an HTTP status such as 429 with a `Retry-After`, or 500, or a
  connection cut after some bytes of a file, or after all of them), each served to the first
  `times` requests it matches; `add_fault` adds one while the server runs, `hook(request)` may
  return one for any `Request` (served to that request only: a benchmark's faults at random
  moments);
- `gated`: every file answers 401 (403 with a token), `X-Error-Code: GatedRepo`;
- `broken` (kept from before): the first file downloads of a revision fail with HTTP 500;
- `bytes_per_second`: a slow network;
- `silent`: accept every connection, read the request and never answer (a half-open connection
  through a proxy): the client's read timeout is all that ends the call;
- `ignore_range`: a proxy that ignores ``Range`` and always sends the whole file with 200 (with a
  `Fault`'s `cut_after`, one that cuts every transfer at the same byte);
- `wrong_range_start`: a proxy that answers every ``Range`` request with a 206 from this byte
  instead of the one asked (its ``Content-Range`` says so);
- `extra_bytes`: a CDN that sends this many bytes more than the listing's size for every file
  (a stale or corrupted object): bytes that must be thrown away;
- `move(revision, folder)`: a branch that moves to a new commit (the old commit stops resolving);
- a revision whose folder holds no weights is a config-only branch; two revisions that point to
  one folder serve identical weights; a folder saved with shards and an index, or `.bin` only,
  is served as it is.

`bytes_sent` counts the file bytes sent (cut ones included) and `served` each request, so that a
test or a benchmark can tell what was downloaded twice.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".ckpt", ".h5", ".msgpack", ".onnx")
"""Files the hub keeps in Git LFS (as its default ``.gitattributes`` does): these carry ``lfs``
metadata."""


def commit_of(revision: str) -> str:
    """The 40-hex commit id the fake hub gives a revision."""
    return hashlib.sha1(revision.encode()).hexdigest()


def git_blob_id(file: Path) -> str:
    """The git blob id of a file (sha1 of ``blob <size>\\0`` and its content), as the hub gives
    in ``blobId``: it changes with the content."""
    data = file.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Fault:
    """A fault served to the first `times` requests that match it.

    on : which requests: ``"refs"``, ``"info"`` (model_info), ``"tree"``, ``"api"`` (any of
    those three), ``"file"`` (a file's GET), ``"head"`` (a file's HEAD) or ``"any"``;
    status : answer this HTTP status instead (429, 500, 503 ...); retry_after : the
    ``Retry-After`` header sent with it (seconds, or an HTTP date); cut_after : for a file, send
    the headers of the whole answer, then only this many bytes, then close the connection;
    unterminated : for a file, send the whole body chunked (no ``Content-Length``), then close
    the connection without the last, empty chunk: every byte arrives, then the connection fails;
    revision, filename : only requests for this revision / files matching this glob (None: any).
    """

    on: str = "any"
    status: int | None = None
    retry_after: str | None = None
    cut_after: int | None = None
    unterminated: bool = False
    times: float = 1
    revision: str | None = None
    filename: str | None = None

    def matches(self, request: Request) -> bool:
        kinds = {"any": None, "api": ("refs", "info", "tree")}.get(self.on, (self.on,))
        return (self.times > 0 and (kinds is None or request.kind in kinds)
                and self.revision in (None, request.revision)
                and (self.filename is None or fnmatch.fnmatch(request.filename or "",
                                                              self.filename)))


@dataclass(frozen=True)
class Request:
    """One request as the hub stand-in sees it (what `Fault` and `FakeHub.hook` match on)."""

    kind: str  # "refs", "info", "tree", "file", "head" or "other"
    method: str
    revision: str | None = None
    filename: str | None = None
    range_start: int = 0
    authorized: bool = False


class FakeHub:
    """Serve one model repository, `repo_id`, whose revisions are the given folders.

    As on the hub, a file is addressed by revision name or by commit id (the client asks
    `/api/models/{repo_id}/revision/{name}` for the commit first, then downloads by commit).
    """

    def __init__(
        self, repo_id: str, revisions: dict[str, str | Path], *, tags: tuple[str, ...] = (),
        broken: dict[str, int] | None = None, bytes_per_second: float | None = None,
        faults: list[Fault] | None = None, gated: bool = False,
        hook: Callable[[Request], Fault | None] | None = None, silent: bool = False,
        ignore_range: bool = False, extra_bytes: int = 0, wrong_range_start: int | None = None,
    ) -> None:
        self.repo_id = repo_id
        self.bytes_per_second = bytes_per_second  # a slow network (benchmarks), None: no limit
        self.broken = dict(broken or {})  # revision -> how many file downloads fail (HTTP 500)
        self.revisions = {rev: Path(folder) for rev, folder in revisions.items()}
        self.tags = tuple(tags)
        self.faults = list(faults or [])
        self.gated = gated
        self.hook = hook
        self.silent = silent
        self.ignore_range = ignore_range
        self.extra_bytes = extra_bytes
        self.wrong_range_start = wrong_range_start
        self.commits: dict[str, str] = {}  # a moved branch's commit (`move`), else `commit_of`
        self._closing = threading.Event()  # ends the silent answers at shutdown
        self.requests: list[tuple[str, str]] = []
        self.served: list[list] = []  # [request, status, file bytes sent] of each request
        self.bytes_sent = 0  # file bytes sent with GET, cut answers included
        self._lock = threading.Lock()
        self._sha256: dict[tuple[str, float, int], str] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def commit(self, revision: str) -> str:
        """The commit id `revision` points to now."""
        return self.commits.get(revision) or commit_of(revision)

    def move(self, revision: str, folder: str | Path) -> str:
        """Point branch `revision` at new files, `folder`, under a new commit (returned)."""
        self.revisions[revision] = Path(folder)
        self.commits[revision] = hashlib.sha1(
            f"{revision}@{len(self.commits)}:{folder}".encode()).hexdigest()
        return self.commits[revision]

    def revision_of(self, ref: str) -> str | None:
        """The revision a reference names: the revision itself or its commit id."""
        by_commit = {self.commit(rev): rev for rev in self.revisions}
        return ref if ref in self.revisions else by_commit.get(ref)

    def downloads(self) -> set[tuple[str, str]]:
        """(revision, filename) of every file sent with GET."""
        prefix = f"/{self.repo_id}/resolve/"
        sent = set()
        for method, path in self.requests:
            if method == "GET" and path.startswith(prefix):
                ref, _, filename = unquote(path[len(prefix):]).partition("/")
                sent.add((self.revision_of(ref), filename))
        return sent

    def add_fault(self, fault: Fault) -> Fault:
        """Serve `fault` from now on (to the next `fault.times` requests it matches)."""
        with self._lock:
            self.faults.append(fault)
        return fault

    def sha256(self, file: Path) -> str:
        """The sha256 of a served file (the hub's LFS oid), computed once per version."""
        stat = file.stat()
        key = (str(file), stat.st_mtime, stat.st_size)
        if key not in self._sha256:
            self._sha256[key] = hashlib.sha256(file.read_bytes()).hexdigest()
        return self._sha256[key]

    def _fault_for(self, request: Request) -> Fault | None:
        with self._lock:
            fault = self.hook(request) if self.hook is not None else None
            if fault is None:
                fault = next((f for f in self.faults if f.matches(request)), None)
                if fault is not None:
                    fault.times -= 1
            return fault

    def _begin(self, request: Request) -> list:
        """The entry of `served` for `request`: [request, status, bytes sent], filled in as the
        answer goes out (before the client can see it: a test reads it once its call returns)."""
        entry = [request, 0, 0]
        with self._lock:
            self.served.append(entry)
        return entry

    def _sent(self, entry: list, n: int) -> None:
        with self._lock:
            entry[2] += n
            if entry[0].kind == "file":
                self.bytes_sent += n

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                self._answer(send_body=False)

            def do_GET(self) -> None:
                self._answer(send_body=True)

            def log_message(self, *args: object) -> None:
                pass

            def send_response(self, code: int, message: str | None = None) -> None:
                self._entry[1] = code  # recorded with the request in `served`
                super().send_response(code, message)

            def _answer(self, send_body: bool) -> None:
                hub.requests.append((self.command, self.path))
                if hub.silent:  # accepted, read, never answered
                    self._request("other")
                    hub._closing.wait()
                    self.close_connection = True
                    return
                path, _, query = self.path.partition("?")
                path = unquote(path)
                resolve = f"/{hub.repo_id}/resolve/"
                info = f"/api/models/{hub.repo_id}/revision/"
                tree = f"/api/models/{hub.repo_id}/tree/"
                if path.startswith("/api/models/") and path.endswith("/refs"):
                    request = self._request("refs")
                    if not self._faulty(request, send_body):
                        self._refs(path[len("/api/models/"):-len("/refs")], send_body)
                elif path.startswith(resolve):
                    ref, _, filename = path[len(resolve):].partition("/")
                    request = self._request("file" if send_body else "head", ref, filename)
                    if not self._faulty(request, send_body):
                        self._file(request, ref, filename, send_body)
                elif path.startswith(info):
                    request = self._request("info", path[len(info):])
                    if not self._faulty(request, send_body):
                        blobs = parse_qs(query).get("blobs", [""])[0].lower() == "true"
                        self._model_info(path[len(info):], send_body, blobs)
                elif path.startswith(tree):
                    ref, _, folder = path[len(tree):].partition("/")
                    request = self._request("tree", ref)
                    if not self._faulty(request, send_body):
                        self._tree(ref, folder, send_body)
                else:  # other hub APIs (telemetry, ...): not part of downloading a model
                    self._request("other")
                    self._error(404, "", send_body)

            def _request(self, kind: str, ref: str | None = None,
                         filename: str | None = None) -> Request:
                start = 0
                wanted = self.headers.get("Range", "")
                if wanted.startswith("bytes=") and wanted[6:].split("-")[0].isdigit():
                    start = int(wanted[6:].split("-")[0])
                authorized = "authorization" in {k.lower() for k in self.headers}
                revision = hub.revision_of(ref) if ref is not None else None
                request = Request(kind, self.command, revision or ref, filename, start, authorized)
                self._entry = hub._begin(request)
                return request

            def _faulty(self, request: Request, send_body: bool) -> bool:
                """Answer with a fault's status if one matches `request` (a cut is done by
                `_file`); True when answered."""
                fault = hub._fault_for(request)
                self._cut = fault.cut_after if fault is not None else None
                self._unterminated = fault is not None and fault.unterminated
                if fault is None or fault.status is None:
                    return False
                headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
                code = {429: "", 500: "InternalError"}.get(fault.status, "")
                self._error(fault.status, code, send_body, headers=headers)
                return True

            def _file(self, request: Request, ref: str, filename: str, send_body: bool) -> None:
                revision = hub.revision_of(ref)
                if revision is None:
                    return self._error(404, "RevisionNotFound", send_body)
                if hub.gated:  # the hub's answer to an unauthorized download of a gated file
                    status = 403 if request.authorized else 401
                    return self._error(status, "GatedRepo", send_body, hub.commit(revision))
                folder = hub.revisions[revision]
                file = folder / filename
                if send_body and hub.broken.get(revision, 0) > 0:  # a download that breaks
                    hub.broken[revision] -= 1
                    return self._error(500, "InternalError", send_body)
                if not file.is_file():
                    return self._error(404, "EntryNotFound", send_body, hub.commit(revision))
                data = file.read_bytes() + b"\0" * hub.extra_bytes
                start = (request.range_start if "Range" in self.headers
                         and not hub.ignore_range else None)
                if start is not None and hub.wrong_range_start is not None:
                    start = hub.wrong_range_start  # not the byte asked for
                if start is not None and start >= len(data) > 0:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                body = data[start or 0:]
                self.send_response(206 if start is not None else 200)
                self.send_header("X-Repo-Commit", hub.commit(revision))
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                if file.name.endswith(LFS_SUFFIXES):  # what the hub adds for an LFS file
                    self.send_header("X-Linked-Etag", f'"{hub.sha256(file)}"')
                    self.send_header("X-Linked-Size", str(len(data)))
                if start is not None:
                    self.send_header("Content-Range",
                                     f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Accept-Ranges", "bytes")
                if send_body and self._unterminated:
                    self.send_header("Transfer-Encoding", "chunked")
                else:
                    self.send_header("Content-Length", str(len(body)))
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()
                if send_body and self._unterminated:  # one chunk, never the empty last one
                    self.wfile.write(b"%x\r\n" % len(body))
                    self._send_throttled(body)
                    self.wfile.write(b"\r\n")
                    self.wfile.flush()
                    self.close_connection = True
                elif send_body:
                    cut = self._cut
                    self._send_throttled(body if cut is None else body[:cut])
                    if cut is not None:  # the connection drops before the whole body is sent
                        self.wfile.flush()
                        self.close_connection = True
                return None

            def _send_throttled(self, data: bytes) -> None:
                rate = hub.bytes_per_second
                chunk = len(data) if rate is None else max(1, int(rate / 20))  # 20 writes/s
                try:
                    for start in range(0, len(data), chunk):
                        if rate is not None and start:
                            time.sleep(chunk / rate)
                        hub._sent(self._entry, len(data[start:start + chunk]))
                        self.wfile.write(data[start:start + chunk])
                except (BrokenPipeError, ConnectionResetError):  # the client went away
                    self.close_connection = True

            def _refs(self, repo_id: str, send_body: bool) -> None:
                # The hub's JSON (huggingface_hub.HfApi.list_repo_refs reads name, ref and
                # targetCommit of each entry of branches, converts and tags).
                if repo_id != hub.repo_id:
                    return self._error(404, "RepoNotFound", send_body)

                def entry(rev: str, kind: str) -> dict:
                    return {"name": rev, "ref": f"refs/{kind}/{rev}",
                            "targetCommit": hub.commit(rev)}

                refs = {
                    "branches": [entry(r, "heads") for r in hub.revisions if r not in hub.tags],
                    "converts": [],
                    "tags": [entry(r, "tags") for r in hub.revisions if r in hub.tags],
                }
                self._json(refs, send_body)
                return None

            def _model_info(self, ref: str, send_body: bool, blobs: bool = False) -> None:
                revision = hub.revision_of(ref)
                if revision is None:
                    return self._error(404, "RevisionNotFound", send_body)
                folder = hub.revisions[revision]
                siblings = []
                for p in sorted(folder.iterdir()):
                    sibling: dict = {"rfilename": p.name, "size": p.stat().st_size}
                    if blobs:
                        sibling["blobId"] = git_blob_id(p)
                        if p.name.endswith(LFS_SUFFIXES):
                            sibling["lfs"] = {"sha256": hub.sha256(p), "size": p.stat().st_size,
                                              "pointerSize": 134}
                    siblings.append(sibling)
                info = {"id": hub.repo_id, "sha": hub.commit(revision), "siblings": siblings,
                        "gated": "auto" if hub.gated else False}
                self._json(info, send_body)
                return None

            def _tree(self, ref: str, folder: str, send_body: bool) -> None:
                revision = hub.revision_of(ref)
                if revision is None:
                    return self._error(404, "RevisionNotFound", send_body)
                listed = hub.revisions[revision] / folder
                if not listed.is_dir():
                    return self._error(404, "EntryNotFound", send_body, hub.commit(revision))
                entries = []
                for p in sorted(listed.iterdir()):
                    entry: dict = {
                        "type": "directory" if p.is_dir() else "file",
                        "path": str(p.relative_to(hub.revisions[revision])),
                        "size": 0 if p.is_dir() else p.stat().st_size,
                        "oid": git_blob_id(p) if p.is_file() else commit_of(p.name)}
                    if p.is_file() and p.name.endswith(LFS_SUFFIXES):
                        entry["lfs"] = {"oid": hub.sha256(p), "size": p.stat().st_size,
                                        "pointerSize": 134}
                    entries.append(entry)
                self._json(entries, send_body)
                return None

            def _json(self, value: object, send_body: bool) -> None:
                body = json.dumps(value).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

            def _error(self, status: int, code: str, send_body: bool, commit: str = "",
                       headers: dict[str, str] | None = None) -> None:
                body = json.dumps({"error": code or f"HTTP {status}"}).encode()
                self.send_response(status)
                if code:
                    self.send_header("X-Error-Code", code)
                if commit:
                    self.send_header("X-Repo-Commit", commit)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

        return Handler


__all__ = ["Fault", "FakeHub", "Request", "commit_of"]
