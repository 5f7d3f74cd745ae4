"""enwik8: where the bytes come from, how they are checked, and how they are split.

Two sources share one code path:

- ``"enwik8"``: the Hutter Prize file (the first 10^8 bytes of the English Wikipedia dump of
  2006-03-03), downloaded from `ENWIK8_URL` into the cache folder or read from a local copy
  (zip or raw) given as ``path``.
- ``"sample"``: the first 4,154,063 bytes of the same file, committed gzipped as
  ``repgeom/data/sample/enwik8-head-4154063.gz`` (package data; provenance in the README
  beside it). Offline quickstart and tests; results on it are not comparable with published
  enwik8 numbers.

Every file is checked against its published sha256 and size before use. A mismatch raises
`DataError` naming the file, what was expected, what was found and what to do. Users who knowingly
train on another file pass ``verify=False`` (``data.verify=false``): the checks then only log a
warning, and the token cache is keyed by the sha256 actually found, so the two never mix.

The split is the standard one (first 90M bytes train, next 5M validation, last 5M test); the
sample is split in the same 90/5/5 proportions (`split_sizes`).
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import urllib.error
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repgeom.files import atomic_write

log = logging.getLogger(__name__)

ENWIK8_URL = "http://mattmahoney.net/dc/enwik8.zip"
ENWIK8_ZIP_SHA256 = "547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc"
ENWIK8_ZIP_SIZE = 36_445_475
ENWIK8_SHA256 = "2b49720ec4d78c3c9fabaee6e4179a5e997302b3a70029f30f2d582218c024a8"
ENWIK8_SIZE = 100_000_000
ENWIK8_MEMBER = "enwik8"  # the one file inside enwik8.zip

# The sample ships inside the package (package data), so it is found in any kind of install.
SAMPLE_PATH = Path(__file__).resolve().parent / "sample" / "enwik8-head-4154063.gz"
# src/repgeom/data/enwik8.py -> parents[3]: the project root when the package runs from a source
# checkout (an editable install); in an installed wheel it is no project at all.
PROJECT_ROOT = Path(__file__).resolve().parents[3]
SAMPLE_GZ_SHA256 = "6b6a77a2e4defd4b3dff78818157f36d30fb47139dce61fdd81d4f30086f84ed"
SAMPLE_GZ_SIZE = 1_513_319
SAMPLE_SHA256 = "7956f43d6c58c53672b92f03188d071bdef32b4bfaf0d3f2c10470fc81a06903"
SAMPLE_SIZE = 4_154_063

SOURCES = ("enwik8", "sample")
_CHUNK = 1 << 20


class DataError(RuntimeError):
    """A data file is missing, corrupt, truncated, or not the one expected.

    The message names the file, says what was expected and what was found, and how to proceed.
    """


@dataclass(frozen=True)
class SourceSpec:
    """What a source's raw bytes must be: their sha256 and size (None = unchecked)."""

    name: str
    sha256: str | None
    size: int | None


SPECS = {
    "enwik8": SourceSpec("enwik8", ENWIK8_SHA256, ENWIK8_SIZE),
    "sample": SourceSpec("sample", SAMPLE_SHA256, SAMPLE_SIZE),
}


def default_cache_dir() -> Path:
    """Where downloads and token caches go unless ``data.cache_dir`` says otherwise.

    ``$REPGEOM_DATA`` if set; else ``<project root>/data/cache`` (git-ignored) when the package
    runs from a source checkout; else, for an installed wheel (whose folder may not even be
    writable), the user cache ``$XDG_CACHE_HOME/repgeom`` (``~/.cache/repgeom``).
    """
    env = os.environ.get("REPGEOM_DATA")
    if env:
        return Path(env).expanduser()
    if (PROJECT_ROOT / "pyproject.toml").is_file() and (PROJECT_ROOT / "src" / "repgeom").is_dir():
        return PROJECT_ROOT / "data" / "cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "repgeom"


def split_sizes(n: int) -> tuple[int, int, int]:
    """Train/validation/test lengths in bytes: 90/5/5 % of ``n``, the test split takes the rest.

    On full enwik8 (``n = 10**8``) this is exactly the standard 90M/5M/5M split.

    >>> split_sizes(100_000_000)
    (90000000, 5000000, 5000000)
    >>> split_sizes(4_154_063)
    (3738656, 207703, 207704)
    """
    if n < 20:
        raise ValueError(f"n={n} is too short to split 90/5/5")
    n_train = n * 90 // 100
    n_val = n * 5 // 100
    return n_train, n_val, n - n_train - n_val


