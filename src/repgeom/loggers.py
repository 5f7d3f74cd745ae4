"""The run's loggers from ``cfg.logger``: W&B (offline unless logged in) and CSV.

One module for ``train.py``, ``probe.py`` and the dashboard, below all of them: building a
logger needs neither the Trainer nor the training stack (`repgeom.probes.run.runner` imports this,
never `repgeom.train`).
"""

from __future__ import annotations

import logging
import netrc
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning_utilities.core.rank_zero import rank_zero_only  # Lightning's own, without it
from omegaconf import DictConfig, OmegaConf, open_dict

from repgeom.console import drop_unset_wandb_anonymous

if TYPE_CHECKING:
    from lightning.pytorch.loggers import Logger

log = logging.getLogger(__name__)


def wandb_logged_in() -> bool:
    """True when W&B credentials are available without asking (env var or netrc)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc().authenticators(host or "") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def _rank() -> int:
    """This process's global rank: Lightning's where it has set it (``rank_zero_only.rank``),
    else from the environment as Lightning reads it (``lightning.fabric``'s ``_get_rank``)."""
    rank = getattr(rank_zero_only, "rank", None)
    if rank is not None:
        return int(rank)
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if os.environ.get(key) is not None:
            return int(os.environ[key])
    return 0


def run_id(output_dir: Path) -> str:
    """The W&B run id of this run folder: kept in a file so a resumed run logs to the same run."""
    path = output_dir / "wandb_run_id.txt"
    if path.exists():
        return path.read_text().strip()
    run_id = uuid.uuid4().hex[:8]  # from os.urandom: not tied to the seeded RNGs
    if _rank() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(run_id + "\n")
    return run_id


def is_wandb(conf: Any) -> bool:
    return str(conf.get("_target_", "")).endswith("WandbLogger")


def run_folder(cfg: DictConfig) -> Path:
    """The run folder, ``cfg.output_dir`` (Hydra's run or job folder), absolute: where a W&B
    run keeps its id and, unless its ``save_dir`` says otherwise, its files."""
    if cfg.get("output_dir") is None:
        raise ValueError("output_dir is not set: leave it to Hydra (conf/train.yaml and "
                         "conf/probe.yaml set ${hydra:runtime.output_dir}) or give "
                         "output_dir=<folder>")
    return Path(str(cfg.output_dir)).resolve()


def _wandb_conf(cfg: DictConfig, conf: DictConfig) -> DictConfig:
    """A W&B logger entry with what the run decides: offline unless logged in (or as
    ``WANDB_MODE`` says), the run id kept in the run folder, the sweep's (or offload's) group,
    and resume allowed."""
    conf = conf.copy()
    with open_dict(conf):
        if conf.get("offline") is None:
            mode = os.environ.get("WANDB_MODE")
            conf.offline = mode in ("offline", "dryrun") if mode else not wandb_logged_in()
        if conf.get("id") is None:
            conf.id = run_id(run_folder(cfg))
        if conf.get("group") is None:
            conf.group = sweep_group() or _offload_group(cfg, conf.id)
        conf.resume = "allow"
    return conf


def build_loggers(cfg: DictConfig) -> list[Logger]:
    """Instantiate every `_target_` entry of `cfg.logger` (Lightning loggers, for training); W&B
    offline unless logged in, its id kept in the run folder (`run_folder`)."""
    loggers = []
    for name, conf in (cfg.get("logger") or {}).items():
        if is_wandb(conf):
            conf = _wandb_conf(cfg, conf)
        log.debug("logger %s: %s", name, conf.get("_target_"))
        loggers.append(drop_unset_wandb_anonymous(instantiate(conf)))
    return loggers


LIGHTNING_ONLY = ("_target_", "offline", "save_dir", "log_model", "prefix", "checkpoint_name",
                  "experiment", "anonymous", "version")
"""WandbLogger arguments that are Lightning's, not ``wandb.init``'s."""


def wandb_runs(cfg: DictConfig) -> list:
    """A ``wandb.init`` run for every W&B entry of `cfg.logger`, as Lightning's `WandbLogger`
    would start it (``dir`` its ``save_dir``, else the run folder `run_folder`; ``mode`` from
    ``offline``; the rest as given): for ``probe.py``, which logs to W&B without importing
    Lightning."""
    runs = []
    for conf in (cfg.get("logger") or {}).values():
        if not is_wandb(conf):
            continue
        import wandb

        conf = _wandb_conf(cfg, conf)
        settings = instantiate(conf.settings) if conf.get("settings") is not None else None
        given = OmegaConf.to_container(conf, resolve=True)
        kwargs = {k: v for k, v in given.items()
                  if k not in (*LIGHTNING_ONLY, "settings") and v is not None}
        runs.append(wandb.init(**kwargs, dir=str(given.get("save_dir") or run_folder(cfg)),
                               mode="offline" if conf.offline else "online",
                               settings=settings))
    return runs


def _offload_group(cfg: DictConfig, run_id: str) -> str | None:
    """A group for a single run whose probes are offloaded (``probe.offload``): the probe
    worker's W&B run joins the training run there (`repgeom.probes.run.offload.follow`)."""
    probe = cfg.get("probe") or {}
    if not probe.get("offload") or probe.get("enabled", True) is False:
        return None
    return f"{cfg.get('run_name') or 'run'}-{run_id}"


def sweep_group() -> str | None:
    """The W&B group of a Hydra multirun, named after its sweep folder; None outside one.

    The part after `multirun/` (`multirun/2024-05-01/12-00-00` -> "2024-05-01_12-00-00",
    `multirun/masking-sweep` -> "masking-sweep"), else the folder's name. Name a sweep with
    `hydra.sweep.dir=multirun/<name>`, or set `logger.wandb.group` directly.
    """
    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return None
    parts = Path(hydra_cfg.sweep.dir).parts
    after = [i + 1 for i, part in enumerate(parts) if part == "multirun"]
    tail = parts[after[-1] :] if after and after[-1] < len(parts) else parts[-1:]
    return "_".join(tail)
