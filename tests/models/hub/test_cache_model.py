"""A model-based test of a Hugging Face cache shared by a group (issue 38, hole 1): random
sequences of events, from a fixed seed, against the real `hub_cache.add_to_cache` and
huggingface_hub's own ``scan_cache_dir``.

Rules (each example draws 12): repgeom adds a revision's files (a branch or tag naming one of
three commits) under umask 002 or 022; a colleague's ref (another user's, 0644) takes a branch;
the next write is killed at its rename (kill -9: no clean-up runs).

Invariants, after every rule: huggingface_hub's scan lists only the revision's real files and
refs, with no warning (no temporary file in ``snapshots/`` or ``refs/``); every file and ref
repgeom wrote has the mode the umask of its write gave, a ref rewritten too, a colleague's
included, as huggingface_hub 2.4 replaces a ref (issue 48); a ref that already named the commit
is not rewritten.
"""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path

import huggingface_hub.constants
import pytest

from repgeom.models.hub import cache as hub_cache

SEED = 38
EXAMPLES = 200
RULES = 12
REPO = "org/tok"
COMMITS = ["a" * 40, "b" * 40, "c" * 40]
FILES = {"tokenizer.json": b"{}", "config.json": b'{"model_type": "gpt2"}'}
OTHER_USER = 65534
_REPLACE, _UNLINK = os.replace, Path.unlink
RULE_NAMES = ["add", "add", "add", "kill"] + (["colleague"] if os.geteuid() == 0 else [])
"""A colleague's file (another user's) needs root to make; elsewhere that rule is left out."""


class Killed(BaseException):
    """kill -9 at a rename."""


class Violation(AssertionError):
    pass


def _play(root: Path, fetched: Path, seed: int, patch: pytest.MonkeyPatch) -> str | None:
    rng = random.Random(seed)
    cache = root / f"hub{seed}"
    patch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    storage = cache / "models--org--tok"
    modes: dict[Path, int] = {}  # file -> the mode its write must have given
    theirs: dict[Path, str] = {}  # a colleague's ref -> its commit
    kill = {"next": False}
    real_replace, real_unlink = _REPLACE, _UNLINK

    def replace(source, target):
        if kill["next"]:
            kill["next"] = False
            kill["dead"] = True
            raise Killed
        return real_replace(source, target)

    def unlink(self, missing_ok=False):
        if kill.get("dead"):
            return None  # a killed process cleans nothing up
        return real_unlink(self, missing_ok=missing_ok)

    patch.setattr(os, "replace", replace)
    patch.setattr(Path, "unlink", unlink)
    old_mask = os.umask(0o022)
    try:
        for _ in range(RULES):
            rule = rng.choice(RULE_NAMES)
            if rule == "kill":
                kill["next"] = True
                continue
            if rule == "colleague":
                ref = storage / "refs" / rng.choice(["main", "v1"])
                ref.parent.mkdir(parents=True, exist_ok=True)
                ref.write_text(rng.choice(COMMITS))
                (storage / "snapshots" / ref.read_text()).mkdir(parents=True, exist_ok=True)
                os.chown(ref, OTHER_USER, OTHER_USER)
                ref.chmod(0o644)
                theirs[ref] = ref.read_text()
                modes.pop(ref, None)
                continue
            mask, branch, commit = rng.choice([0o002, 0o022]), rng.choice(["main", "v1"]), \
                rng.choice(COMMITS)
            os.umask(mask)
            ref = storage / "refs" / branch
            before = ref.stat() if ref.exists() else None
            text = ref.read_text() if before is not None else None
            unchanged = text == commit
            existing = {n for n in FILES if (storage / "snapshots" / commit / n).exists()}
            try:
                hub_cache.add_to_cache(REPO, branch, commit, fetched, list(FILES))
            except Killed:
                kill.pop("dead")
            else:
                if ref.read_text() != commit:
                    return f"{ref} names {ref.read_text()}, not {commit}"
                if ref in theirs and theirs[ref] != commit:
                    theirs.pop(ref)  # replaced, as huggingface_hub replaces it: ours now
                if unchanged and (ref.stat().st_ino, ref.stat().st_mtime_ns) != (
                        before.st_ino, before.st_mtime_ns):
                    return f"{ref} already named {commit} and was rewritten"
            for name in FILES:
                path = storage / "snapshots" / commit / name
                if name not in existing and path.exists():
                    modes[path] = 0o666 & ~mask
            if ref not in theirs and ref.exists() and ref.read_text() != text:  # written now
                modes[ref] = 0o666 & ~mask  # new or replaced whole: the umask's mode
            for path, mode in modes.items():
                if stat.S_IMODE(path.stat().st_mode) != mode:
                    return f"{path} has mode {stat.S_IMODE(path.stat().st_mode):o}, not {mode:o}"
            from huggingface_hub import scan_cache_dir

            scanned = scan_cache_dir(str(cache))
            names = {f.file_name for r in scanned.repos for v in r.revisions for f in v.files}
            if not names <= set(FILES) or scanned.warnings:
                return (f"huggingface_hub's scan lists {sorted(names - set(FILES))} "
                        f"{scanned.warnings}")
    finally:
        os.umask(old_mask)
    return None


def test_a_shared_cache_keeps_its_invariants_under_random_events(tmp_path) -> None:
    fetched = tmp_path / "fetched"
    fetched.mkdir()
    for name, data in FILES.items():
        (fetched / name).write_bytes(data)
    with pytest.MonkeyPatch.context() as patch:
        for example in range(EXAMPLES):
            violation = _play(tmp_path, fetched, SEED * 100_000 + example, patch)
            assert violation is None, f"example {example}: {violation}"
