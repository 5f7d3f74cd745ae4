"""What each way of keeping last.ckpt writes per validation (issue 47, docs/configuration.md).

Trains a small model (Lightning's BoringModel) with a validation every 2 steps whose val/bpc
improves at some validations and not at others, and counts, per validation, the whole
checkpoints written (through the Trainer's checkpoint plugin, so every write is seen) and the
links made, for:

- ``ours``: best.ckpt (`ModelCheckpoint`, top 1) +
  `repgeom.callbacks.checkpoint_policy.LastCheckpoint`
  with ``link: true`` (conf/callbacks/default.yaml);
- ``ours, link: false``: the same, last.ckpt always a whole file;
- ``second ModelCheckpoint``: best.ckpt + a plain `ModelCheckpoint(monitor=None,
  filename="last", save_top_k=1, enable_version_counter=False)`;
- ``save_last: true`` / ``save_last: link``: Lightning's own option on the best.ckpt callback.

It also says whether last.ckpt holds the newest state after each validation and at the end of
training (max_steps between validations). Bytes per validation = whole writes x the size of one
checkpoint (~460 MB for gpt_small with its AdamW moments, issue 41).

    python benchmarks/bench_last_checkpoint.py

Then the cost of the resume's check (`repgeom.models.checkpoints.checkpoint_problem`) and of
`saved_step` (what `LastCheckpoint` reads to decide on a link) on a 461 MB checkpoint, the size
of gpt_small's with its AdamW moments, in the page cache as right after training wrote it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from repgeom.callbacks.checkpoint_policy import AtomicCheckpointIO, LastCheckpoint

SCORES = (3.0, 2.0, 2.5, 1.0, 1.5, 1.2)
"""val/bpc at the validations of steps 2, 4, ..., 12: improves at 2, 4 and 8 only."""
MAX_STEPS = 13  # training ends one step after the last validation


class _Scored(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.validations = 0

    def on_validation_epoch_end(self) -> None:
        self.log("val/bpc", SCORES[min(self.validations, len(SCORES) - 1)])
        self.validations += 1


class _CountingIO(AtomicCheckpointIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[int, str, int]] = []
        self.step = 0

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        super().save_checkpoint(checkpoint, path, storage_options)
        self.writes.append((checkpoint["global_step"], os.path.basename(path),
                            os.path.getsize(path)))


class _Newest(L.Callback):
    """Whether last.ckpt holds the trainer's step, after every callback's validation end."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.stale = folder, []

    def _check(self, trainer, when: str) -> None:
        last = self.folder / "last.ckpt"
        step = torch.load(last, weights_only=False)["global_step"] if last.exists() else None
        if step != trainer.global_step:
            self.stale.append(f"{when} {trainer.global_step}: last.ckpt at {step}")

    def on_train_batch_start(self, trainer, *args) -> None:
        if trainer.global_step and trainer.global_step % 2 == 0:  # after a validation
            self._check(trainer, "validation at step")

    def on_fit_end(self, trainer, *args) -> None:
        self._check(trainer, "end of training at step")


def _best(folder: Path, **options) -> ModelCheckpoint:
    return ModelCheckpoint(dirpath=folder, filename="best", monitor="val/bpc", mode="min",
                           save_top_k=1, enable_version_counter=False, **options)


CHOICES = {
    "ours (link: true)": lambda f: [_best(f), LastCheckpoint(f, link=True)],
    "ours (link: false)": lambda f: [_best(f), LastCheckpoint(f, link=False)],
    "second ModelCheckpoint": lambda f: [
        _best(f), ModelCheckpoint(dirpath=f, filename="last", monitor=None, save_top_k=1,
                                  enable_version_counter=False)],
    "save_last: true": lambda f: [_best(f, save_last=True)],
    "save_last: link": lambda f: [_best(f, save_last="link")],
}


def measure(name: str, folder: Path) -> None:
    links, symlink = [], os.symlink
    os.symlink = lambda target, path, **kw: (links.append(path), symlink(target, path, **kw))
    io, newest = _CountingIO(), _Newest(folder)
    try:
        trainer = L.Trainer(max_steps=MAX_STEPS, val_check_interval=2, limit_val_batches=1,
                            num_sanity_val_steps=0, callbacks=[*CHOICES[name](folder), newest],
                            logger=False, enable_progress_bar=False,
                            enable_model_summary=False, accelerator="cpu", plugins=[io],
                            default_root_dir=folder)
        L.seed_everything(0, verbose=False)
        trainer.fit(_Scored())
    finally:
        os.symlink = symlink
    validations = len(SCORES)
    at_validations = [w for w in io.writes if w[0] % 2 == 0]
    size = max(w[2] for w in io.writes)
    print(f"{name:24s} whole writes per validation {len(at_validations) / validations:.2f} "
          f"({len(at_validations)} in {validations}: "
          f"{', '.join(f'{n}@{s}' for s, n, _ in at_validations)}), "
          f"at the end {len(io.writes) - len(at_validations)}, links {len(links)}; "
          f"bytes per validation {len(at_validations) / validations:.2f} x {size} B; "
          f"last.ckpt stale: {'; '.join(newest.stale) or 'never'}")


def check_cost() -> None:
    import time

    from repgeom.models.checkpoints import checkpoint_problem, saved_step

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "last.ckpt"
        torch.save({"global_step": 5, "state_dict": {
            f"w{i}": torch.randn(1024, 1024) for i in range(110)}}, path)
        for what, call in (("zip directory only", lambda: checkpoint_problem(path,
                                                                              check_crc=False)),
                           ("with every CRC-32", lambda: checkpoint_problem(path)),
                           ("saved_step", lambda: saved_step(path))):
            start = time.perf_counter()
            out = call()
            print(f"{path.stat().st_size / 1e6:.0f} MB, {what}: {out!r} in "
                  f"{time.perf_counter() - start:.3f} s")


def main() -> None:
    import logging
    import warnings

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    print(f"val/bpc {SCORES} at steps 2..12, max_steps {MAX_STEPS}; lightning {L.__version__}")
    for name in CHOICES:
        with tempfile.TemporaryDirectory() as folder:
            measure(name, Path(folder))
    check_cost()


if __name__ == "__main__":
    main()
