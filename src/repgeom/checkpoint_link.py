"""Lightning's `ModelCheckpoint` whose last.ckpt is the last state, linked or written atomically.

With ``monitor: val/bpc`` and ``save_top_k: 1`` (conf/callbacks/default.yaml), Lightning 2.6
writes last.ckpt only at a validation that also writes best.ckpt (``save_last: true``: a copy;
``save_last: link``: a link to it), so last.ckpt holds the *best* state, not the last: a run
whose later validations did not improve ends with last.ckpt at its best step, a resume after a
requeue went back there, and ``ckpt=<run>/checkpoints/last.ckpt`` probed an older model. Here
last.ckpt is the state of the newest validation (or epoch end), and of the end of training:

- at a validation that wrote best.ckpt, a symbolic link to it (``save_last: link``): the same
  state without a second write (~460 MB for gpt_small, issue 41);
- otherwise a whole checkpoint, written to ``last.ckpt.partial`` and renamed over last.ckpt.
  Writing to last.ckpt itself would go through the link and overwrite best.ckpt.

Lightning replaces a link by deleting last.ckpt and then linking: a kill between the two
leaves a run with no last.ckpt, and the same command would start it over. Here links and files
are made under a temporary name and renamed over last.ckpt (an atomic replace on POSIX), and
best.ckpt, which last.ckpt may link to, is written the same way (Lightning's own write copies
into the file in place where the temporary folder is on another filesystem), so last.ckpt always
names a whole checkpoint. What a kill leaves (``*.ckpt.partial``, ``*.ckpt.<pid>.link``) is
removed when the next run starts. last.ckpt keeps its name when the run folder has moved
(Lightning's version counter would write last-v1.ckpt, which no resume reads), and is a copy
where the filesystem has no symbolic links.
"""

from __future__ import annotations

import os
import shutil
from weakref import proxy

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint as _LightningModelCheckpoint

PARTIAL_SUFFIX = ".partial"
"""last.ckpt and best.ckpt are written to ``<name>.partial`` first (not ``*.ckpt``: no reader
takes it), then renamed over the file."""


