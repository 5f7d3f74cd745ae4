"""The real Hydra config of train.py, shrunk for tests (importable as `hydra_configs`)."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

import repgeom.probes.core.spec  # noqa: F401 - registers probe/base in Hydra's ConfigStore

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = ROOT / "conf"

# The smallest model and run that still exercise every code path, in seconds on 2 CPU cores.
TINY = [
    "data=sample",
    "model.n_layer=2",
    "model.n_head=2",
    "model.n_embd=32",
    "model.block_size=32",
    "data.batch_size=8",
    "data.val_windows=16",
    "trainer=cpu",
    "trainer.max_steps=20",
    "trainer.val_check_interval=10",
    "trainer.limit_val_batches=2",
    "trainer.log_every_n_steps=1",
    "optim.scheduler.warmup_steps=5",
    "~callbacks.progress_bar",
    "probe.n_states=512",
    # Probes at steps 0 and max_steps only: the default schedule's 8 log-spaced probes made up
    # most of a tiny run's time. Tests of the schedule set their own (test_callback.PROBE).
    "probe.n_log_spaced=0",
    "probe.plot_every_n_probes=0",
    "probe.settings.max_order=16",
    "probe.settings.state_batch_size=256",
]


def compose_train(tmp_path: Path, overrides: list[str] = (), *, tiny: bool = True) -> DictConfig:
    """The real `conf/train.yaml`, shrunk by `TINY` unless `tiny=False`, writing to `tmp_path`."""
    GlobalHydra.instance().clear()
    shrink = TINY if tiny else []
    if "probe=none" in overrides:  # nothing to shrink in a probe that is switched off
        shrink = [o for o in shrink if not o.startswith("probe.")]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=[*shrink, f"output_dir={tmp_path}", *overrides])


def compose_probe(tmp_path: Path, overrides: list[str] = ()) -> DictConfig:
    """The real `conf/probe.yaml` (probe.py's), writing to `tmp_path`."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("probe", overrides=[f"output_dir={tmp_path}", *overrides])


def compose_job(tmp_path: Path, overrides: list[str] = ()):
    """`compose_probe`'s config read and checked as probe.py does: its `ProbeJob`."""
    from repgeom.probes.run.job import probe_job

    return probe_job(compose_probe(tmp_path, overrides))
