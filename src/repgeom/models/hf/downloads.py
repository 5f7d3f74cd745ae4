"""One hub revision's files on disk for as long as it is probed: bounded disk over a trajectory.

Probing all 154 revisions of Pythia-160m through the user's Hugging Face cache would keep ~50 GB
there (~430 GB for Pythia-1.4B). `fetch_revision` puts a revision's files in a working folder
that repgeom owns (``<output_dir>/work/<revision>``) with ``huggingface_hub.snapshot_download``,
and `release` deletes them once the revision is probed. A revision already in the user's cache
is read from there and never deleted. Only the files a model needs are fetched: configs,
tokenizer files and one weights format (safetensors where the revision has them, else the
PyTorch ``.bin``).

A download that breaks is retried (`RETRIES` times, waiting 1, 2, 4 ... s), then fails naming
the revision, with no partial file left behind; a disk that cannot hold the revision fails
before the download, naming the folder, the space needed and the space free.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

RETRIES = 3
"""Downloads of one revision tried before it fails."""
WEIGHTS = ("*.safetensors", "*.bin")
"""Weights formats in order of preference; one is fetched."""
OTHER_FILES = ("*.json", "*.txt", "*.model", "*.py", "*.tiktoken")
"""Configs and tokenizer files (merges.txt, vocab.json, spiece.model, ...)."""


class DownloadError(RuntimeError):
    """A revision could not be downloaded after `RETRIES` tries."""


class RevisionUnavailable(DownloadError):
    """This revision cannot be probed (no weights file, or not on the hub), the others can:
    the trajectory skips it (`repgeom.probes.trajectory`)."""


@dataclass(frozen=True)
class RevisionFiles:
    """Where one revision's files are and whether repgeom may delete them.

    path : a folder ``from_pretrained`` reads; owned : True in repgeom's working folder (deleted
    by `release` unless kept), False in the user's cache or a local folder; bytes : downloaded
    bytes (0 when nothing was downloaded); seconds : the time the files took to arrive.
    """

    path: Path
    owned: bool
    bytes: int = 0
    seconds: float = 0.0
    weights: dict[str, str] = field(default_factory=dict)
    """Weights file name -> sha256: the hub's LFS sha256, or of the file's bytes."""


def _cached(repo: str, revision: str | None) -> Path | None:
    """The revision's snapshot in the user's Hugging Face cache, if it is complete there."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(repo, revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        return None
    complete = (path / "config.json").is_file() and any(
        any(path.glob(w)) for w in WEIGHTS)  # not just the config a look at the model fetched
    return path if complete else None


def _wanted(repo: str, revision: str | None) -> tuple[list[str], int]:
    """The ``allow_patterns`` for one revision and the bytes they add up to (from the hub's
    file list)."""
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo, revision=revision, files_metadata=True)
    files = {s.rfilename: int(s.size or 0) for s in info.siblings or []}
    weights = next((w for w in WEIGHTS if any(Path(f).match(w) for f in files)), None)
    patterns = [*OTHER_FILES, *([weights] if weights else [])]
    size = sum(n for f, n in files.items() if any(Path(f).match(p) for p in patterns))
    return patterns, size


def _check_space(folder: Path, needed: int, revision: str | None) -> None:
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise OSError(
            errno.ENOSPC,
            f"revision {revision}: {needed / 1e9:.2f} GB needed in {folder}, {free / 1e9:.2f} GB "
            "free; free some space, or set work_dir= to a larger disk",
        )


def fetch_revision(repo: str, revision: str | None, work_dir: str | os.PathLike, *,
                   retries: int = RETRIES, wait: float = 1.0) -> RevisionFiles:
    """The files of hub model `repo` at `revision`: the user's cache where they are complete,
    else downloaded into ``work_dir/<revision>`` (see the module docstring)."""
    if Path(repo).expanduser().is_dir():  # a local folder: nothing to fetch
        return RevisionFiles(Path(repo).expanduser(), owned=False)
    cached = _cached(repo, revision)
    if cached is not None:
        return RevisionFiles(cached, owned=False)
    from huggingface_hub import snapshot_download

    started = time.perf_counter()
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    dest = work_dir / str(revision or "main").replace("/", "--")
    patterns, size = _wanted(repo, revision)
    _check_space(work_dir, size, revision)
    error: Exception | None = None
    for attempt in range(retries):
        try:
            snapshot_download(repo, revision=revision, local_dir=dest, allow_patterns=patterns)
            return RevisionFiles(dest, owned=True, bytes=size,
                                 seconds=time.perf_counter() - started)
        except OSError as exc:
            shutil.rmtree(dest, ignore_errors=True)
            if exc.errno == errno.ENOSPC:
                raise OSError(errno.ENOSPC, f"revision {revision}: the disk of {work_dir} is "
                              f"full ({size / 1e9:.2f} GB needed); free some space or set "
                              "work_dir= to a larger disk") from exc
            error = exc
        except Exception as exc:  # noqa: BLE001 - HTTP and connection errors of every kind
            shutil.rmtree(dest, ignore_errors=True)
            error = exc
        if attempt + 1 < retries:
            time.sleep(wait * 2**attempt)
    raise DownloadError(
        f"revision {revision} of {repo} could not be downloaded after {retries} tries "
        f"({type(error).__name__}: {str(error).splitlines()[0][:200] if error else ''}); "
        "nothing of it was kept. Rerun the same command: the revisions already probed are kept"
    ) from error


def release(files: RevisionFiles, *, keep: bool = False) -> None:
    """Delete the files of a probed revision if repgeom downloaded them (never the user's
    cache or a local folder), unless `keep`."""
    if files.owned and not keep:
        shutil.rmtree(files.path, ignore_errors=True)
