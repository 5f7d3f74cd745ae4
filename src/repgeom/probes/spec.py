"""`ProbeSpec`: everything that fixes a probe's numbers, with each default in one place.

The probe set (`repgeom.probes.sampling`), the metrics (`repgeom.probes.catalogue`) and their
estimator options (`repgeom.probes.measure.ProbeSettings`, whose defaults `EstimatorOptions`
takes over). The training callback is built from it (`ProbeCallbackConf`, registered in Hydra's
ConfigStore as ``probe/base``: ``conf/probe/*.yaml`` only override it), saves it in every
checkpoint (``ProbeCallback.state_dict()["spec"]``), and ``probe.py`` reads it back
(`ProbeSpec.from_checkpoint`, which also reads the loose dict of checkpoints written before).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

from repgeom.models.checkpoints import run_config
from repgeom.probes.measure import ProbeSettings
from repgeom.probes.sampling import (
    DEFAULT_ATTENTION_WINDOWS,
    DEFAULT_N_STATES,
    DEFAULT_POSITIONS_PER_WINDOW,
)

_SPEC_LEVEL = ("seed", "metrics")  # fields of ProbeSettings that the spec holds itself

EstimatorOptions = dataclasses.make_dataclass(
    "EstimatorOptions",
    [
        (f.name, f.type, field(default=f.default))
        for f in dataclasses.fields(ProbeSettings)
        if f.name not in _SPEC_LEVEL
    ],
    namespace={"__doc__": "The fields of `ProbeSettings` but seed and metrics, its defaults."},
)
"""`ProbeSettings`' estimator options as a plain dataclass (for Hydra), same names and defaults."""


@dataclass
class ProbeSpec:
    """What fixes a probe's numbers (not when it runs: the schedule is the callback's).

    n_states, positions_per_window, attention_windows : the probe set (`sampling.probe_set`)
    batch_size : windows per forward pass (memory only, not the numbers)
    seed : fixes the windows, positions and estimator batches
    metrics : catalogue names (`catalogue.resolve`)
    settings : estimator options (`ProbeSettings`)
    protocol : the name of the protocol these options make (``repgeom``, ``llm_microscope``:
        conf/probe/llm_microscope.yaml), written to ``probes/probe_set.json``
    """

    n_states: int = DEFAULT_N_STATES
    positions_per_window: Optional[int] = DEFAULT_POSITIONS_PER_WINDOW  # noqa: UP045 (OmegaConf)
    attention_windows: int = DEFAULT_ATTENTION_WINDOWS
    batch_size: int = 16
    seed: int = 0
    metrics: list[str] = field(default_factory=lambda: ["default"])
    settings: EstimatorOptions = field(default_factory=EstimatorOptions)  # type: ignore[valid-type]
    protocol: str = "repgeom"

    def __post_init__(self) -> None:
        if not isinstance(self.settings, EstimatorOptions):
            known = {f.name for f in dataclasses.fields(EstimatorOptions)}
            given = dict(self.settings or {})
            if "twonn_batch_size" in given:  # checkpoints written before every metric batched
                given.setdefault("state_batch_size", given.pop("twonn_batch_size"))
            self.settings = EstimatorOptions(**{k: v for k, v in given.items() if k in known})
        self.metrics = [str(m) for m in self.metrics]
        self.probe_settings()  # checks every option now, naming it

    def probe_settings(self) -> ProbeSettings:
        return ProbeSettings(seed=self.seed, metrics=tuple(self.metrics), **asdict(self.settings))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_checkpoint(cls, state: dict[str, Any]) -> ProbeSpec:
        """The spec a `ProbeCallback` saved; older checkpoints saved a loose ``config`` dict
        (``n_states``, ..., ``settings`` with ``seed``; the oldest ``twonn_batch_size``)."""
        if "spec" in state:
            return cls(**state["spec"])
        config = dict(state["config"])
        settings = dict(config.get("settings") or {})
        seed = config.get("seed", settings.get("seed", 0))
        settings.pop("seed", None)
        metrics = settings.pop("metrics", ["default"])
        known = {f.name for f in dataclasses.fields(cls)}
        given = {k: config[k] for k in known if k in config}
        return cls(**{**given, "seed": seed, "metrics": list(metrics), "settings": settings})


@dataclass
class TrainingProbe:
    """How the training probe of a run built its probe set (None where unknown)."""

    n_states: int | None = None
    positions_per_window: int | None = None
    attention_windows: int | None = None
    batch_size: int | None = None
    seed: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    origin: str = "none"


def training_probe(ckpt: dict, run_dir: Path) -> TrainingProbe:
    """The training probe's config: from the checkpoint, else the run folder's config."""
    for key, state in (ckpt.get("callbacks") or {}).items():
        if key.startswith("ProbeCallback") and isinstance(state, dict) and (
            "spec" in state or "config" in state
        ):
            spec = ProbeSpec.from_checkpoint(state)
            return TrainingProbe(
                n_states=spec.n_states,
                positions_per_window=spec.positions_per_window,
                attention_windows=spec.attention_windows,
                batch_size=spec.batch_size,
                seed=spec.seed,
                settings=asdict(spec.probe_settings()),
                origin="checkpoint",
            )
    conf = run_config(run_dir) or {}
    probe = conf.get("probe")
    if isinstance(probe, dict) and probe.get("_target_", "").endswith("ProbeCallback"):
        settings = dict(probe.get("settings") or {})
        seed = probe.get("seed")
        settings.setdefault("seed", seed)
        return TrainingProbe(
            n_states=probe.get("n_states"),
            positions_per_window=probe.get("positions_per_window"),
            attention_windows=probe.get("attention_windows"),
            batch_size=probe.get("batch_size"),
            seed=seed,
            settings=settings,
            origin=f"run config in {run_dir}",
        )
    return TrainingProbe()


@dataclass
class ProbeCallbackConf(ProbeSpec):
    """The training probe: a `ProbeSpec` and its schedule and figures (`ProbeCallback`)."""

    _target_: str = "repgeom.probes.callback.ProbeCallback"
    every_n_steps: int = 1000
    log_spaced_until: int = 1000
    n_log_spaced: int = 8
    max_probes: Optional[int] = 40  # noqa: UP045
    plot_every_n_probes: int = 5
    plot_metrics: Optional[list[str]] = None  # noqa: UP045


ConfigStore.instance().store(group="probe", name="base", node=ProbeCallbackConf)
