"""`ProbeSpec`: everything that fixes a probe's numbers, with each default in one place.

The probe set (`repgeom.probes.core.sampling`), the metrics (`repgeom.probes.core.catalogue`) and
their
estimator options (`repgeom.probes.core.measure.ProbeSettings`, whose defaults `EstimatorOptions`
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
from repgeom.probes.core.measure import ProbeSettings
from repgeom.probes.core.sampling import (
    DEFAULT_ATTENTION_WINDOWS,
    DEFAULT_N_STATES,
    DEFAULT_POSITIONS_PER_WINDOW,
    TEXTS,
)

POSITIONS_ALL = "all"
"""``positions_per_window=all``: every position of every window (the one spelling in configs;
a spec holds it as None, and reads the None of checkpoints and run configs written before)."""


def _check_per_window(value: Any, accepted: str) -> None:
    """``positions_per_window`` is a positive integer, ``all`` or null; else a ValueError that
    says what the field `accepted`."""
    if value is not None and value != POSITIONS_ALL and (
        isinstance(value, bool) or not isinstance(value, int) or value < 1
    ):
        raise ValueError(f"positions_per_window must be {accepted}, got {value!r}")


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
    texts : ``real``, or ``shuffled``: each window's tokens shuffled, the same windows and
        positions (`sampling.shuffle_tokens`), the shuffled-text control
    """

    n_states: int = DEFAULT_N_STATES
    positions_per_window: Any = DEFAULT_POSITIONS_PER_WINDOW  # an int, or "all" (OmegaConf: Any)
    attention_windows: int = DEFAULT_ATTENTION_WINDOWS
    batch_size: int = 16
    seed: int = ProbeSettings.seed
    metrics: list[str] = field(default_factory=lambda: ["default"])
    settings: EstimatorOptions = field(default_factory=EstimatorOptions)  # type: ignore[valid-type]
    protocol: str = "repgeom"
    texts: str = TEXTS[0]

    def __post_init__(self) -> None:
        if self.texts not in TEXTS:
            raise ValueError(f"texts must be one of {', '.join(TEXTS)}, got {self.texts!r}")
        if not isinstance(self.settings, EstimatorOptions):
            known = {f.name for f in dataclasses.fields(EstimatorOptions)}
            given = dict(self.settings or {})
            if "twonn_batch_size" in given:  # checkpoints written before every metric batched
                given.setdefault("state_batch_size", given.pop("twonn_batch_size"))
            self.settings = EstimatorOptions(**{k: v for k, v in given.items() if k in known})
        self.metrics = [str(m) for m in self.metrics]
        _check_per_window(self.positions_per_window, "a positive integer or 'all'")
        if self.positions_per_window == POSITIONS_ALL:
            self.positions_per_window = None
        self.probe_settings()  # checks every option now, naming it

    def probe_settings(self) -> ProbeSettings:
        return ProbeSettings(seed=self.seed, metrics=tuple(self.metrics), **asdict(self.settings))

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict, what checkpoints hold; ``texts`` only where not ``real``, so a
        checkpoint of real text reads in a repgeom from before the field (which refuses
        unknown fields), and one of shuffled text does not (it would probe real text)."""
        given = asdict(self)
        if given["texts"] == TEXTS[0]:
            del given["texts"]
        return given

    @classmethod
    def from_checkpoint(cls, state: dict[str, Any]) -> ProbeSpec:
        """The spec a `ProbeCallback` saved; older checkpoints saved a loose ``config`` dict
        (``n_states``, ..., ``settings`` with ``seed``; the oldest ``twonn_batch_size``)."""
        if "spec" in state:
            return cls(**state["spec"])
        config = dict(state["config"])
        settings = {k: v for k, v in (config.get("settings") or {}).items() if v is not None}
        seed = config.get("seed", settings.get("seed", cls.seed))
        settings.pop("seed", None)
        metrics = settings.pop("metrics", ["default"])
        known = {f.name for f in dataclasses.fields(cls)}
        given = {k: config[k] for k in known if k in config}
        return cls(**{**given, "seed": seed, "metrics": list(metrics), "settings": settings})


@dataclass(frozen=True)
class ProbeRequest:
    """What probe.py's command line asks (``conf/probe.yaml``): None is "as the checkpoint's
    training probe, else the default" (`resolve`), so each default stays written once, in
    `ProbeSpec` and `ProbeSettings`.

    The first fields are `ProbeSpec`'s (``positions_per_window`` also takes ``"all"``;
    ``settings`` holds the non-null estimator options). The last four say where the windows come
    from besides a checkpoint's own validation data: ``text_file`` (any text), ``text_source``
    (HF models without a text file: ``sample`` or ``enwik8``), ``window`` (HF tokens per window)
    and ``include_special`` (keep BOS/CLS/SEP positions of HF models). Read from the config, by
    field name, by `repgeom.probes.run.job.probe_request`, as a part of probe.py's `ProbeJob`.
    """

    n_states: int | None = None
    positions_per_window: int | str | None = None
    attention_windows: int | None = None
    batch_size: int | None = None
    seed: int | None = None
    metrics: tuple[str, ...] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    protocol: str | None = None
    texts: str | None = None
    text_file: str | None = None
    text_source: str = "sample"
    window: int | None = None
    include_special: bool = False

    def __post_init__(self) -> None:
        for name in ("n_states", "attention_windows", "batch_size", "window"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{name} must be a positive integer or null, got {value!r}")
        _check_per_window(self.positions_per_window, "a positive integer, 'all' or null")
        known = [f.name for f in dataclasses.fields(EstimatorOptions)]
        misplaced = {"seed": "seed=", "metrics": "metrics=[...]"}
        for key in self.settings:
            if key in misplaced:
                raise ValueError(f"settings.{key}: give it as {misplaced[key]} (top level)")
            if key not in known:
                raise ValueError(f"settings: unknown key {key!r}; known: {known}")


def resolve(request: ProbeRequest, trained: ProbeSpec | None = None, *,
            seed: int | None = None) -> ProbeSpec:
    """The probe's one resolved spec: `request`'s values, then the training probe's
    (`trained`, from `training_probe`), then the defaults of `ProbeSpec` and `ProbeSettings`.

    `seed` is the fallback seed when neither gives one (a run's training seed), else
    `ProbeSpec`'s. The training callback's spec is already resolved (Hydra composes it).
    """
    base = trained if trained is not None else (
        ProbeSpec() if seed is None else ProbeSpec(seed=int(seed)))
    chosen = {}
    for f in dataclasses.fields(ProbeSpec):  # a new field of both is resolved with no new line
        value = getattr(request, f.name)
        chosen[f.name] = getattr(base, f.name) if value is None else value
    chosen["settings"] = {**asdict(base.settings), **request.settings}
    chosen["metrics"] = list(chosen["metrics"])
    return ProbeSpec(**chosen)


def training_probe(ckpt: dict, run_dir: Path) -> tuple[ProbeSpec | None, str]:
    """The training probe's spec and where it was found: ``"checkpoint"`` (saved by the
    callback), ``"run config in <run>"`` (checkpoints written before), or None and ``"none"``.

    A run config without a probe seed takes the run's training seed.
    """
    for key, state in (ckpt.get("callbacks") or {}).items():
        if key.startswith("ProbeCallback") and isinstance(state, dict) and (
            "spec" in state or "config" in state
        ):
            return ProbeSpec.from_checkpoint(state), "checkpoint"
    conf = run_config(run_dir) or {}
    probe = conf.get("probe")
    if isinstance(probe, dict) and probe.get("_target_", "").endswith("ProbeCallback"):
        given = {k: v for k, v in probe.items() if v is not None}
        if "seed" not in given:
            given["seed"] = ckpt["hyper_parameters"].get("seed", ProbeSpec.seed)
        spec = ProbeSpec.from_checkpoint({"config": given})
        return spec, f"run config in {run_dir}"
    return None, "none"


@dataclass
class WorkerConf:
    """The probe worker of ``probe.offload`` (`repgeom.probes.run.offload.follow`): how
    ``train.py`` starts it (``probe.offload=worker``) and how it follows the run."""

    threads: int = 1  # its torch threads (OMP_NUM_THREADS): spare cores, not training's
    device: str = "cpu"  # cpu | cuda | cuda:1 ...: the same GPU as training works too
    cpus: Optional[list[int]] = None  # noqa: UP045 - the cores it may use (Linux); null: any
    timeout_s: float = 600.0  # stop after this long without a heartbeat or a new snapshot
    keep_snapshots: bool = False  # keep each snapshot once probed (else deleted)
    heartbeat_s: float = 10.0  # how often training says it is alive (training.json)
    min_free_gb: float = 1.0  # a snapshot that would leave less free disk is skipped, warned
    wait: bool = True  # train.py waits at the end for its worker to probe the last snapshots
    wait_timeout_s: float = 3600.0  # at most this long; then it stops it (probe.py follow= resumes)


@dataclass
class ProbeCallbackConf(ProbeSpec):
    """The training probe: a `ProbeSpec` and its schedule and figures (`ProbeCallback`), and
    where it runs: in the training process (``offload: null``) or in a worker
    (``snapshots``/``worker``, `repgeom.probes.run.offload.snapshots`)."""

    _target_: str = "repgeom.probes.run.callback.ProbeCallback"
    every_n_steps: int = 1000
    log_spaced_until: int = 1000
    n_log_spaced: int = 8
    max_probes: Optional[int] = 40  # noqa: UP045
    plot_every_n_probes: int = 5
    plot_metrics: Optional[list[str]] = None  # noqa: UP045
    offload: Optional[str] = None  # noqa: UP045 - null | snapshots | worker
    worker: WorkerConf = field(default_factory=WorkerConf)


ConfigStore.instance().store(group="probe", name="base", node=ProbeCallbackConf)
