"""Checkpoints whole or absent, and last.ckpt as the newest state, on Lightning's public API.

`AtomicCheckpointIO`, the Trainer's ``CheckpointIO`` plugin (`repgeom.train`): every file
Lightning writes (best.ckpt and the other `ModelCheckpoint` files, last.ckpt, the trajectory's
step*.ckpt, the SLURM signal's hpc_ckpt_<n>.ckpt) goes through ``Trainer.save_checkpoint`` to
the plugin, which writes it beside its final name, fsyncs it and renames it over the name.
Lightning's own ``TorchCheckpointIO`` writes a temporary file in TMPDIR and moves it; where
TMPDIR is another filesystem (node-local /tmp under a network run folder) the move is a copy
into the final name, and a kill mid-copy left a truncated hpc_ckpt that the next start resumed
from (issue 47), and a kill before the move a checkpoint-sized tmpXXXX in TMPDIR that nothing
removes. Here the write is `repgeom.files.atomic_write`'s (a temporary file beside the name,
fsynced, renamed over it), nothing goes to TMPDIR, and what a kill leaves
(``.<name>.<hex>.tmp``) is removed by the next start once five minutes old (`remove_leftovers`).

`LastCheckpoint`, beside Lightning's `ModelCheckpoint` for best.ckpt (conf/callbacks/
default.yaml): last.ckpt is the state of the newest validation and of the end of training.
Lightning's ``save_last`` writes it only at a validation that also wrote best.ckpt, so it held
the best state, not the last, and a resume went back there. Where the validation just wrote a
whole checkpoint under a fixed name (best.ckpt), last.ckpt is a link to it (issue 41: no second
~460 MB write for gpt_small), replaced at once; otherwise a whole file. docs/configuration.md
gives what each choice writes per validation.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import socket
import stat
import time
import uuid
from pathlib import Path
from typing import Any

import lightning as L
import torch
from fsspec.utils import get_protocol
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.trainer.states import TrainerFn

from repgeom.files import (
    atomic_write,
    atomic_write_text,
    fenced,
    read_json_why,
    stale_temporaries,
)
from repgeom.models.checkpoints import saved_step

log = logging.getLogger(__name__)

_LEFTOVER = re.compile(
    r"\.(?P<name>.+\.ckpt)\.[0-9a-f]{8}\.tmp|(?:last|best)\.ckpt\.partial"
    r"|(?P<link>last\.ckpt\.\d+\.link)")
"""What a kill may leave of ours, exactly: `repgeom.files.atomic_write`'s temporary file of a
``*.ckpt`` (``.<name>.<8 hex>.tmp``, confirmed by `repgeom.files.stale_temporaries`; a link
where `link_or_copy` was killed), and repgeom's before issue 47 (``last.ckpt.partial``,
``best.ckpt.partial``, and the link ``last.ckpt.<pid>.link``). Any other name is the user's."""

LEFTOVER_AGE_S = 300.0
"""How long a leftover stays unchanged before a start removes it: a live writer (another start
of the run still writing, on another node over NFS) changes its temporary file at every write
and renames it within seconds of its last one, so a file unchanged for five minutes is no
live write's; a leftover younger than that stays until a later start."""


def local_folder(folder: str | os.PathLike) -> str:
    """`folder` as Lightning's `ModelCheckpoint` holds its dirpath (``~`` expanded, links
    resolved), so the paths of both compare equal in a run folder reached through a link.

    Raises
    ------
    ValueError
        A remote folder (``s3://``, ...): last.ckpt's link and the start token are local files.
    """
    if get_protocol(str(folder)) not in ("file", "local"):
        raise ValueError(
            f"{folder} is a remote folder; repgeom's last.ckpt and start fence "
            "(LastCheckpoint, StartFence) need a local one (a network file system mounted "
            "here is local): give a local dirpath")
    return os.path.realpath(os.path.expanduser(str(folder).removeprefix("file://")))


class SupersededStartError(RuntimeError):
    """A newer start of this run has begun: this one writes no more checkpoints."""


