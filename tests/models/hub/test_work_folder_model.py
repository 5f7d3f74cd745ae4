"""A model-based test of repgeom's work folders (`repgeom.models.hub.download_folders`, issue
48): random histories, from a fixed seed, of three processes of one run that claim, release,
clean up and are killed, against the real `claim`, `release` and `clear_leftovers`.

Rules (each example draws `RULES`): a process claims a revision (a branch naming one of two
commits, sometimes ``keep_weights``) and its files arrive; a process releases what it holds
(sometimes kept); a process clears leftovers (sometimes keeping a revision); a process is
killed (kill -9: its lock goes, nothing is cleaned up), at rest or at a random deletion of a
release or a clean-up. Inside any call, at a random check of a folder (``is_dir``, ``exists``,
a listing: ``os.scandir``, ``os.listdir``), another process's release or clean-up may run to
its end first: the races that raised FileExistsError from ``mkdir``, FileNotFoundError from
``lock.touch()`` and from the clean-up's ``glob`` on 4b64431 (each seen failing there).

Invariants, after every rule: no call raises but with a `DownloadError`, and "in use" only while
another live process holds the folder or another process's clean-up ran meanwhile; a held
folder keeps its marker, its commit and its files; no file but a lock lies in a folder without
its marker (no run would ever delete it); a revision whose marker keeps its weights keeps its
folder; a user's file in ``work_dir`` is left alone; after a release or a clean-up that nothing
interrupted, no folder that is not held, kept or spared remains.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path

import pytest

from repgeom.models.hub import download_folders as folders
from repgeom.models.hub.calls import DownloadError

SEED = 48
EXAMPLES = 80
RULES = 20
REPO = "org/steps"
BRANCHES = ["main", "v1"]
COMMITS = ["a" * 40, "b" * 40]
PROCESSES = 3
INTERRUPT = 0.08
"""The chance that one folder check of a call lets another process's event run first."""


class Killed(BaseException):
    """kill -9 at a deletion."""


class World:
    """The processes and what each holds, with the hooks that interleave them."""

    def __init__(self, root: Path, rng: random.Random, patch: pytest.MonkeyPatch) -> None:
        self.rng, self.work, self.owner = rng, root / "work", root / "run"
        self.seen: Counter = Counter()  # how often each kind of event happened
        self.user_file = self.work / "notes.txt"
        self.user_file.parent.mkdir(parents=True)
        self.user_file.write_text("mine")
        self.held: dict[int, tuple[folders.RevisionFiles, str]] = {}  # process -> files, commit
        self.current = -1  # the process whose event runs
        self.busy = False  # inside an interrupting event: no nesting
        self.interrupted = False
        self.kill_at: int | None = None  # kill the caller at its n-th deletion
        for name in ("is_dir", "exists"):
            patch.setattr(Path, name, self._hooked(getattr(Path, name)))
        for name in ("scandir", "listdir"):  # the listings of ``glob``, ``iterdir``, ``rmtree``
            patch.setattr(os, name, self._hooked(getattr(os, name)))
        for name in ("unlink", "rmdir"):
            real = getattr(Path, name)
            patch.setattr(Path, name, self._killing(real))

    def _hooked(self, real):
        def call(path, *args, **kwargs):
            if not self.busy and self.rng.random() < INTERRUPT:
                self.busy = True
                try:
                    self.other_event()
                finally:
                    self.busy = False
                self.interrupted = True
                self.seen["interrupted"] += 1
            return real(path, *args, **kwargs)
        return call

    def _killing(self, real):
        def call(path, *args, **kwargs):
            if self.kill_at is not None and not self.busy:
                self.kill_at -= 1
                if self.kill_at < 0:
                    self.kill_at = None
                    raise Killed
            return real(path, *args, **kwargs)
        return call

    def other_event(self) -> None:
        """Another process's release or clean-up, run to its end."""
        holders = [process for process in self.held if process != self.current]
        if holders and self.rng.random() < 0.5:
            process = self.rng.choice(holders)
            files, _ = self.held.pop(process)
            folders.release(files)
        else:
            folders.clear_leftovers(self.work, self.owner)

    def folder(self, branch: str) -> Path:
        return folders.download_dir(self.work, self.owner, REPO, branch)

    def claim(self, process: int, branch: str, commit: str, keep: bool) -> str | None:
        if process in self.held:
            return None
        dest = self.folder(branch)
        others = any(files.path == dest for files, _ in self.held.values())
        record = {"repo": REPO, "revision": branch, "commit": commit,
                  "run": folders.run_key(self.owner), "keep_weights": keep}
        try:
            lock = folders.claim(dest, record, lambda _line: None)
        except DownloadError as error:
            if "in use" in str(error) and (others or self.interrupted):
                self.seen["in use"] += 1
                return None
            if "deleted by other processes" in str(error) and self.interrupted:
                return None
            return f"claim of {branch} refused: {error}"
        if any(files.path == dest for files, _ in self.held.values()):  # after interruptions
            return f"{dest} was claimed while another process held it"
        (dest / "model.safetensors").write_text(commit)
        (dest / f"shard.bin{folders.PARTIAL}").write_text("part")
        folders.record_proof(dest, "model.safetensors", commit)
        self.held[process] = (folders.RevisionFiles(dest, owned=True, lock=lock), commit)
        return None

    def check(self, gone: set[Path]) -> str | None:
        """The invariants; `gone`: the folders the last event, run to its end with nothing
        interleaved, had to delete unless held or kept."""
        if self.user_file.read_text() != "mine":
            return "a user's file was changed"
        for process, (files, commit) in self.held.items():
            record = folders.read_json(files.path / folders.MARKER)
            if record is None or record.get("commit") != commit:
                return f"process {process}'s {files.path} lost its marker ({record})"
            if (files.path / "model.safetensors").read_text() != commit:
                return f"process {process}'s {files.path} lost its files"
        held = {files.path for files, _ in self.held.values()}
        for branch in BRANCHES:
            dest = self.folder(branch)
            if not dest.exists():
                continue
            names = {p.name for p in dest.iterdir()}
            record = folders.read_json(dest / folders.MARKER)
            if names - {folders.LOCK} and record is None:
                return f"{dest} holds {sorted(names)} without its marker"
            if dest in gone and dest not in held and names - {folders.LOCK} and not (
                    record and record.get("keep_weights")):
                return f"{dest} ({sorted(names)}) outlived a release or clean-up"
        return None


