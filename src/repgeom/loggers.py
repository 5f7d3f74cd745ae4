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
from urllib.parse import urlparse

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, open_dict

from repgeom.console import drop_unset_wandb_anonymous

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


def run_id(output_dir: Path) -> str:
    """The W&B run id of this run folder: kept in a file so a resumed run logs to the same run."""
    path = output_dir / "wandb_run_id.txt"
    if path.exists():
        return path.read_text().strip()
    run_id = uuid.uuid4().hex[:8]  # from os.urandom: not tied to the seeded RNGs
    if rank_zero_only.rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(run_id + "\n")
    return run_id


def build_loggers(cfg: DictConfig, output_dir: Path) -> list[Logger]:
    """Instantiate every `_target_` entry of `cfg.logger`; W&B offline unless logged in."""
    loggers = []
    for name, conf in (cfg.get("logger") or {}).items():
        conf = conf.copy()
        if conf.get("_target_", "").endswith("WandbLogger"):
            with open_dict(conf):
                if conf.get("offline") is None:
                    mode = os.environ.get("WANDB_MODE")
                    conf.offline = mode in ("offline", "dryrun") if mode else not wandb_logged_in()
                if conf.get("id") is None:
                    conf.id = run_id(output_dir)
                if conf.get("group") is None:
                    conf.group = sweep_group() or _offload_group(cfg, conf.id)
                conf.resume = "allow"
        log.debug("logger %s: %s", name, conf.get("_target_"))
        loggers.append(drop_unset_wandb_anonymous(instantiate(conf)))
    return loggers


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
