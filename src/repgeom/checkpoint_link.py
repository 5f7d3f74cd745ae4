"""Lightning's `ModelCheckpoint` whose ``save_last: link`` replaces last.ckpt atomically.

With ``monitor: val/bpc`` and ``save_top_k: 1`` (conf/callbacks/default.yaml), Lightning writes
last.ckpt only at a validation that also writes best.ckpt, or at the end of a run that wrote
none: with ``save_last: true`` it is a second copy of best.ckpt's state (~460 MB for gpt_small,
issue 41). ``save_last: link`` makes last.ckpt a symbolic link to the checkpoint just written,
the same state without the second write. Lightning makes that link by deleting last.ckpt and
then linking: a kill between the two leaves a run with no last.ckpt, and the same command would
start it over. Here the link is made under a temporary name and renamed over last.ckpt (an
atomic replace on POSIX), so last.ckpt always names a whole checkpoint.
"""

from __future__ import annotations

import os

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint as _LightningModelCheckpoint


class ModelCheckpoint(_LightningModelCheckpoint):
    """`lightning.pytorch.callbacks.ModelCheckpoint`, its last.ckpt link replaced atomically."""

    @staticmethod
    def _link_checkpoint(trainer: L.Trainer, filepath: str, linkpath: str) -> None:
        if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
            if os.path.isdir(linkpath) and not os.path.islink(linkpath):
                raise IsADirectoryError(
                    f"{linkpath} is a folder, not a checkpoint: move it away, and "
                    "ModelCheckpoint will link the last checkpoint there")
            target = os.path.relpath(filepath, os.path.dirname(linkpath))
            temporary = f"{linkpath}.{os.getpid()}.link"
            if os.path.lexists(temporary):  # a link of ours left by a kill
                os.remove(temporary)
            os.symlink(target, temporary)
            os.replace(temporary, linkpath)
        trainer.strategy.barrier()