def _play(root: Path, seed: int, patch: pytest.MonkeyPatch, seen: Counter) -> str | None:
    rng = random.Random(seed)
    world = World(root / f"h{seed}", rng, patch)
    world.seen = seen
    kept: set[Path] = set()  # folders whose marker asked to keep the weights
    for step in range(RULES):
        rule = rng.choice(["claim", "claim", "release", "clear", "kill"])
        process = rng.randrange(PROCESSES)
        world.interrupted, killed, gone = False, False, set()
        world.current = process
        if rng.random() < 0.15 and rule in ("release", "clear"):
            world.kill_at = rng.randrange(4)
        try:
            if rule == "claim" and process not in world.held:
                branch = rng.choice(BRANCHES)
                keep = rng.random() < 0.1
                violation = world.claim(process, branch, rng.choice(COMMITS), keep)
                if violation:
                    return f"step {step}: {violation}"
                if keep and process in world.held:
                    kept.add(world.folder(branch))
            elif rule == "release" and process in world.held:
                files, _ = world.held[process]
                keep = rng.random() < 0.1
                folders.release(files, keep=keep)
                del world.held[process]
                gone = set() if keep or world.interrupted else {files.path}
            elif rule == "clear":
                spared = [(REPO, rng.choice(BRANCHES))] if rng.random() < 0.2 else []
                folders.clear_leftovers(world.work, world.owner, keep=spared)
                gone = set() if world.interrupted or spared else set(map(world.folder, BRANCHES))
            elif rule == "kill" and process in world.held:
                files, _ = world.held.pop(process)
                files.lock.close()  # kill -9: the kernel drops the lock, nothing else
        except Killed:
            killed = True
            seen["killed mid-deletion"] += 1
            if process in world.held:
                world.held.pop(process)[0].lock.close()
        except Exception as error:  # noqa: BLE001 - any escaping error is the finding
            return f"step {step}: {rule} raised {type(error).__name__}: {error}"
        world.kill_at = None
        for folder in list(kept):
            record = folders.read_json(folder / folders.MARKER)
            if record is None:
                return f"step {step}: {folder}, kept, lost its marker"
        world.busy = True  # the checks below are the test's, not a process's
        violation = world.check(set() if killed else gone)
        world.busy = False
        if violation:
            return f"step {step} ({rule}): {violation}"
    for files, _ in world.held.values():
        files.lock.close()
    return None


def test_work_folders_keep_their_invariants_under_random_histories(tmp_path) -> None:
    seen: Counter = Counter()
    for example in range(EXAMPLES):
        with pytest.MonkeyPatch.context() as patch:  # one world's hooks at a time
            violation = _play(tmp_path, SEED * 100_000 + example, patch, seen)
        assert violation is None, f"example {example}: {violation}"
    # the histories reached the races and the refusals they are drawn for
    assert min(seen["interrupted"], seen["killed mid-deletion"], seen["in use"]) >= 10, seen
