"""One hub file onto the disk: resumed where a try (or an earlier run) stopped, proved by its
hash before it takes its name, every try bounded and inside the revision's retry budget.

huggingface_hub's own ``file_download.http_get`` fetches the bytes (its ``Range`` request, its
handling of a server that ignores ``Range``, its progress bar), one call per try, into a
partial file of ours, ``<name>.incomplete``. What the library lacks, and this module adds:

- **Resume across runs.** ``hf_hub_download`` writes to a temporary file unique to its call and
  deletes it when the call fails: a file dropped at 2.8 of 2.9 GB started again from zero. Here
  the partial file stays, and ``http_get(resume_size=)`` asks for the rest.
- **One retry budget.** ``http_get`` resumes after a cut on its own, for ever while bytes
  arrive; its second request ends the try (`repgeom.models.hub.calls.LibraryRetry`) and the
  revision's `Retrier` decides.
- **A cut keeps every byte that arrived** (`repgeom.models.hub.calls._cut_kept`: ``http_get``
  loses the part of its 10 MiB chunk in flight). A kill -9 still loses up to 10 MiB.
- **Progress counted as kept bytes**: a try is progress only when the partial file kept more
  than before it; bytes thrown away (a hash mismatch, a server that ignores ``Range``, more
  bytes than the file has) cost the budget like any failed try.
- **Proof.** A file is accepted by its content, never its size: the hub's LFS sha256 (hashed as
  the bytes arrive), else the git blob id the hub lists, else the commit it was fetched at. The
  proof is recorded beside the file once its bytes are fsynced; a finished file found later is
  kept only when its recorded proof is the hub's now and its size is the hub's.
- **A resumed request answered from another byte** (a 206 whose ``Content-Range`` starts
  elsewhere) is never appended: from byte 0 it is the whole file, from any other byte its try
  fails (`repgeom.models.hub.calls.RangeMismatch`) and later tries ask for the whole file.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repgeom.files import fsync_dir, fsync_file, read_json
from repgeom.models.hub.calls import Aborted, LibraryRetry, RangeMismatch, Retrier
from repgeom.models.hub.download_folders import PARTIAL, PROOFS, record_proof

CHUNK = 1 << 20
"""Bytes read at a time from a file being hashed."""


@dataclass(frozen=True)
class HubFile:
    """One file of a revision as the hub lists it: size, LFS sha256 (None for a file kept in
    git) and git blob id (None when the listing gives none)."""

    name: str
    size: int | None
    sha256: str | None
    blob_id: str | None = None

    def proof(self, commit: str) -> str:
        """What this file is checked against: ``sha256:``, ``blob:`` or ``commit:``."""
        if self.sha256:
            return f"sha256:{self.sha256}"
        return f"blob:{self.blob_id}" if self.blob_id else f"commit:{commit}"


class Transfer:
    """Bytes written by one revision's fetch, failed tries included."""

    def __init__(self) -> None:
        self.received = 0