class StartFence:
    """The newest training start of a run: each start that trains writes its own token to
    ``<checkpoints>/.repgeom-start`` (`claim`, at `LastCheckpoint.on_train_start`); before each
    checkpoint replaces its name, the writer checks that the token is still its own (`check`),
    so a superseded start (alive on a hung node while SLURM's requeue trains on) never
    overwrites the newer start's last.ckpt, best.ckpt, step or hpc files, and stops with
    `SupersededStartError`. A check and its rename are not one atomic step: a start superseded
    in between writes that one file.

    Newest is by SLURM's restart count within one SLURM job (``SLURM_JOB_ID``,
    ``SLURM_RESTART_COUNT``), else by when the start began (`started`: by default when the
    fence is made, at `LastCheckpoint.setup` of fitting, not when the process began: a notebook
    or a multirun outlives a start it ran before): a start that claims over a newer one's
    token (it hung before its start of training, and wakes after the requeued start claimed)
    is itself superseded. A missing token lets a write through (no
    start has claimed: nothing newer exists); one that cannot be read or is not a token stops
    it, since it may be a newer start's.
    """

    NAME = ".repgeom-start"

    def __init__(self, folder: str | os.PathLike, started: float | None = None) -> None:
        self.path = os.path.join(local_folder(folder), self.NAME)
        self.token = uuid.uuid4().hex
        self.started = time.time() if started is None else started
        job, restart = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_RESTART_COUNT")
        self.slurm = [job, int(restart) if job and restart and restart.isdigit() else None]

    def claim(self) -> None:
        """Write this start's token, unless a newer start's is there."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        held, _ = read_json_why(self.path)
        if held is not None and self._is_newer(held):
            raise SupersededStartError(
                f"a newer training start of this run has begun ({self.path}: started "
                f"{held.get('started')}, SLURM job and restart {held.get('slurm')}; this one "
                f"started {self.started}, {self.slurm}): this start writes no checkpoints and "
                "stops; the newer one trains on. If no other start of the run is alive (a "
                "node's clock ahead), remove that file and run the same command again")
        atomic_write_text(self.path, json.dumps({
            "start": self.token, "pid": os.getpid(), "host": socket.gethostname(),
            "time": time.time(), "started": self.started, "slurm": self.slurm}))

    def _is_newer(self, held: dict) -> bool:
        """Whether the token `held` is a newer start's than this one."""
        slurm, started = held.get("slurm"), held.get("started")
        if (isinstance(slurm, list) and len(slurm) == 2 and slurm[0] == self.slurm[0]
                and slurm[0] is not None and isinstance(slurm[1], int)
                and self.slurm[1] is not None and slurm[1] != self.slurm[1]):
            return slurm[1] > self.slurm[1]
        return isinstance(started, int | float) and started > self.started

    def check(self) -> None:
        held, why = read_json_why(self.path)
        if held is None and why is None:
            return  # missing: no start has claimed the run
        newest = held.get("start") if held is not None else None
        if newest == self.token:
            return
        raise SupersededStartError(
            f"a newer training start of this run has begun ({self.path} names start {newest}, "
            f"this is {self.token}): this start writes no more checkpoints and stops; the newer "
            "one trains on" if why is None and isinstance(newest, str) else
            f"the run's start token {self.path} cannot be read as one "
            f"({why or f'its start is {newest!r}'}): it may be a newer start's, so this start "
            "writes no more checkpoints and stops; if no other start of the run is alive, "
            "remove the file and run the same command again")


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` writing local files beside their name, then renaming,
    unless `fence` (set by `LastCheckpoint`) says a newer start has begun.

    A remote path (``s3://``, ...) or ``storage_options`` go to Lightning's own save.
    """

    def __init__(self) -> None:
        super().__init__()
        self.fence: StartFence | None = None

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any = None) -> None:
        if storage_options is not None or get_protocol(str(path)) not in ("file", "local"):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = os.path.abspath(str(path).removeprefix("file://"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _refuse_folder(path)
        with fenced(self.fence.check) if self.fence else contextlib.nullcontext():
            atomic_write(path, lambda partial: torch.save(checkpoint, partial))

    def remove_checkpoint(self, path: Any) -> None:
        """Lightning's (a top-k file dropped), unless a newer start has begun."""
        if self.fence is not None:
            self.fence.check()
        super().remove_checkpoint(path)


def link_or_copy(target: str, path: str, fence: StartFence | None = None) -> None:
    """`path` replaced at once by a relative link to `target` (a copy where links are refused),
    unless `fence` says a newer start has begun."""

    def write(partial: Path) -> None:
        partial.unlink()  # atomic_write's empty file, where the link goes
        try:
            os.symlink(os.path.relpath(target, os.path.dirname(path)), partial)
        except OSError:  # a filesystem without links: a copy, as Lightning falls back to
            shutil.copyfile(target, partial)

    _refuse_folder(path)
    with fenced(fence.check) if fence else contextlib.nullcontext():
        atomic_write(path, write)


def _refuse_folder(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        raise IsADirectoryError(
            f"{path} is a folder, not a checkpoint: move it away, and the checkpoint will be "
            "written there")


def remove_leftovers(*folders: str | os.PathLike,
                     min_age_s: float = LEFTOVER_AGE_S) -> list[str]:
    """Remove what a killed write of ours left in `folders` (exact names only: `_LEFTOVER`;
    a file or link, a ``.link`` only a link) unchanged for `min_age_s` seconds; return their
    paths."""
    removed, now = [], time.time()
    for folder in dict.fromkeys(os.path.abspath(f) for f in folders if f):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            path, match = os.path.join(folder, name), _LEFTOVER.fullmatch(name)
            if not match:
                continue
            try:
                mode, mtime = (info := os.lstat(path)).st_mode, info.st_mtime
            except OSError:
                continue  # renamed or removed meanwhile
            if not (stat.S_ISLNK(mode) or (stat.S_ISREG(mode) and not match["link"])):
                continue
            if match["name"] is not None:
                target = os.path.join(folder, match["name"])
                if Path(path) not in stale_temporaries(target, min_age_s=min_age_s):
                    continue
            elif now - mtime < min_age_s:
                continue
            os.remove(path)
            removed.append(path)
    if removed:
        log.info("Removed what a killed checkpoint write left: %s", ", ".join(removed))
    return removed


class LastCheckpoint(Checkpoint):
    """``<dirpath>/last.ckpt``: the state of the newest validation and of the end of training.

    At each validation (after Lightning's `ModelCheckpoint`s, which Lightning runs last of all
    callbacks, in their given order) and at the end of training, unless last.ckpt holds this
    step already (a rerun of a finished run writes nothing): a link to the complete checkpoint
    another `ModelCheckpoint` wrote at this step under a fixed name (``link: true``; a name it
    never deletes, so the link never dangles), else a whole checkpoint. At the start of
    fitting, removes what a killed write left (`remove_leftovers`) in `dirpath`, the other
    checkpoint folders and the run folder (hpc_ckpt_<n>.ckpt); at the start of training, fences
    the older starts (`StartFence`) off every checkpoint the Trainer's `AtomicCheckpointIO`
    writes.
    """

    NAME = "last.ckpt"

    def __init__(self, dirpath: str | os.PathLike, link: bool = True) -> None:
        self.dirpath, self.link = local_folder(dirpath), link
        self._step_on_disk: int | None = None  # the step last.ckpt holds, where this process knows
        self._fence: StartFence | None = None

    @property
    def path(self) -> str:
        return os.path.join(self.dirpath, self.NAME)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.is_global_zero and stage == "fit":
            self._fence = StartFence(self.dirpath)  # claimed at the start of training
            others = [getattr(cb, "dirpath", None) for cb in trainer.checkpoint_callbacks]
            remove_leftovers(self.dirpath, trainer.default_root_dir, *others)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Claim the run as its newest start (`StartFence`: a superseded start writes no more
        checkpoints; a rerun of a finished run, which trains nothing, never gets here)."""
        why = None
        if trainer.is_global_zero:
            self._fence = self._fence or StartFence(self.dirpath)
            try:
                self._fence.claim()
            except SupersededStartError as error:
                why = str(error)
            if isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO):
                trainer.strategy.checkpoint_io.fence = self._fence
        self._raise_everywhere(trainer, why)
        resumed = trainer.ckpt_path
        same = resumed is not None and os.path.join(
            local_folder(os.path.dirname(resumed)), os.path.basename(resumed)) == self.path
        self._step_on_disk = trainer.global_step if same else None

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Before the validation's checkpoints (`ModelCheckpoint` saves at the validation's end),
        every rank stops if this start is superseded (`_fenced_off`)."""
        if not trainer.sanity_checking and trainer.state.fn == TrainerFn.FITTING:
            self._fenced_off(trainer)

    def _fenced_off(self, trainer: L.Trainer) -> None:
        """Raise `SupersededStartError` on every rank where rank 0's fence says a newer start has
        begun: decided on rank 0 (which alone writes) and broadcast, so no rank is left waiting
        at a barrier for a rank 0 that stopped. The saves between validations (step*.ckpt, the
        SLURM signal's hpc_ckpt) are checked on rank 0 alone (`AtomicCheckpointIO`)."""
        why = None
        if trainer.is_global_zero and self._fence is not None:
            try:
                self._fence.check()
            except SupersededStartError as error:
                why = str(error)
        self._raise_everywhere(trainer, why)

    @staticmethod
    def _raise_everywhere(trainer: L.Trainer, why: str | None) -> None:
        why = trainer.strategy.broadcast(why, src=0)
        if why:
            raise SupersededStartError(why)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._bring_up_to_date(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Training stopped between validations (max_time, max_steps off the validation
        interval, early stopping): the same command then finds the run done."""
        self._bring_up_to_date(trainer)

    def _bring_up_to_date(self, trainer: L.Trainer) -> None:
        step = trainer.global_step
        if (trainer.fast_dev_run or trainer.state.fn != TrainerFn.FITTING or step == 0
                or self._step_on_disk == step):
            return
        self._fenced_off(trainer)
        target = self._written_now(trainer) if self.link and trainer.is_global_zero else None
        target = trainer.strategy.broadcast(target, src=0)  # every rank takes one branch
        if target:
            if trainer.is_global_zero:
                link_or_copy(target, self.path, self._fence)
            trainer.strategy.barrier()
        else:
            trainer.save_checkpoint(self.path)  # every rank; the plugin writes on rank 0
        self._step_on_disk = step

    def _written_now(self, trainer: L.Trainer) -> str | None:
        """A complete checkpoint of this step in this folder, under a name its `ModelCheckpoint`
        replaces rather than deletes (``save_top_k: 1``, a filename without metrics)."""
        for callback in trainer.checkpoint_callbacks:
            if (callback is self or not isinstance(callback, ModelCheckpoint)
                    or callback.save_weights_only or callback.save_top_k != 1
                    or "{" in (callback.filename or "{")):
                continue
            path = callback.best_model_path
            if (path and os.path.realpath(os.path.dirname(path)) == self.dirpath
                    and saved_step(path) == trainer.global_step):
                return path
        return None
