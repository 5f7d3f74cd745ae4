"""Fixtures for the data tests: a shared token cache of the bundled sample, and a local HTTP
server that can serve a file whole, truncated, or not at all."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from repgeom.data.datamodule import Enwik8DataModule


@pytest.fixture(scope="session")
def sample_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder holding the sample's token cache (built once per session)."""
    cache = tmp_path_factory.mktemp("sample_cache")
    Enwik8DataModule(source="sample", cache_dir=str(cache)).prepare_data()
    return cache


@pytest.fixture
def make_dm(sample_cache: Path) -> Callable[..., Enwik8DataModule]:
    """Build a set-up sample DataModule on the shared cache; keyword arguments override."""

    def make(**kwargs) -> Enwik8DataModule:
        kwargs = {"source": "sample", "cache_dir": str(sample_cache), "block_size": 32,
                  "batch_size": 8, **kwargs}  # fmt: skip
        dm = Enwik8DataModule(**kwargs)
        dm.prepare_data()
        dm.setup("fit")
        return dm

    return make


class _Server:
    """What the handler serves: ``files[path] = bytes``; paths in ``truncate`` announce the
    full Content-Length but send only half the body, then close the connection."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.truncate: set[str] = set()
        self.requests: list[str] = []
        self.url = ""


@pytest.fixture
def http_server() -> Iterator[_Server]:
    state = _Server()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            state.requests.append(self.path)
            body = state.files.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.path in state.truncate:
                self.wfile.write(body[: len(body) // 2])
                self.close_connection = True
            else:
                self.wfile.write(body)

        def log_message(self, *args) -> None:  # keep the test output quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
