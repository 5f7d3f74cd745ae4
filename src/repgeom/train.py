"""`train(cfg)`: build data, model, loggers and callbacks from a Hydra config and fit."""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import lightning as L
import pandas as pd
import torch
from hydra.utils import instantiate
from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

import repgeom.probes.core.spec  # noqa: F401 - registers probe/base in Hydra's ConfigStore
from repgeom.callbacks.checkpoint_policy import AtomicCheckpointIO
from repgeom.console import quiet_console
from repgeom.loggers import (  # noqa: F401 - public names of train.py's engine
    build_loggers,
    run_folder,
    sweep_group,
    wandb_logged_in,
)
from repgeom.models.checkpoints import checkpoint_problem
from repgeom.models.lightning_module import CharLM
from repgeom.models.recipe import set_tf32_matmul, switch_on, vocab_multiple
from repgeom.options import check_options
from repgeom.probes.run.offload.snapshots import check_offload

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a finished `train` made, for tests and for code that chains runs."""

    trainer: L.Trainer
    module: CharLM
    datamodule: L.LightningDataModule
    output_dir: Path
    wandb_dir: Path | None


def resolve_precision(precision: str) -> str:
    """Map "auto" to bf16 mixed precision on a GPU that supports it, full precision otherwise."""
    if precision != "auto":
        return precision
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16-mixed"
    return "32-true"


def resume_checkpoint(output_dir: Path) -> Path | None:
    """The newest whole checkpoint of a run folder: `checkpoints/last.ckpt` or `hpc_ckpt_<n>.ckpt`.

    Lightning's SLURMEnvironment writes `hpc_ckpt_<n>.ckpt` into the run folder when SLURM's
    warning signal arrives, then requeues the job; the requeued job resumes from whichever of
    the two is newer (by modification time, as Lightning's `ckpt_path="last"` decides) and
    whole: a file that fails `checkpoint_problem` (cut short by a kill mid-copy, before
    repgeom's atomic writes; a CRC-32 mismatch; a link to a file that is gone) is skipped, with
    a warning saying why. None where the folder holds none of them (a new run).

    Raises
    ------
    ResumeRefusedError
        Every one of them is damaged: a start from step 0 would overwrite the run's best and
        step checkpoints, so the error names each file and why, and the way out.
    """
    candidates = [output_dir / "checkpoints" / "last.ckpt", *output_dir.glob("hpc_ckpt_*.ckpt")]
    existing = [path for path in candidates if os.path.lexists(path)]  # a dangling link too
    rejected = []
    for path in sorted(existing, key=lambda path: path.lstat().st_mtime, reverse=True):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        log.warning("Not resuming from %s: %s; trying the next newest checkpoint", path, problem)
        rejected.append(f"{path}: {problem}")
    if rejected:
        raise ResumeRefusedError(
            f"{output_dir} holds checkpoints to resume from, but none is whole: "
            + "; ".join(rejected) + ". Starting again from step 0 would overwrite the run's "
            "other checkpoints, so nothing was trained: move these files out of the run folder "
            "to start afresh, or resume from another whole checkpoint with "
            "ckpt_path=<path> (e.g. checkpoints/best.ckpt or a step*.ckpt)")
    return None


class ResumeRefusedError(RuntimeError):
    """A run folder's resume checkpoints are all damaged (`resume_checkpoint`)."""


_PROBE_OPTIONS_DIR = Path(__file__).resolve().parents[2] / "conf" / "probe"


def trainer_plugins(conf: object) -> list:
    """`trainer.plugins` (one plugin's config, a list of them, or none) built, with repgeom's
    `AtomicCheckpointIO` added: every checkpoint (best, last, step*, the SLURM signal's
    hpc_ckpt) is written atomically.

    Raises
    ------
    ValueError
        A plugin is a name (``"bf16-mixed"``: Lightning 2 takes plugin objects only; a
        precision goes in ``trainer.precision``), or a ``CheckpointIO`` of its own (a Trainer
        takes one, and repgeom's is needed for whole checkpoints and the start fence).
    """
    if conf is None:
        return [AtomicCheckpointIO()]
    built = conf if isinstance(conf, str) else instantiate(conf)
    given = list(built) if isinstance(built, list | tuple | ListConfig) else [built]
    for plugin in given:
        if isinstance(plugin, str):
            raise ValueError(
                f"trainer.plugins has the name {plugin!r}, and Lightning takes plugin objects "
                "only: give a plugin's config ({_target_: ...}), or for a precision set "
                f"trainer.precision={plugin}")
        if isinstance(plugin, CheckpointIO):
            raise ValueError(
                f"trainer.plugins has a CheckpointIO of its own ({type(plugin).__name__}); "
                "repgeom writes every checkpoint through its AtomicCheckpointIO "
                "(repgeom.callbacks.checkpoint_policy), and a Trainer takes only one: remove it "
                "from trainer.plugins")
    return [*given, AtomicCheckpointIO()]


def build_callbacks(cfg: DictConfig) -> list[L.Callback]:
    """Instantiate every `_target_` entry of `cfg.callbacks` and the probe (`cfg.probe`)."""
    confs = [*(cfg.get("callbacks") or {}).values()]
    probe = _probe_conf(cfg.get("probe"))
    return [instantiate(conf) for conf in [*confs, probe] if conf]


def _probe_conf(conf: DictConfig | None) -> DictConfig | None:
    """The probe callback's config, or None when the probe is off (`probe=none`, `probe: null`).

    `conf/probe/none.yaml` sets `enabled: false`. The experiment presets set `probe.*` values
    and are composed after the probe group, so with `probe=none` those values still land in
    `cfg.probe`; the flag says to build nothing. Any other probe config must name its class
    with `_target_`: a plain dict handed to Lightning as a callback fails much later, deep in
    the trainer ("Missing key on_exception").
    """
    if conf is None:
        return None
    if conf.get("enabled", True) is False:
        ignored = sorted(k for k in conf if k != "enabled")
        if ignored:
            log.info("probe=none: no probe during training; ignoring probe.%s (set by a preset)",
                     ", probe.".join(ignored))
        return None
    if not conf.get("_target_"):
        options = sorted(p.stem for p in _PROBE_OPTIONS_DIR.glob("*.yaml")) or [
            "default", "full", "none"]
        raise ValueError(
            f"probe has no _target_, so it is not a callback (keys: {sorted(conf)}). Choose a "
            f"probe config with probe=<option>, one of {options} (probe=none switches the "
            "probe off), or give probe._target_ a callback class"
        )
    check_offload(conf.get("offload"))  # before any data is read
    return conf


def train(cfg: DictConfig) -> TrainResult:
    """Train the configured model; return the trainer, module and where everything was written."""
    quiet_console()
    _probe_conf(cfg.get("probe"))  # a probe that is not a callback fails now, not after setup
    check_options(cfg)  # before the data is downloaded or tokenized
    output_dir = run_folder(cfg)
    output_dir.mkdir(parents=True, exist_ok=True)
    L.seed_everything(cfg.seed, workers=True, verbose=False)  # the seed is in the config

    recipe = OmegaConf.to_container(cfg.recipe, resolve=True) if cfg.get("recipe") else {}
    pin = recipe.get("pin_memory", "auto")  # "auto": pinned when CUDA is available
    datamodule = instantiate(cfg.data, pin_memory=None if pin == "auto" else bool(pin))
    datamodule.prepare_data()
    datamodule.setup("fit")
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    model_cfg.update(vocab_size=datamodule.vocab.size, causal=bool(cfg.masking.causal))
    if "vocab_multiple" not in model_cfg:  # recipe.pad_vocab, unless the model sets it
        model_cfg["vocab_multiple"] = vocab_multiple(recipe, _run_device(cfg.trainer))
    model_config = instantiate(model_cfg)
    module = CharLM(
        model=asdict(model_config),
        masking=OmegaConf.to_container(cfg.masking, resolve=True),
        optim=OmegaConf.to_container(cfg.optim, resolve=True),
        vocab=datamodule.vocab.to_dict(),
        seed=int(cfg.seed),
        **{name: recipe[name] for name in _MODULE_SWITCHES if name in recipe},
    )

    loggers = build_loggers(cfg)
    trainer_cfg = cfg.trainer.copy()
    with open_dict(trainer_cfg):
        trainer_cfg.precision = resolve_precision(str(trainer_cfg.precision))
    plugins = trainer_plugins(trainer_cfg.get("plugins"))
    with open_dict(trainer_cfg):
        trainer_cfg.pop("plugins", None)
    trainer: L.Trainer = instantiate(
        trainer_cfg, callbacks=build_callbacks(cfg), logger=loggers or False, plugins=plugins
    )
    _set_tf32(recipe.get("tf32", "auto"), trainer.strategy.root_device)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    # Windows per optimizer step over all ranks (conf/trainer/ddp.yaml); in the W&B config too.
    resolved["effective_batch_size"] = _log_effective_batch_size(cfg, trainer)
    for logger in loggers:
        logger.log_hyperparams(resolved)

    ckpt_path = cfg.ckpt_path
    found = resume_checkpoint(output_dir) if ckpt_path is None else None
    if ckpt_path is None and found is not None:
        log.info("Resuming from %s (found in the run folder)", found)
        ckpt_path = str(found)
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)

    # Under DDP only rank 0 has a W&B run; the other ranks hold a stand-in without a folder.
    wandb_dir = (
        next(
            (Path(lg.experiment.dir).parent for lg in loggers if isinstance(lg, WandbLogger)), None
        )
        if trainer.is_global_zero
        else None
    )
    _print_summary(trainer, output_dir, wandb_dir,
                   offline=wandb_dir is not None and _is_offline(loggers))
    if wandb_dir is not None:
        # Close the W&B run: otherwise the next job of a multirun (same process) logs into it.
        import wandb  # only a run with a W&B logger needs it (a csv-only run does not)

        wandb.finish()
    return TrainResult(trainer, module, datamodule, output_dir, wandb_dir)


_MODULE_SWITCHES = ("compile", "fused_adamw", "finite_check_every_n_steps", "sync_free_logging")
"""The recipe switches (conf/recipe/) that `CharLM` reads against its device."""


def _run_device(trainer_cfg: DictConfig) -> torch.device:
    """The device type the trainer will train on, before it is built (the model's layout
    depends on it: recipe.pad_vocab): its accelerator, "auto" meaning CUDA where available."""
    accelerator = str(trainer_cfg.get("accelerator", "auto"))
    if accelerator == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device("cuda" if accelerator == "gpu" else accelerator)


def _set_tf32(tf32: bool | str, device: torch.device) -> None:
    """recipe.tf32: float32 matmuls on TF32 tensor cores, for a run on CUDA.

    A process-wide setting of torch's CUDA backends (the CPU's matmuls are untouched), set only
    when the switch is on, so a run with it off leaves what the process had.
    """
    if device.type == "cuda" and switch_on(tf32, device):
        set_tf32_matmul(True)  # cuDNN's convolutions: TF32 already


def _log_effective_batch_size(cfg: DictConfig, trainer: L.Trainer) -> int:
    """Per device x devices x nodes x accumulation; printed once, on rank 0."""
    per_device = int(cfg.data.batch_size)
    ranks = trainer.num_devices * trainer.num_nodes
    accumulate = trainer.accumulate_grad_batches
    effective = per_device * ranks * accumulate
    root = trainer.strategy.root_device  # said here, once: Lightning's GPU/TPU lines are off
    device = torch.cuda.get_device_name(root) if root.type == "cuda" else root.type
    rank_zero_info(
        f"Effective batch size {effective} windows = {per_device} per device x {ranks} "
        f"device(s) x {accumulate} accumulation step(s); device: {device}"
    )
    return effective


def read_csv_metrics(run_dir: str | Path) -> pd.DataFrame:
    """Every metric the CSV logger wrote in `run_dir`, across restarts, as one table.

    Each start of a run (a resume, a requeued SLURM job) logs to its own `csv/version_N`
    folder. Where a later start repeats steps (it resumed from a checkpoint older than the point
    where the earlier start stopped), the later start's rows win from its first training step on.
    """
    files = sorted(
        Path(run_dir).glob("csv/version_*/metrics.csv"),
        key=lambda p: int(p.parent.name.removeprefix("version_")),
    )
    if not files:
        raise FileNotFoundError(f"no csv/version_*/metrics.csv in {run_dir}: was logger=none?")
    frames: list[pd.DataFrame] = []
    for path in files:
        frame = pd.read_csv(path)
        # A start begins where its training loss begins (ThroughputMonitor counts its own
        # batches from 1 after a resume, so the smallest step of the file would be too early).
        steps = (
            frame.loc[frame["train/loss"].notna(), "step"]
            if "train/loss" in frame
            else frame["step"]
        )
        if frames and not steps.empty:
            frames = [f[f["step"] < steps.min()] for f in frames]
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def _is_offline(loggers: list[Logger]) -> bool:
    """Whether the W&B run is offline (rank 0 only: the other ranks hold a stand-in run)."""
    return any(isinstance(lg, WandbLogger) and lg.experiment.offline for lg in loggers)


@rank_zero_only
def _print_summary(
    trainer: L.Trainer, output_dir: Path, wandb_dir: Path | None, offline: bool
) -> None:
    metrics = trainer.callback_metrics
    bpc = metrics.get("val/bpc")
    parts = [
        f"Done: {trainer.global_step} steps",
        f"val bpc {bpc.item():.4f}" if bpc is not None else "no validation yet",
        f"checkpoints {output_dir / 'checkpoints'}",
        f"logs {output_dir}",
    ]
    if wandb_dir is not None:
        parts.append(
            f"W&B offline run {wandb_dir} (upload: wandb sync {wandb_dir})"
            if offline
            else f"W&B run {wandb_dir}"
        )
    print(" | ".join(parts))