class ModelCheckpoint(_LightningModelCheckpoint):
    """`lightning.pytorch.callbacks.ModelCheckpoint` whose last.ckpt is the newest state."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._last_written_step: int | None = None  # the step this process put in last.ckpt

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        due = self._saves_now(trainer) and not self._should_save_on_train_epoch_end(trainer)
        super().on_validation_end(trainer, pl_module)
        if due:
            self._bring_last_up_to_date(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        due = self._saves_now(trainer) and self._should_save_on_train_epoch_end(trainer)
        super().on_train_epoch_end(trainer, pl_module)
        if due:
            self._bring_last_up_to_date(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Training stopped between validations (trainer.max_time, max_steps off the validation
        interval, early stopping): last.ckpt gets the final state, so that the same command
        finds the run done instead of training the last steps again."""
        super().on_train_end(trainer, pl_module)
        if not trainer.fast_dev_run and not trainer.sanity_checking:
            self._bring_last_up_to_date(trainer)

    def _saves_now(self, trainer: L.Trainer) -> bool:
        # read before Lightning's hook, whose top-k save marks this step as saved
        return not self._should_skip_saving_checkpoint(trainer)

    def _bring_last_up_to_date(self, trainer: L.Trainer) -> None:
        if self.save_last and self._last_written_step != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict) -> None:
        """Lightning's, but the link goes only to a checkpoint written at this step."""
        if not self.save_last:
            return
        # always last.ckpt, what a resume reads: no last-v1.ckpt beside it (Lightning's counter
        # wrote one whenever the checkpoint's folder was not this one, e.g. a moved run folder)
        filepath = self.format_checkpoint_name(monitor_candidates, self.CHECKPOINT_NAME_LAST)
        # set the last model path before saving because it will be part of the state
        previous, self.last_model_path = self.last_model_path, filepath
        written_now = (
            self._last_global_step_saved == trainer.global_step
            and self._last_checkpoint_saved
            and os.path.abspath(self._last_checkpoint_saved) != os.path.abspath(filepath)
        )
        if self.save_last == "link" and written_now and self.save_top_k != 0:
            self._link_checkpoint(trainer, self._last_checkpoint_saved, filepath)
        else:
            self._save_checkpoint(trainer, filepath)
        self._last_written_step = trainer.global_step
        if previous and self._should_remove_checkpoint(trainer, previous, filepath):
            self._remove_checkpoint(trainer, previous)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if trainer.is_global_zero and stage == "fit" and self.dirpath and os.path.isdir(
                self.dirpath):
            _remove_leftovers(self.dirpath)

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        """Lightning's, written beside `filepath` and renamed over it: best.ckpt too, which
        last.ckpt may link to. Lightning's own save is a rename only where the temporary folder
        is on the checkpoints' filesystem; elsewhere it copies into the file in place, and a kill
        mid-copy left best.ckpt, and last.ckpt through the link, unreadable."""
        _refuse_folder(filepath)
        partial = filepath + PARTIAL_SUFFIX
        trainer.save_checkpoint(partial, self.save_weights_only)  # every rank; rank 0 writes
        if trainer.is_global_zero:
            os.replace(partial, filepath)
        trainer.strategy.barrier()
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))

    @staticmethod
    def _link_checkpoint(trainer: L.Trainer, filepath: str, linkpath: str) -> None:
        if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
            _replace_with_link(filepath, linkpath)
        trainer.strategy.barrier()

    def _remove_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        """Lightning's, but never the file last.ckpt links to: with ``save_top_k`` > 1 the top-k
        file dropped at a validation can be the one the previous validation linked last.ckpt
        to, and Lightning removes it before it links last.ckpt to this step's file. A kill in
        between left last.ckpt dangling: no resume found it, and the run started over. Here
        last.ckpt goes to this step's file (what it links to next anyway) first."""
        last = self.last_model_path
        if (trainer.is_global_zero and self.save_last == "link" and last
                and os.path.islink(last)
                and os.path.realpath(last) == os.path.realpath(filepath)
                and self._last_global_step_saved == trainer.global_step
                and self._last_checkpoint_saved
                and os.path.realpath(self._last_checkpoint_saved) not in (
                    os.path.realpath(filepath), os.path.abspath(last))
                and os.path.isfile(self._last_checkpoint_saved)):
            _replace_with_link(self._last_checkpoint_saved, last)
        super()._remove_checkpoint(trainer, filepath)


def _replace_with_link(filepath: str, linkpath: str) -> None:
    """`linkpath` replaced at once by a link to `filepath` (a copy where links are refused)."""
    _refuse_folder(linkpath)
    target = os.path.relpath(filepath, os.path.dirname(linkpath))
    temporary = f"{linkpath}.{os.getpid()}.link"
    if os.path.lexists(temporary):  # a link of ours left by a kill
        os.remove(temporary)
    try:
        os.symlink(target, temporary)
    except OSError:  # a filesystem without links: a copy, as Lightning falls back to
        shutil.copyfile(filepath, temporary)
    os.replace(temporary, linkpath)


def _remove_leftovers(folder: str) -> None:
    """What a kill left: ``*.ckpt.partial`` (a whole checkpoint's size) and ``*.ckpt.<pid>.link``
    (another process's; each process replaces only its own)."""
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        stem, _, pid = name.removesuffix(".link").rpartition(".")
        ours = name.endswith(".ckpt" + PARTIAL_SUFFIX) or (
            name.endswith(".link") and stem.endswith(".ckpt") and pid.isdigit())
        if ours and (os.path.islink(path) or os.path.isfile(path)):
            os.remove(path)


def _refuse_folder(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        raise IsADirectoryError(
            f"{path} is a folder, not a checkpoint: move it away, and ModelCheckpoint will "
            "write the checkpoint there")