def split(data: bytes) -> tuple[bytes, bytes, bytes]:
    """Split raw bytes into (train, valid, test) by `split_sizes`."""
    n_train, n_val, _ = split_sizes(len(data))
    return data[:n_train], data[n_train : n_train + n_val], data[n_train + n_val :]


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def check_bytes(
    data: bytes,
    *,
    name: str,
    sha256: str | None,
    size: int | None,
    verify: bool = True,
    hint: str = "",
) -> str:
    """Check ``data`` against the expected size and sha256; return the sha256 found.

    Raises `DataError` (or only logs a warning with ``verify=False``) on a mismatch. ``name``
    is the file the bytes came from; ``hint`` is added to the error (what to do about it).
    """
    found = hashlib.sha256(data).hexdigest()
    problems = []
    if size is not None and len(data) != size:
        problems.append(f"size: expected {size:,} bytes, found {len(data):,}")
    if sha256 is not None and found != sha256:
        problems.append(f"sha256: expected {sha256}, found {found}")
    if problems:
        msg = f"{name} is not the expected file ({'; '.join(problems)})."
        if verify:
            raise DataError(
                f"{msg} {hint}If you knowingly use a different file, pass data.verify=false "
                "(results are then not comparable with enwik8)."
            )
        log.warning("%s Using it anyway because verify=False.", msg)
    return found


