"""A benchmark's work folder, made and marked by the benchmark (`claim`), so that whatever a
rerun deletes inside it is the benchmark's own, never a folder the user named for their files."""

from __future__ import annotations

from pathlib import Path

MARKER = ".repgeom-benchmark"


def claim(folder: Path, benchmark: str) -> Path:
    """`folder`, resolved, created if needed and marked as `benchmark`'s. A folder that already
    holds files but no marker is the user's: refused, naming the fix, and nothing in it touched."""
    folder = Path(folder).expanduser().resolve()
    marker = folder / MARKER
    if folder.is_dir() and not marker.is_file() and any(folder.iterdir()):
        raise SystemExit(
            f"{benchmark}: {folder} already holds files that this benchmark did not make; give a "
            "new or empty folder (the benchmark deletes and rewrites its runs inside it)")
    folder.mkdir(parents=True, exist_ok=True)
    marker.write_text(benchmark + "\n")
    return folder
