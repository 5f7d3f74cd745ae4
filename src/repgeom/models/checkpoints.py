"""Our training checkpoints: reading and checking them, finding a run's, the run's config and
data they carry, loading the model, and the device to load it on; all without Lightning (a
checkpoint is a dict: ``hyper_parameters`` rebuild the `GPT`, ``state_dict`` holds its weights
under ``model.``).

The training probe's options saved in a checkpoint are read by `repgeom.probes.core.spec`.
"""

from __future__ import annotations

import logging
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from repgeom.console import first_line
from repgeom.data.tokens import TokenCache, ValidationWindows
from repgeom.data.vocab import Vocab
from repgeom.models.gpt import GPT, GPTConfig

log = logging.getLogger(__name__)


class CheckpointFormatError(ValueError):
    """A file that is not a repgeom training checkpoint (another format or no repgeom hparams)."""


def read_checkpoint(path: str | os.PathLike) -> dict:
    """The contents of a repgeom training checkpoint, checked; tensors memory-mapped.

    Raises
    ------
    FileNotFoundError
        No such file.
    CheckpointFormatError
        A file torch cannot read, a plain state dict, or a Lightning checkpoint without the
        hyperparameters `CharLM` saves (``model``, ``vocab``).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"ckpt={str(path)!r}: no such file ({path.resolve()}); give a .ckpt written by "
            "train.py, e.g. outputs/<date>/<time>/checkpoints/last.ckpt"
        )
    try:
        # weights_only: a checkpoint of ours holds tensors and plain data only, so nothing in
        # the file is executed (https://pytorch.org/docs/stable/generated/torch.load.html).
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # noqa: BLE001 - any unreadable file gets the same message
        raise CheckpointFormatError(
            f"ckpt={str(path)!r} is not a repgeom checkpoint: torch.load cannot read it "
            f"({type(error).__name__}: {first_line(error, 200)}). Give a .ckpt written "
            "by train.py; for a Hugging Face model folder use hf= instead"
        ) from None
    hparams = ckpt.get("hyper_parameters") if isinstance(ckpt, dict) else None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        what = "a plain state dict" if isinstance(ckpt, dict) else f"a {type(ckpt).__name__}"
        raise CheckpointFormatError(
            f"ckpt={str(path)!r} is {what}, not a Lightning checkpoint written by train.py (no "
            "'state_dict' and 'hyper_parameters'); repgeom rebuilds the model from the config "
            "saved in its own checkpoints, so it cannot probe bare weights. For a Hugging Face "
            "model use hf=<folder or hub name>"
        )
    if not isinstance(hparams, dict) or not {"model", "vocab", "masking"} <= set(hparams):
        found = sorted(hparams) if isinstance(hparams, dict) else "none"
        raise CheckpointFormatError(
            f"ckpt={str(path)!r} is a Lightning checkpoint but not one of repgeom's CharLM: its "
            f"hyper_parameters lack model/masking/vocab (found: {found}). Probe checkpoints "
            "written by train.py, or export the model with save_pretrained and use hf="
        )
    return ckpt


def checkpoint_problem(path: str | os.PathLike, *, check_crc: bool = True) -> str | None:
    """Why `path` is not a whole ``torch.save`` file, or None: read without unpickling anything.

    ``torch.save`` writes a zip archive whose central directory is its last bytes, so a file cut
    short (a kill mid-copy) has none and fails at once; with `check_crc` every member is read and
    its CRC-32 compared with the one in the directory (`zipfile.ZipFile.testzip`), which catches a
    file of the right length with wrong bytes, at the cost of one read of the file.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            if not any(name.rpartition("/")[2] == "data.pkl" for name in archive.namelist()):
                return "a zip archive without data.pkl, not a torch.save file"
            bad = archive.testzip() if check_crc else None
    except (OSError, zipfile.BadZipFile, EOFError) as error:
        return f"not a whole torch.save file ({type(error).__name__}: {first_line(error, 120)})"
    return f"its member {bad} fails its CRC-32 check" if bad else None