def sha256_of(path: Path) -> str:
    """The sha256 (hex) of a file's content."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _hash_prefix(path: Path, size: int) -> tuple[Any, int]:
    """The sha256 state of the first `size` bytes of `path`, and the bytes it read."""
    digest, hashed = hashlib.sha256(), 0
    if size:
        with open(path, "rb") as handle:
            while hashed < size and (chunk := handle.read(min(CHUNK, size - hashed))):
                digest.update(chunk)
                hashed += len(chunk)
    return digest, hashed


def _git_blob_id(path: Path) -> str:
    data = path.read_bytes()  # a file kept in git: small
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


class _Kept:
    """The partial file, open at its end, as ``http_get`` writes it: hashed and counted, the
    abort checked."""

    def __init__(self, path: Path, limit: int | None, retrier: Retrier,
                 transfer: Transfer) -> None:
        self.handle = open(path, "r+b" if _size(path) else "w+b")  # noqa: SIM115 - `__exit__`
        self.path, self.limit, self.retrier, self.transfer = path, limit, retrier, transfer
        self.restarted = False
        try:
            self.digest, self.size = _hash_prefix(path, self.handle.seek(0, os.SEEK_END))
        except BaseException:
            self.handle.close()
            raise

    def __enter__(self) -> _Kept:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.close()

    def write(self, chunk: bytes) -> int:
        self.retrier.check_abort()
        self.handle.write(chunk)
        self.digest.update(chunk)
        self.size += len(chunk)
        self.transfer.received += len(chunk)
        if self.limit is not None and self.size > self.limit:
            raise ConnectionError(f"{self.path.name}: more bytes arrived than the {self.limit} "
                                  "the hub lists; downloading it again")
        return len(chunk)

    def tell(self) -> int:
        return self.handle.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.handle.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        """The server ignored ``Range``: ``http_get`` starts the file again."""
        kept = self.handle.truncate(size)
        self.restarted = True  # the bytes kept before are thrown away: no try of this is progress
        self.handle.flush()
        self.digest, self.size = _hash_prefix(self.path, kept)
        return kept


def download_file(url: str, file: HubFile, dest: Path, commit: str, retrier: Retrier,
                  transfer: Transfer, what: str) -> None:
    """`file` into `dest`, resuming ``<name>.incomplete``, proved before it takes its name."""
    final, part = dest / file.name, dest / (file.name + PARTIAL)
    proof = file.proof(commit)
    if (final.is_file() and (read_json(dest / PROOFS) or {}).get(file.name) == proof
            and file.size in (None, final.stat().st_size)):
        return  # finished and proved by an earlier try or run (and not cut short by a crash)
    final.unlink(missing_ok=True)  # unproved (or of another commit): in our folder, fetched anew
    ranges = True  # False once the server answered a Range from another byte: whole files
    while True:
        retrier.check_abort()
        kept_before = _size(part)  # progress is measured against what was kept
        if (file.size is not None and kept_before > file.size) or not ranges:
            part.unlink(missing_ok=True)  # asked for whole: replaced by what comes
        started = time.monotonic()
        kept, cuts = None, []
        try:
            # a cut keeps what arrived only where the listed size says when all did (a request
            # from the end is refused: 416)
            with retrier.attempt(what, keep_cut=file.size is not None) as cuts, \
                    _Kept(part, file.size, retrier, transfer) as kept:
                _get(url, file, kept)
            _check(part, kept.digest.hexdigest(), file)
            fsync_file(part)  # its bytes on the disk before a proof names them
            record_proof(dest, file.name, proof)  # first: a kill between the two loses nothing
            os.replace(part, final)  # not atomic_write: a partial file is resumed (Range)
            fsync_dir(dest)
            return
        except Aborted:
            raise
        except Exception as error:  # noqa: BLE001 - sorted by the retrier
            ranges = ranges and not isinstance(error, RangeMismatch)
            size = _size(part)
            if file.size is not None and size > file.size:  # thrown away: not progress
                part.unlink()
            # progress is what the partial file keeps, not what arrived (module docstring)
            retrier.failed(_cause(error, cuts, file, size), what,
                           seconds=time.monotonic() - started,
                           progressed=kept_before < size <= (file.size or size)
                           and not (kept is not None and kept.restarted))


def _get(url: str, file: HubFile, kept: _Kept) -> None:
    """One ``http_get`` of what the partial file lacks, appended to it; bodies asked unencoded,
    so that what arrives is the file's bytes."""
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    if file.size is None or kept.size < file.size:
        http_get(url, kept, resume_size=kept.size, expected_size=file.size,
                 headers={**build_hf_headers(), "Accept-Encoding": "identity"},
                 displayed_filename=file.name)


def _check(part: Path, digest: str, file: HubFile) -> None:
    """The bytes received are the hub's (its LFS sha256, else its git blob id), or `part` is
    deleted and the try fails."""
    if file.sha256 is not None and digest != file.sha256:
        wrong = "sha256"
    elif file.sha256 is None and file.blob_id and _git_blob_id(part) != file.blob_id:
        wrong = "git blob id"
    else:
        return
    part.unlink()
    raise ConnectionError(f"{file.name}: the {wrong} of the bytes received is not the hub's; "
                          "downloading it again")


def _cause(error: BaseException, cuts: list, file: HubFile, size: int) -> BaseException:
    """What failed a try, as the retrier judges and says it: the library's own retry by what
    broke the transfer off; http_get's "Consistency check failed" (a body that ended early, at a
    cut whose bytes were kept or cleanly, as a proxy's close-delimited or chunked answer cut) by
    the cut, so that it is resumed as any cut."""
    if isinstance(error, LibraryRetry):
        error = error.__cause__ or error.__context__ or error
    if type(error) is OSError and error.errno is None and size != file.size:
        return cuts[-1] if cuts else ConnectionError(
            f"{file.name}: {size} of {file.size} bytes arrived")
    return error


def resolve_url(repo: str, revision: str, name: str) -> str:
    """The hub's URL of file `name` of model `repo` at `revision`, as ``hf_hub_url`` quotes it."""
    from urllib.parse import quote

    from huggingface_hub import constants

    return f"{constants.ENDPOINT}/{repo}/resolve/{quote(revision, safe='')}/{quote(name)}"


def get_text(url: str, retrier: Retrier, what: str) -> str:
    """The text of a small hub file (an index), through the retrier, bounded like a download."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    def get() -> str:
        response = get_session().get(url, headers=build_hf_headers(), follow_redirects=True)
        hf_raise_for_status(response)
        return response.text

    return retrier.call(get, what)