def download(
    url: str,
    dest: str | os.PathLike,
    *,
    sha256: str | None,
    size: int | None = None,
    timeout: float = 60.0,
) -> Path:
    """Download ``url`` to ``dest`` atomically and check its sha256 (and size, if given).

    The body is streamed to a temporary file in ``dest``'s folder, hashed on the way, and moved
    into place only once it is complete and verified (`repgeom.files.atomic_write`). On any
    failure (HTTP or network error, a body shorter than its Content-Length, a checksum mismatch,
    Ctrl-C) the temporary file is removed and no file is left at ``dest``.

    Raises
    ------
    DataError
        With the url, the destination, and what went wrong.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    found: dict[str, Any] = {}

    def fetch(tmp: Path) -> None:  # raises, and nothing is renamed, unless whole and verified
        h = hashlib.sha256()
        received = 0
        log.info("downloading %s to %s", url, dest)
        try:
            with open(tmp, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
                length = resp.headers.get("Content-Length")
                expected_len = int(length) if length is not None else None
                while chunk := resp.read(_CHUNK):
                    out.write(chunk)
                    h.update(chunk)
                    received += len(chunk)
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise DataError(
                f"downloading {url} to {dest} failed: {e}. Nothing was kept; check the network "
                "(or download the file yourself and pass data.path=...) and run again."
            ) from e
        # http.client does not raise when the connection closes before Content-Length bytes.
        if expected_len is not None and received != expected_len:
            raise DataError(
                f"downloading {url} to {dest}: the connection closed after {received:,} of "
                f"{expected_len:,} bytes (truncated). Nothing was kept; run again."
            )
        problems = []
        if size is not None and received != size:
            problems.append(f"size: expected {size:,} bytes, found {received:,}")
        if sha256 is not None and h.hexdigest() != sha256:
            problems.append(f"sha256: expected {sha256}, found {h.hexdigest()}")
        if problems:
            raise DataError(
                f"downloaded {url} does not match ({'; '.join(problems)}); nothing was kept at "
                f"{dest}. The server may have sent another file or a corrupt one: run again, or "
                "download it yourself and pass data.path=... (with data.verify=false if it "
                "knowingly differs)."
            )
        found.update(received=received, sha256=h.hexdigest())

    # Not resumed: a body cut short is fetched again whole, so its temporary file goes with it.
    atomic_write(dest, fetch)
    log.info("downloaded %s (%s bytes, sha256 %s)", dest, f"{found['received']:,}",
             found["sha256"])
    return dest


def check_path(path: str | os.PathLike) -> Path:
    """``data.path`` as a Path, refused with `DataError` unless it is an existing file.

    The datamodule checks it when it is built, so a missing file is refused on every run, also
    when a token cache for the expected checksum exists (which skips reading the file).
    """
    resolved = Path(path).expanduser()
    if not resolved.exists():
        raise DataError(f"data file {resolved} does not exist (data.path={str(path)!r}).")
    if not resolved.is_file():
        raise DataError(
            f"data.path={str(path)!r} is a folder, not a file: point it at the enwik8 zip, the "
            "raw file, or a copy of the sample's .gz."
        )
    return resolved


# Every published form of a source's file as (size, sha256): the container as distributed and the
# raw bytes. A data.path that is one of these holds exactly the expected bytes.
PUBLISHED_FILES = {
    "enwik8": {(ENWIK8_ZIP_SIZE, ENWIK8_ZIP_SHA256), (ENWIK8_SIZE, ENWIK8_SHA256)},
    "sample": {(SAMPLE_GZ_SIZE, SAMPLE_GZ_SHA256), (SAMPLE_SIZE, SAMPLE_SHA256)},
}


def is_published_file(path: str | os.PathLike, source: str) -> bool:
    """Whether ``path`` is, byte for byte, a published form of ``source`` (zip, gzip or raw).

    Its size first (free), then its sha256 (about 0.1 s per 100 MB): no decompression. The
    datamodule asks this before it trusts a token cache for a given ``data.path``; a file that
    is not one of these is read and checked in full (`read_local`), so an empty, corrupt or
    truncated file is refused with the same `DataError` whatever the cache holds.
    """
    published = PUBLISHED_FILES[source]
    size = Path(path).stat().st_size
    if not any(size == known for known, _ in published):
        return False
    return (size, sha256_file(path)) in published


def read_local(
    path: str | os.PathLike, *, spec: SourceSpec, verify: bool = True
) -> tuple[bytes, str]:
    """Read a local copy given as zip, gzip or raw bytes; return (bytes, sha256 found).

    A zip must hold one file (or a member named ``enwik8``). The bytes are checked against
    ``spec`` (see `check_bytes`). A truncated or corrupt archive raises `DataError`.
    """
    path = check_path(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if spec.name == "enwik8":
        redo = f"Delete {path} and download it again (or point data.path at a good copy). "
    elif path.resolve() == SAMPLE_PATH:
        redo = f"Restore {path} from git (git checkout -- {path}) or reinstall repgeom. "
    else:  # a copy the user named
        redo = "Point data.path at a good copy of the sample, or unset it for the bundled one. "
    try:
        if magic.startswith(b"PK"):
            with zipfile.ZipFile(path) as zf:
                names = zf.namelist()
                member = ENWIK8_MEMBER if ENWIK8_MEMBER in names else None
                if member is None and len(names) == 1:
                    member = names[0]
                if member is None:
                    raise DataError(
                        f"zip file {path} holds {names}, expected one file (or one named "
                        f"{ENWIK8_MEMBER!r}). Pass the raw file as data.path instead."
                    )
                data = zf.read(member)
        elif magic.startswith(b"\x1f\x8b"):
            with gzip.open(path, "rb") as g:
                data = g.read()
        else:
            data = path.read_bytes()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise DataError(
            f"{path} is a truncated or corrupt archive ({type(e).__name__}: {e}). {redo}"
        ) from e
    found = check_bytes(
        data, name=str(path), sha256=spec.sha256, size=spec.size, verify=verify, hint=redo
    )
    return data, found


def load_raw(
    source: str,
    *,
    path: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    verify: bool = True,
    url: str = ENWIK8_URL,
    zip_sha256: str | None = ENWIK8_ZIP_SHA256,
    zip_size: int | None = ENWIK8_ZIP_SIZE,
    spec: SourceSpec | None = None,
) -> tuple[bytes, str]:
    """The verified raw bytes of ``source`` and their sha256.

    ``"sample"`` reads the bundled gzip (or ``path``). ``"enwik8"`` reads ``path`` if given,
    else ``<cache_dir>/enwik8.zip``, downloading it first from ``url`` if it is not there. The
    url and checksums are parameters so tests can serve a small file from 127.0.0.1.
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    spec = spec or SPECS[source]
    if path is None and source == "sample":
        path = SAMPLE_PATH
    if path is None:
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        path = cache / "enwik8.zip"
        if not path.exists():
            download(
                url,
                path,
                sha256=zip_sha256 if verify else None,
                size=zip_size if verify else None,
            )
    return read_local(path, spec=spec, verify=verify)