def saved_step(path: str | os.PathLike) -> int | None:
    """The ``global_step`` a Lightning checkpoint holds, or None where it does not load (the
    tensors are memory-mapped, not read)."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return int(ckpt["global_step"])
    except Exception:  # noqa: BLE001 - any file that does not load holds no step
        return None


def find_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """(global_step, path) of every checkpoint of a run, one per step, in step order.

    Looks at ``<run>/checkpoints/*.ckpt`` (``last``, ``best``, ``step*``, ...) and the
    ``hpc_ckpt_*.ckpt`` files Lightning's SLURM requeue writes into the run folder. Files at the
    same step hold the same weights; one a live run does not replace is kept (``step*``,
    ``hpc_ckpt_*``: last.ckpt and best.ckpt hold another step after the next validation, and a
    probe of a running run loads the files after listing them), then the first by name. A file
    cut short (an hpc_ckpt copied by Lightning before repgeom's atomic writes, and killed), or
    one that does not read as a checkpoint, is skipped with a warning.

    Raises
    ------
    FileNotFoundError
        The folder does not exist or holds no checkpoint.
    """
    run_dir = Path(run_dir).expanduser()
    if not run_dir.is_dir():
        raise FileNotFoundError(
            f"run={str(run_dir)!r}: no such folder ({run_dir.resolve()}); give a run folder of "
            "train.py, e.g. outputs/2026-11-21/12-00-00"
        )
    paths = sorted({*run_dir.glob("checkpoints/*.ckpt"), *run_dir.glob("hpc_ckpt_*.ckpt")})
    if not paths:
        raise FileNotFoundError(
            f"run={str(run_dir)!r} holds no checkpoint (looked for {run_dir}/checkpoints/*.ckpt "
            f"and {run_dir}/hpc_ckpt_*.ckpt); is it a train.py run folder?"
        )
    by_step: dict[int, Path] = {}
    for path in sorted(paths, key=lambda p: (_replaced_by_a_live_run(p), str(p))):
        problem = checkpoint_problem(path, check_crc=False)
        if problem is not None:
            log.warning("Skipping %s: %s", path, problem)
            continue
        try:
            step = int(read_checkpoint(path)["global_step"])
        except CheckpointFormatError as error:  # whole as a zip, wrong inside (bytes flipped)
            log.warning("Skipping %s: %s", path, error)
            continue
        by_step.setdefault(step, path)
    return sorted(by_step.items())


_REPLACED_STEMS = ("last", "best")
"""conf/callbacks/default.yaml's last.ckpt and best.ckpt (``-vN`` with Lightning's counter): a
running run writes another step there."""


def _replaced_by_a_live_run(path: Path) -> bool:
    return path.stem.split("-v")[0] in _REPLACED_STEMS


def run_dir_of(ckpt_path: Path) -> Path:
    """``<run>/checkpoints/x.ckpt`` -> ``<run>``; ``<run>/hpc_ckpt_1.ckpt`` -> ``<run>``."""
    parent = ckpt_path.resolve().parent
    return parent.parent if parent.name == "checkpoints" else parent


def run_config(run_dir: Path) -> dict | None:
    """The training config of a run folder: Hydra's copy, else the CSV logger's resolved one."""
    csv_copies = sorted(  # the CSV logger keeps one folder per start; the newest first
        run_dir.glob("csv/version_*/hparams.yaml"),
        key=lambda p: -int(p.parent.name.removeprefix("version_")),
    )
    for path in (run_dir / ".hydra" / "config.yaml", *csv_copies, run_dir / "csv" / "hparams.yaml"):
        if path.is_file():
            conf = OmegaConf.load(path)
            out = {}
            for key in ("data", "probe", "seed", "model"):
                if key in conf:
                    try:  # data/probe interpolate ${seed} and ${model.block_size} only
                        value = conf[key]
                        out[key] = (
                            OmegaConf.to_container(value, resolve=True)
                            if OmegaConf.is_config(value)
                            else value
                        )
                    except Exception:  # noqa: BLE001 - an unresolvable key is as good as absent
                        continue
            return out
    return None


def validation_windows_for(ckpt: dict, run_dir: Path, block_size: int) -> ValidationWindows:
    """The validation windows of the checkpoint's data: source/clean from the checkpoint, path,
    cache and verify from the run config where there is one (the token cache is built if
    missing)."""
    state = ckpt.get("Enwik8DataModule") or {}
    data = (run_config(run_dir) or {}).get("data") or {}
    cache = TokenCache(
        source=state.get("source", data.get("source", "sample")),
        path=data.get("path"),
        cache_dir=data.get("cache_dir"),
        clean=state.get("clean", data.get("clean", False)),
        verify=data.get("verify", True),
    )
    return ValidationWindows.of_cache(cache, block_size)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``"auto"`` (or null): CUDA when available, else CPU."""
    if isinstance(device, torch.device):
        return device
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


@dataclass
class CheckpointModel:
    """Our `GPT` and its vocabulary, as a checkpoint rebuilds them."""

    model: GPT
    vocab: Vocab


def load_gpt(path: str | os.PathLike, device: torch.device | str = "cpu") -> CheckpointModel:
    """The `GPT` of checkpoint `path` (weights only, on `device`, eval mode) and its vocabulary,
    rebuilt from the checkpoint's ``hyper_parameters`` as `CharLM` would, without Lightning."""
    return gpt_from_checkpoint(read_checkpoint(path), device)


def gpt_from_checkpoint(ckpt: dict, device: torch.device | str = "cpu") -> CheckpointModel:
    """`load_gpt` on the contents `read_checkpoint` returned (the file is read once)."""
    hparams = ckpt["hyper_parameters"]
    config = {k: v for k, v in dict(hparams["model"]).items() if k != "_target_"}
    model = GPT(GPTConfig(**config))
    weights = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()
               if k.startswith("model.")}
    model.load_state_dict(weights)
    return CheckpointModel(model.to(device).eval(), Vocab.from_dict(hparams["vocab"]))
