"""One hub file onto the disk: resumed where a try stopped, proved by its hash before it takes
its name, every try bounded and inside the revision's retry budget.

Files are fetched here, one HTTP ``GET`` each (by commit, through huggingface_hub's session and
token), not with ``snapshot_download``: huggingface_hub 2.x downloads into a temporary file unique
to each call and deletes it when the call fails (``file_download._download_to_tmp_and_move``,
huggingface_hub PR 4228), so a file dropped at 2.8 of 2.9 GB started again from zero, and its own
retries (5, at most 8 s apart) are silent and outside any budget.

**Proof.** A file is accepted by its content, never by its size: the hub's LFS sha256, else the
git blob id the hub lists (``blobId``: the sha1 of ``blob <size>\\0`` and the content), else the
commit it was fetched at. The proof is recorded beside the file
(`repgeom.models.hub.download_folders.record_proof`); a finished file found on a later start is
kept only when its recorded proof is the one the hub gives now and its size is the hub's (a
node that crashed after the rename can leave it short: its bytes are fsynced before the proof is
recorded, but a file written by an older repgeom was not).

**Resuming.** A try asks for the rest of a partial file (``Range: bytes=<have>-``), and the
answer's bytes are appended only when it is a 206 whose ``Content-Range`` (``bytes
START-END/TOTAL``, RFC 9110 section 14.4) starts at that byte. A server that ignores ``Range``
(a 200, or a 206 from byte 0) sends the whole file, which replaces the partial one; a 206 from
another byte, or without a ``Content-Range`` to read, fails its try and the file's later tries ask
for the whole file. Appended, such bytes made a file whose sha256 failed only at its end (the
whole transfer wasted), or, for a file with no hash to check, a wrong file.

**Progress.** A try is progress only when the partial file kept more bytes than it had before the
try: bytes thrown away (a sha256 mismatch, a server that ignores ``Range`` and starts again from
0 or answers another range, more bytes than the file has) cost the budget like any failed try, so
identical failures at the same byte end within the budget.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repgeom.files import fsync_dir, fsync_file, read_json
from repgeom.models.hub.calls import Aborted, Retrier, timeout
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
    """Bytes received by one revision's fetch, failed tries included."""

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


def first_byte(response: Any) -> int | None:
    """The byte of the file an answer's body starts at: 0 for a 200, the ``START`` of a 206's
    ``Content-Range: bytes START-END/TOTAL``, None for a 206 without one that can be read."""
    if response.status_code != 206:
        return 0
    found = re.fullmatch(r"bytes\s+(\d+)-\d+/(?:\d+|\*)",
                         response.headers.get("Content-Range", "").strip())
    return int(found.group(1)) if found else None


def download_file(url: str, file: HubFile, dest: Path, commit: str, retrier: Retrier,
                  transfer: Transfer, what: str) -> None:
    """`file` into `dest`, resuming ``<name>.incomplete`` where a try stopped, checked against
    its size and its proof (see the module docstring) before it takes its name."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    final, part = dest / file.name, dest / (file.name + PARTIAL)
    proof = file.proof(commit)
    if (final.is_file() and (read_json(dest / PROOFS) or {}).get(file.name) == proof
            and file.size in (None, final.stat().st_size)):
        return  # finished and proved by an earlier try or run (and not cut short by a crash)
    final.unlink(missing_ok=True)  # unproved (or of another commit): in our folder, fetched anew
    digest, hashed = hashlib.sha256(), 0
    ranges = True  # False once the server answered a Range with another range: whole files
    while True:
        retrier.check_abort()
        have = _size(part)
        if file.size is not None and have > file.size:
            part.unlink()
            have = 0
        if hashed != have:  # a partial file from an earlier run (or none): hash what it holds
            digest, hashed = _hash_prefix(part, have)
        started = time.monotonic()
        try:
            if file.size is None or have < file.size:
                headers = build_hf_headers()
                if have and ranges:
                    headers["Range"] = f"bytes={have}-"
                with get_session().stream("GET", url, headers=headers, timeout=timeout(),
                                          follow_redirects=True) as response:
                    if response.status_code >= 400:
                        response.read()  # the error's message is in the body
                        hf_raise_for_status(response)
                    start, mode = first_byte(response), "ab"
                    if start not in (have, 0):  # another range: of no use here
                        ranges = False
                        raise ConnectionError(
                            f"{file.name}: asked for its bytes from {have}, the server answered "
                            f"{response.status_code} with Content-Range "
                            f"{response.headers.get('Content-Range')!r}; asking for the whole "
                            "file")
                    if start != have:  # the whole file (the Range ignored): anew
                        mode, digest, hashed = "wb", hashlib.sha256(), 0
                    with open(part, mode) as handle:
                        for chunk in response.iter_bytes():  # as they arrive: none lost
                            retrier.check_abort()
                            handle.write(chunk)
                            digest.update(chunk)
                            hashed += len(chunk)
                            transfer.received += len(chunk)
                            if file.size is not None and hashed > file.size:
                                break  # more than the file has: thrown away below
            size = _size(part)
            if file.size is not None and size > file.size:  # thrown away: not progress
                part.unlink()
                raise ConnectionError(f"{file.name}: {size} bytes arrived, more than the "
                                      f"{file.size} the hub lists; downloading it again")
            if file.size is not None and size != file.size:
                raise ConnectionError(f"{file.name}: {size} of {file.size} bytes arrived")
            if file.sha256 is not None and digest.hexdigest() != file.sha256:
                part.unlink()
                raise ConnectionError(f"{file.name}: the sha256 of the bytes received is not "
                                      "the hub's; downloading it again")
            if not part.exists():
                part.touch()  # an empty file
            if file.sha256 is None and file.blob_id and _git_blob_id(part) != file.blob_id:
                part.unlink()
                raise ConnectionError(f"{file.name}: the git blob id of the bytes received is "
                                      "not the hub's; downloading it again")
            fsync_file(part)  # its bytes on the disk before a proof names them
            record_proof(dest, file.name, proof)  # first: a kill between the two loses nothing
            os.replace(part, final)  # not atomic_write: a partial file is resumed (Range)
            fsync_dir(dest)
            return
        except Aborted:
            raise
        except Exception as error:  # noqa: BLE001 - sorted by the retrier
            # progress is what the partial file keeps, not what arrived (module docstring)
            retrier.failed(error, what, seconds=time.monotonic() - started,
                           progressed=_size(part) > have)


def resolve_url(repo: str, revision: str, name: str) -> str:
    """The hub's URL of file `name` of model `repo` at `revision` (a commit, branch or tag),
    quoted as ``huggingface_hub.hf_hub_url`` quotes it."""
    from urllib.parse import quote

    from huggingface_hub import constants

    return f"{constants.ENDPOINT}/{repo}/resolve/{quote(revision, safe='')}/{quote(name)}"


def get_text(url: str, retrier: Retrier, what: str) -> str:
    """The text of a small hub file (an index), through the retrier, bounded like a download."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    def get() -> str:
        response = get_session().get(url, headers=build_hf_headers(), timeout=timeout(),
                                     follow_redirects=True)
        hf_raise_for_status(response)
        return response.text

    return retrier.call(get, what)
