"""A local stand-in for the Hugging Face Hub's file API (importable as `hub_server`).

There is no internet here, so hub downloads are tested against this server: point
`HF_ENDPOINT` at `FakeHub.url` and `huggingface_hub` (under transformers' `from_pretrained`)
downloads, checks and caches files exactly as it does from huggingface.co. It serves
`/{repo_id}/resolve/{revision}/{filename}` from one folder per revision, with the headers the
client reads (`X-Repo-Commit`, `ETag`, `Content-Length`) and the hub's error codes on a 404, and
`/api/models/{repo_id}/refs` (what `HfApi.list_repo_refs` reads): every revision as a branch, or
as a tag when named in `tags`. `broken` makes the first file downloads of a revision fail (HTTP
500), as a network that drops does.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote


def commit_of(revision: str) -> str:
    """The 40-hex commit id the fake hub gives a revision."""
    return hashlib.sha1(revision.encode()).hexdigest()


def lfs_of(path: Path) -> dict:
    """The hub's LFS record of a weights file (``siblings[].lfs`` with ``files_metadata``): its
    sha256 and size; other files are stored in git and have none."""
    if path.suffix not in (".safetensors", ".bin"):
        return {}
    data = path.read_bytes()
    return {"lfs": {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                    "pointerSize": 134}}


class FakeHub:
    """Serve one model repository, `repo_id`, whose revisions are the given folders.

    As on the hub, a file is addressed by revision name or by commit id (the client asks
    `/api/models/{repo_id}/revision/{name}` for the commit first, then downloads by commit).
    """

    def __init__(
        self, repo_id: str, revisions: dict[str, str | Path], *, tags: tuple[str, ...] = (),
        broken: dict[str, int] | None = None, bytes_per_second: float | None = None,
    ) -> None:
        self.repo_id = repo_id
        self.bytes_per_second = bytes_per_second  # a slow network (benchmarks), None: no limit
        self.broken = dict(broken or {})  # revision -> how many file downloads fail (HTTP 500)
        self.revisions = {rev: Path(folder) for rev, folder in revisions.items()}
        self.tags = tuple(tags)
        self.requests: list[tuple[str, str]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def revision_of(self, ref: str) -> str | None:
        """The revision a reference names: the revision itself or its commit id."""
        by_commit = {commit_of(rev): rev for rev in self.revisions}
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

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
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

            def _answer(self, send_body: bool) -> None:
                hub.requests.append((self.command, self.path))
                path = unquote(self.path.split("?", 1)[0])
                resolve = f"/{hub.repo_id}/resolve/"
                info = f"/api/models/{hub.repo_id}/revision/"
                tree = f"/api/models/{hub.repo_id}/tree/"
                if path.startswith("/api/models/") and path.endswith("/refs"):
                    self._refs(path[len("/api/models/"):-len("/refs")], send_body)
                elif path.startswith(resolve):
                    ref, _, filename = path[len(resolve):].partition("/")
                    self._file(ref, filename, send_body)
                elif path.startswith(info):
                    self._model_info(path[len(info):], send_body)
                elif path.startswith(tree):
                    ref, _, folder = path[len(tree):].partition("/")
                    self._tree(ref, folder, send_body)
                else:  # other hub APIs (telemetry, ...): not part of downloading a model
                    self._error(404, "", send_body)

            def _file(self, ref: str, filename: str, send_body: bool) -> None:
                revision = hub.revision_of(ref)
                if revision is None:
                    return self._error(404, "RevisionNotFound", send_body)
                folder = hub.revisions[revision]
                file = folder / filename
                if send_body and hub.broken.get(revision, 0) > 0:  # a download that breaks
                    hub.broken[revision] -= 1
                    return self._error(500, "InternalError", send_body)
                if not file.is_file():
                    return self._error(404, "EntryNotFound", send_body, commit_of(revision))
                data = file.read_bytes()
                self.send_response(200)
                self.send_header("X-Repo-Commit", commit_of(revision))
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()
                if send_body:
                    self._send_throttled(data)

            def _send_throttled(self, data: bytes) -> None:
                rate = hub.bytes_per_second
                if rate is None:
                    self.wfile.write(data)
                    return
                chunk = max(1, int(rate / 20))  # 20 writes a second
                for start in range(0, len(data), chunk):
                    self.wfile.write(data[start:start + chunk])
                    time.sleep(min(chunk, len(data) - start) / rate)

            def _refs(self, repo_id: str, send_body: bool) -> None:
                # The hub's JSON (huggingface_hub.HfApi.list_repo_refs reads name, ref and
                # targetCommit of each entry of branches, converts and tags).
                if repo_id != hub.repo_id:
                    return self._error(404, "RepoNotFound", send_body)

                def entry(rev: str, kind: str) -> dict:
                    return {"name": rev, "ref": f"refs/{kind}/{rev}",
                            "targetCommit": commit_of(rev)}

                refs = {
                    "branches": [entry(r, "heads") for r in hub.revisions if r not in hub.tags],
                    "converts": [],
                    "tags": [entry(r, "tags") for r in hub.revisions if r in hub.tags],
                }
                self._json(refs, send_body)

            def _model_info(self, ref: str, send_body: bool) -> None:
                revision = hub.revision_of(ref)
                if revision is None:
                    return self._error(404, "RevisionNotFound", send_body)
                folder = hub.revisions[revision]
                siblings = [{"rfilename": p.name, "size": p.stat().st_size, **lfs_of(p)}
                            for p in sorted(folder.iterdir())]
                info = {"id": hub.repo_id, "sha": commit_of(revision), "siblings": siblings}
                self._json(info, send_body)

            def _tree(self, ref: str, folder: str, send_body: bool) -> None:
                revision = hub.revision_of(ref)
                if revision is None:
                    return self._error(404, "RevisionNotFound", send_body)
                listed = hub.revisions[revision] / folder
                if not listed.is_dir():
                    return self._error(404, "EntryNotFound", send_body, commit_of(revision))
                entries = [
                    {"type": "directory" if p.is_dir() else "file",
                     "path": str(p.relative_to(hub.revisions[revision])),
                     "size": 0 if p.is_dir() else p.stat().st_size, "oid": commit_of(p.name)}
                    for p in sorted(listed.iterdir())
                ]  # fmt: skip
                self._json(entries, send_body)

            def _json(self, value: object, send_body: bool) -> None:
                body = json.dumps(value).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

            def _error(self, status: int, code: str, send_body: bool, commit: str = "") -> None:
                body = json.dumps({"error": code}).encode()
                self.send_response(status)
                if code:
                    self.send_header("X-Error-Code", code)
                if commit:
                    self.send_header("X-Repo-Commit", commit)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

        return Handler
