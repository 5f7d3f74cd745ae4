"""`probe(cfg)`: the geometry probes on saved checkpoints, whole runs and Hugging Face models.

The engine behind ``probe.py`` (config ``conf/probe.yaml``)::

    python probe.py run=outputs/2026-11-21/12-00-00     # every checkpoint of one of our runs
    python probe.py ckpt=path/to/last.ckpt              # one checkpoint
    python probe.py hf=gpt2                             # a hub name or a save_pretrained folder
    python probe.py hf=EleutherAI/pythia-160m hf_revisions=[step1000,step8000,step143000]
    python probe.py hf=gpt2 compare.text_a="..." compare.text_b="..."

Every number comes from `repgeom.probes.measure.measure`, the function the training probe
(`ProbeCallback`) uses, and lands in the same tidy table (`repgeom.probes.table`).

Our checkpoints are probed exactly as the training probe did: the probe set is rebuilt with
`sampling.probe_set` from the checkpoint's data (``source``, ``clean`` saved by the datamodule)
and the training probe's config (``n_states``, ``positions_per_window``,
``attention_windows``, ``seed``, settings),
which the callback saves in every checkpoint; for older checkpoints it is read from the run
folder's ``.hydra/config.yaml`` or ``csv/hparams.yaml``. A probe of ``last.ckpt`` therefore
gives the numbers the training probe logged at that step. Values set in ``conf/probe.yaml`` (or
on the command line) win over the training probe's; null means "as the training probe".

The ``step`` column: a checkpoint's ``global_step``; for Hugging Face revisions, the number at
the end of every revision name when all of them end in distinct digits (Pythia's ``step1000`` ->
1000), otherwise the revision's index in ``hf_revisions`` (0, 1, ...); 0 for one model.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from repgeom.console import quiet_console
from repgeom.data import enwik8
from repgeom.data.datamodule import Enwik8DataModule, choose_windows
from repgeom.probes import catalogue, plots, similarity, sink, table
from repgeom.probes.measure import ProbeOutput, ProbeSettings, measure
from repgeom.probes.sampling import (
    DEFAULT_ATTENTION_WINDOWS,
    DEFAULT_N_STATES,
    DEFAULT_POSITIONS_PER_WINDOW,
    ProbeSet,
    choose_positions,
    probe_set,
    windows_needed,
)
from repgeom.probes.spec import ProbeSpec
from repgeom.probes.targets import probe_gpt

log = logging.getLogger(__name__)

DEFAULT_HF_WINDOW = 256
CHECKPOINT_PATTERNS = ("*.ckpt",)
class CheckpointFormatError(ValueError):
    """A file that is not a repgeom training checkpoint (another format or no repgeom hparams)."""


# ---------------------------------------------------------------------------------------------
# What gets probed


@dataclass
class Subject:
    """One model to probe: a checkpoint of ours or one Hugging Face revision.

    ``load`` returns the loaded model (a `CharLM` or an `HFModel`); it is called only when the
    subject is probed, so a run with many checkpoints holds one model in memory at a time.
    """

    label: str
    step: int
    kind: str  # "decoder" or "encoder", filled once loaded
    model: str  # the `model` column
    revision: str | None = None  # the `revision` column (Hugging Face only)
    source: str = "ours"  # "ours" or "hf"
    path: Path | None = None
    load: Callable[[], Any] | None = field(default=None, repr=False)


@dataclass
class ProbeRunResult:
    """What `probe` made: the table, figures and files, for tests and for chaining."""

    output_dir: Path
    frame: pd.DataFrame  # the tidy table (empty in compare mode)
    subjects: list[Subject]
    plots: list[Path]
    compare: pd.DataFrame | None = None  # per-layer pooled cosine of the two texts
    warnings: list[str] = field(default_factory=list)
    wandb_dir: Path | None = None

    @property
    def kinds(self) -> dict[str, str]:
        """Label -> "decoder"/"encoder" of every subject."""
        return {s.label: s.kind for s in self.subjects}


# ---------------------------------------------------------------------------------------------
# Our checkpoints


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
            f"({type(error).__name__}: {str(error).splitlines()[0][:200]}). Give a .ckpt written "
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


def find_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """(global_step, path) of every checkpoint of a run, one per step, in step order.

    Looks at ``<run>/checkpoints/*.ckpt`` (``last``, ``best``, ``step*``, ...) and the
    ``hpc_ckpt_*.ckpt`` files Lightning's SLURM requeue writes into the run folder. Files at the
    same step hold the same weights; the first by name is kept.

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
    for path in paths:
        step = int(read_checkpoint(path)["global_step"])
        by_step.setdefault(step, path)
    return sorted(by_step.items())


def _run_dir_of(ckpt_path: Path) -> Path:
    """``<run>/checkpoints/x.ckpt`` -> ``<run>``; ``<run>/hpc_ckpt_1.ckpt`` -> ``<run>``."""
    parent = ckpt_path.resolve().parent
    return parent.parent if parent.name == "checkpoints" else parent


def _run_config(run_dir: Path) -> dict | None:
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
    conf = _run_config(run_dir) or {}
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


def _datamodule_for(ckpt: dict, run_dir: Path, block_size: int, batch_size: int):
    """The datamodule of the checkpoint's data: source/clean from the checkpoint, path, cache and
    verify from the run config where there is one."""
    state = ckpt.get("Enwik8DataModule") or {}
    data = (_run_config(run_dir) or {}).get("data") or {}
    kwargs = {
        "source": state.get("source", data.get("source", "sample")),
        "clean": state.get("clean", data.get("clean", False)),
        "path": data.get("path"),
        "cache_dir": data.get("cache_dir"),
        "verify": data.get("verify", True),
    }
    datamodule = Enwik8DataModule(
        **kwargs, block_size=block_size, batch_size=batch_size, num_workers=0
    )
    datamodule.prepare_data()
    datamodule.setup("fit")
    return datamodule


def _load_charlm(path: Path, device: torch.device):
    from repgeom.models.lightning_module import CharLM

    return CharLM.load_from_checkpoint(path, map_location=device, weights_only=True).eval()


# ---------------------------------------------------------------------------------------------
# Text


def default_text(source: str = "sample") -> str:
    """The enwik8 validation split as text (``"sample"``: the bundled file, works offline)."""
    data, _ = enwik8.load_raw(source)
    return enwik8.split(data)[1].decode("utf-8", errors="replace")


def read_text(path: str | os.PathLike) -> str:
    """A text file, UTF-8 (undecodable bytes replaced)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"text_file={str(path)!r}: no such file ({path.resolve()})")
    return path.read_bytes().decode("utf-8", errors="replace")


def byte_windows(vocab, text: str, *, window: int) -> torch.Tensor:
    """Our checkpoints' windows of `text`: its UTF-8 bytes in the checkpoint's vocabulary,
    cut into non-overlapping windows of `window` characters, shape (N, window)."""
    ids = vocab.encode(text.encode("utf-8"))
    n = len(ids) // window
    if n == 0:
        raise ValueError(
            f"the text is {len(ids)} bytes long; one window of the model's block_size={window} "
            "characters needs at least that many; use a longer text"
        )
    return torch.from_numpy(ids[: n * window].astype(np.int64).reshape(n, window))


# ---------------------------------------------------------------------------------------------
# Config


_MODES = ("run", "ckpt", "hf")


def check_config(cfg: DictConfig) -> str:
    """The mode (``run``, ``ckpt`` or ``hf``); raises ValueError on an inconsistent config."""
    given = [m for m in _MODES if cfg.get(m) not in (None, "")]
    if len(given) != 1:
        got = ", ".join(f"{m}={cfg.get(m)}" for m in given) or "none"
        raise ValueError(
            f"give exactly one of run=<train run folder>, ckpt=<file.ckpt> or hf=<hub name or "
            f"folder> (got {got}); e.g. python probe.py ckpt=outputs/.../checkpoints/last.ckpt"
        )
    mode = given[0]
    if cfg.get("hf_revisions") and mode != "hf":
        raise ValueError(f"hf_revisions= needs hf=<name>; got {mode}=")
    compare = cfg.get("compare") or {}
    texts = [compare.get("text_a"), compare.get("text_b")]
    if any(t is not None for t in texts):
        if any(t is None or t == "" for t in texts):
            raise ValueError(
                "compare needs both compare.text_a=... and compare.text_b=... (non-empty)"
            )
        if mode == "run":
            raise ValueError(
                "compare takes ckpt= or hf=, not run=; pick one checkpoint, e.g. "
                "ckpt=<run>/checkpoints/last.ckpt"
            )
    for key in ("n_states", "batch_size", "window"):
        value = cfg.get(key)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{key} must be a positive integer or null, got {value!r}")
    unknown = set(cfg.get("settings") or {}) - {f.name for f in fields(ProbeSettings)}
    if unknown:
        raise ValueError(
            f"settings: unknown key(s) {sorted(unknown)}; known: "
            f"{[f.name for f in fields(ProbeSettings)]}"
        )
    return mode


def resolve_device(device: str | None) -> torch.device:
    """``"auto"`` (or null): CUDA when available, else CPU."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _settings(cfg: DictConfig, base: dict[str, Any], seed: int) -> ProbeSettings:
    """`ProbeSettings`: defaults < the training probe's (`base`) < non-null values of cfg."""
    chosen = {"seed": seed, **{k: v for k, v in base.items() if v is not None}}
    if "twonn_batch_size" in chosen:  # checkpoints written before the batches served every metric
        chosen.setdefault("state_batch_size", chosen.pop("twonn_batch_size"))
    overrides = OmegaConf.to_container(cfg.get("settings") or {}, resolve=True)
    chosen.update({k: v for k, v in overrides.items() if v is not None})
    if cfg.get("seed") is not None and overrides.get("seed") is None:
        chosen["seed"] = int(cfg.seed)
    if cfg.get("metrics") is not None:
        chosen["metrics"] = [str(m) for m in cfg.metrics]
    known = {f.name for f in fields(ProbeSettings)}
    return ProbeSettings(**{k: v for k, v in chosen.items() if k in known})


def revision_steps(revisions: Sequence[str]) -> list[int]:
    """The ``step`` of each revision: its trailing number when every revision name ends in
    distinct digits (``step1000`` -> 1000), otherwise its index in the list.

    >>> revision_steps(["step1000", "step8000", "step143000"])
    [1000, 8000, 143000]
    >>> revision_steps(["main", "v2"])
    [0, 1]
    """
    numbers = [re.search(r"(\d+)$", str(r)) for r in revisions]
    if all(numbers):
        steps = [int(m.group(1)) for m in numbers]
        if len(set(steps)) == len(steps):
            return steps
    return list(range(len(revisions)))


# ---------------------------------------------------------------------------------------------
# The run


def probe(cfg: DictConfig) -> ProbeRunResult:
    """Probe what `cfg` names (``run``, ``ckpt`` or ``hf``); write the table, plots and logs.

    Returns
    -------
    ProbeRunResult
        The table (``<output_dir>/probes/probes.{parquet,csv}``), figure paths
        (``<output_dir>/probes/plots``), the probed subjects with "encoder"/"decoder", and in
        compare mode the per-layer pooled cosine (``<output_dir>/compare/pooled_cosine.csv``).
    """
    quiet_console()
    mode = check_config(cfg)
    output_dir = Path(cfg.output_dir).expanduser().resolve()
    output_dir.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.get("device"))
    subjects = _subjects(cfg, mode, device)
    comparing = cfg.get("compare") is not None and cfg.compare.get("text_a") is not None

    loggers = _wandb_runs(cfg, output_dir, mode, subjects)
    all_warnings: list[str] = []
    frame = table.rows_to_frame([])
    compare_frames: list[pd.DataFrame] = []
    figures: list[Path] = []
    started = time.perf_counter()
    pairs: list = []
    for subject in subjects:
        loaded = subject.load()
        if comparing:
            pooled, paths = _compare(cfg, subject, loaded, output_dir, several=len(subjects) > 1)
            compare_frames.append(pooled)
            figures += paths
            _print_compare(subject, pooled)
            continue
        output = _probe_subject(cfg, subject, loaded)
        for message in dict.fromkeys(output.warnings):
            warnings.warn(message, stacklevel=2)
        all_warnings += output.warnings
        if output.states:  # for the comparison with the last subject, or with another run
            similarity.save_states(
                table.probe_dir(output_dir), subject.step, output.states, output.layer_names
            )
        rows = [{"step": subject.step, **row, **_id_columns(subject)} for row in output.rows]
        frame = sink.write_step(output_dir, rows)
        seconds = {"probe/seconds_total": time.perf_counter() - started}
        sink.log_scalars(loggers, subject.step, table.rows_to_frame(rows), seconds)
        pairs = catalogue.select(output.settings).pairs if output.settings else []
        del loaded
    if not comparing and len(subjects) > 1 and pairs:
        rows = similarity.vs_final_rows(
            table.probe_dir(output_dir),
            pairs,
            batch_size=output.settings.state_batch_size,
            seed=output.settings.seed,
        )
        by_step = {s.step: _id_columns(s) for s in subjects}
        rows = [{**row, **by_step.get(row["step"], {})} for row in rows]
        if rows:
            frame = sink.write_step(output_dir, rows)
            for step, part in table.rows_to_frame(rows).groupby("step"):
                sink.log_scalars(loggers, int(step), part, {})

    if comparing:
        result = ProbeRunResult(
            output_dir, frame, subjects, figures, pd.concat(compare_frames, ignore_index=True)
        )
    else:
        wanted = cfg.get("plot_metrics")
        wanted = None if wanted is None else [str(m) for m in wanted]
        figures = plots.save_figures(frame, table.plot_dir(output_dir), metrics=wanted)
        _print_tables(frame, subjects)
        result = ProbeRunResult(output_dir, frame, subjects, figures, warnings=all_warnings)
    _write_info(result, cfg, mode)
    for run in loggers:
        _log_figures(run, figures, max(s.step for s in subjects))
        run.summary["probe/kind"] = ", ".join(sorted({s.kind for s in subjects}))
        result.wandb_dir = Path(run.dir).parent
        run.finish()
    print(f"Probe outputs: {output_dir}")
    return result


def _id_columns(subject: Subject) -> dict[str, Any]:
    columns: dict[str, Any] = {"model": subject.model}
    if subject.source == "hf":
        columns["revision"] = subject.revision
    return columns


def _subjects(cfg: DictConfig, mode: str, device: torch.device) -> list[Subject]:
    if mode == "hf":
        return _hf_subjects(cfg, device)
    if mode == "ckpt":
        path = Path(str(cfg.ckpt)).expanduser()
        ckpt = read_checkpoint(path)  # fails early on a missing or foreign file
        found = [(int(ckpt["global_step"]), path)]
    else:
        found = find_checkpoints(str(cfg.run))
    subjects = []
    for step, path in found:
        run_dir = _run_dir_of(path)
        subject = Subject(
            label=f"{path.stem} (step {step})",
            step=step,
            kind="",
            model=run_dir.name,
            path=path,
        )
        subject.load = _loader_for_ours(subject, device)
        subjects.append(subject)
    return subjects


def _loader_for_ours(subject: Subject, device: torch.device) -> Callable[[], Any]:
    def load():
        module = _load_charlm(subject.path, device)
        subject.kind = "decoder" if module.model.config.causal else "encoder"
        return module

    return load


def _hf_subjects(cfg: DictConfig, device: torch.device) -> list[Subject]:
    name = str(cfg.hf)
    revisions = [str(r) for r in (cfg.get("hf_revisions") or [])] or [None]
    steps = revision_steps(revisions) if revisions != [None] else [0]
    dtype = cfg.get("dtype")
    subjects = []
    for revision, step in zip(revisions, steps, strict=True):
        subject = Subject(
            label=f"{name}@{revision}" if revision else name,
            step=step,
            kind="",
            model=name,
            revision=revision,
            source="hf",
        )
        subject.load = _loader_for_hf(subject, name, revision, device, dtype)
        subjects.append(subject)
    return subjects


def _loader_for_hf(subject: Subject, name: str, revision, device, dtype) -> Callable[[], Any]:
    def load():
        from repgeom.probes import hf as hf_module

        model = hf_module.load_hf_model(name, revision=revision, device=device, dtype=dtype)
        subject.kind = model.kind
        return model

    return load


# -- probing one subject ----------------------------------------------------------------------


def _probe_subject(cfg: DictConfig, subject: Subject, loaded: Any) -> ProbeOutput:
    seed_cfg = cfg.get("seed")
    if subject.source == "hf":
        seed = 0 if seed_cfg is None else int(seed_cfg)
        settings = _settings(cfg, {}, seed)
        probes, mask = _hf_probe_set(cfg, loaded, seed)
        print(
            f"Probing {subject.label} ({subject.kind}, {loaded.family}): {probes.n_states} "
            f"states from {len(probes.windows)} windows of {probes.windows.shape[1]} tokens"
        )
        from repgeom.probes.hf import hf_capture

        batch_size = int(cfg.batch_size or 16)

        def captures(n_windows: int, positions: torch.Tensor | None, attention: bool):
            for start in range(0, n_windows, batch_size):
                stop = min(start + batch_size, n_windows)
                capture = hf_capture(
                    loaded,
                    probes.windows[start:stop],
                    mask[start:stop],
                    attention=attention,
                    include_special=bool(cfg.include_special),
                )
                if positions is not None:
                    capture.valid = capture.valid & positions[start:stop].to(capture.valid.device)
                yield capture

        with torch.random.fork_rng(devices=[]):
            return measure(
                captures(len(probes.windows), probes.positions, attention=False),
                captures(probes.attention_windows, None, attention=settings.attention),
                settings,
                keep_states=bool(catalogue.select(settings).pairs),
            )

    ckpt = read_checkpoint(subject.path)
    run_dir = _run_dir_of(subject.path)
    trained = training_probe(ckpt, run_dir)
    model = loaded.model
    block_size = model.config.block_size
    seed = int(
        seed_cfg
        if seed_cfg is not None
        else trained.seed
        if trained.seed is not None
        else ckpt["hyper_parameters"].get("seed", 0)
    )
    settings = _settings(cfg, trained.settings, seed)
    recorded = trained.origin != "none"
    n_states = int(cfg.n_states or trained.n_states or DEFAULT_N_STATES)
    per_window = _positions_per_window(cfg, trained.positions_per_window if recorded else None,
                                       default=not recorded)
    attention_windows = int(
        cfg.get("attention_windows") or trained.attention_windows or DEFAULT_ATTENTION_WINDOWS
    )
    batch_size = int(cfg.batch_size or trained.batch_size or 16)
    window = cfg.get("window")
    if window is not None and window != block_size:
        raise ValueError(
            f"window={window}: our checkpoints are probed on windows of their block_size "
            f"({block_size}); leave window unset"
        )
    if not recorded and cfg.get("text_file") is None:
        print(
            f"note: {subject.path} carries no training probe config and its run folder none "
            f"either; probing n_states={n_states}, seed={seed} (numbers need not match a "
            "training probe)"
        )
    if cfg.get("text_file") is None:
        datamodule = _datamodule_for(ckpt, run_dir, block_size, batch_size)
        if datamodule.vocab != loaded.vocab:
            raise ValueError(
                f"{subject.path}: the checkpoint's vocabulary ({loaded.vocab}) differs from its "
                f"data's ({datamodule.vocab}); was the data changed?"
            )
        probes = probe_set(
            datamodule,
            n_states=n_states,
            positions_per_window=per_window,
            attention_windows=attention_windows,
            block_size=block_size,
            seed=seed,
        )
    else:
        all_windows = byte_windows(loaded.vocab, read_text(cfg.text_file), window=block_size)
        wanted = windows_needed(n_states, per_window, block_size)
        windows = all_windows[torch.from_numpy(choose_windows(len(all_windows), wanted, seed))]
        positions = choose_positions(torch.ones(windows.shape, dtype=torch.bool), per_window,
                                     seed)
        probes = ProbeSet(windows, positions, min(attention_windows, len(windows)))
        _note_short(probes.n_states, n_states)
    print(
        f"Probing {subject.label} ({subject.kind}): {probes.n_states} states from "
        f"{len(probes.windows)} windows of {block_size} characters (probe config: "
        f"{trained.origin})"
    )
    return probe_gpt(
        model,
        probes,
        batch_size=batch_size,
        settings=settings,
        keep_states=bool(catalogue.select(settings).pairs),
    )


def _positions_per_window(cfg: DictConfig, trained: int | None, *, default: bool) -> int | None:
    """``positions_per_window``: the command line's (``all``: every position), else the training
    probe's, else (`default`) `DEFAULT_POSITIONS_PER_WINDOW`."""
    value = cfg.get("positions_per_window")
    if value is None:
        return DEFAULT_POSITIONS_PER_WINDOW if default else trained
    if value == "all":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"positions_per_window must be a positive integer, 'all' or null, got {value!r}"
        )
    return value


def _note_short(n_got: int, n_states: int) -> None:
    if n_got < n_states:
        warnings.warn(
            f"the text gives {n_got} states per layer, fewer than n_states={n_states}; "
            "probing all of them",
            stacklevel=3,
        )


def _hf_probe_set(cfg: DictConfig, hf, seed: int) -> tuple[ProbeSet, torch.Tensor]:
    """The probe set of a Hugging Face model's text and the windows' attention mask: random
    positions among each window's tokens (special tokens left out unless include_special)."""
    from repgeom.probes.hf import special_token_ids, tokenize_windows

    text = read_text(cfg.text_file) if cfg.get("text_file") else default_text(cfg.text_source)
    window = cfg.get("window")
    if window is None:
        positions = getattr(hf.model.config, "max_position_embeddings", None)
        window = min(DEFAULT_HF_WINDOW, positions) if positions else DEFAULT_HF_WINDOW
    ids, mask = tokenize_windows(hf, text, window=int(window))
    candidates = mask.bool()
    if not cfg.include_special:
        candidates &= ~torch.isin(ids, torch.tensor(special_token_ids(hf.tokenizer)))
    per_window = _positions_per_window(cfg, None, default=True)
    usable = int(candidates[0].sum())
    n_states = int(cfg.n_states or DEFAULT_N_STATES)
    wanted = math.ceil(n_states / min(per_window or usable, usable))
    chosen = torch.from_numpy(choose_windows(len(ids), wanted, seed))
    positions = choose_positions(candidates[chosen], per_window, seed)
    attention_windows = int(cfg.get("attention_windows") or DEFAULT_ATTENTION_WINDOWS)
    probes = ProbeSet(ids[chosen], positions, min(attention_windows, len(chosen)))
    _note_short(probes.n_states, n_states)
    return probes, mask[chosen]


# -- compare ----------------------------------------------------------------------------------


def text_states(subject: Subject, loaded: Any, text: str, *, include_special: bool):
    """Hidden states of one text at every layer, valid positions only, and its tokens.

    Returns
    -------
    states : list of (T, C) float tensors, layer 0 (embedding) .. L
    tokens : list of str, length T
    """
    if subject.source == "hf":
        from repgeom.probes.hf import hf_capture

        ids = torch.tensor([loaded.tokenizer(text)["input_ids"]])  # (1, T), specials included
        max_positions = getattr(loaded.model.config, "max_position_embeddings", None)
        if max_positions is not None and ids.shape[1] > max_positions:
            raise ValueError(
                f"the text is {ids.shape[1]} tokens, more than {loaded.name}'s {max_positions}"
            )
        capture = hf_capture(loaded, ids, attention=False, include_special=include_special)
        keep = capture.valid[0].cpu()
        tokens = loaded.tokenizer.convert_ids_to_tokens(ids[0][keep].tolist())
    else:
        encoded = loaded.vocab.encode(text.encode("utf-8"))
        block_size = loaded.model.config.block_size
        if len(encoded) > block_size:
            raise ValueError(
                f"the text is {len(encoded)} characters (bytes), more than the model's "
                f"block_size={block_size}; shorten it"
            )
        ids = torch.from_numpy(encoded.astype(np.int64))[None]  # (1, T)
        device = next(loaded.model.parameters()).device
        with torch.no_grad():
            capture = loaded.model.eval().capture(ids.to(device), attention=False)
        keep = torch.ones(ids.shape[1], dtype=torch.bool)
        tokens = [loaded.vocab.decode([i]).decode("utf-8", errors="replace") for i in ids[0]]
    if not keep.any():
        raise ValueError(f"the text {text!r} has no tokens left after removing special tokens")
    states = [h[0][keep.to(h.device)].float().cpu() for h in capture.hidden]
    return states, tokens


def _compare(
    cfg: DictConfig, subject: Subject, loaded: Any, output_dir: Path, *, several: bool
) -> tuple[pd.DataFrame, list[Path]]:
    from repgeom import metrics

    include = bool(cfg.include_special)
    A, tokens_a = text_states(subject, loaded, str(cfg.compare.text_a), include_special=include)
    B, tokens_b = text_states(subject, loaded, str(cfg.compare.text_b), include_special=include)
    pooled = [metrics.pooled_similarity(a, b) for a, b in zip(A, B, strict=True)]
    n = A[-1].shape[0]
    # Cross cosines from the one-text matrix of both texts stacked: rows A, columns B.
    matrix = metrics.token_cosine_matrix(torch.cat([A[-1], B[-1]]))[:n, n:].numpy()
    folder = output_dir / "compare"
    folder.mkdir(parents=True, exist_ok=True)
    suffix = f"_step{subject.step}" if several else ""
    frame = pd.DataFrame(
        {
            "layer": range(len(pooled)),
            "pooled_cosine": pooled,
            "step": subject.step,
            **_id_columns(subject),
            "kind": subject.kind,
        }
    )
    frame.to_csv(folder / f"pooled_cosine{suffix}.csv", index=False)
    pd.DataFrame(
        matrix,
        index=pd.Index([f"{i}:{t}" for i, t in enumerate(tokens_a)], name="text_a_token"),
        columns=[f"{j}:{t}" for j, t in enumerate(tokens_b)],
    ).to_csv(folder / f"token_cosine_last_layer{suffix}.csv")
    fig = plots.compare_texts(pooled, matrix, [*tokens_a, *tokens_b])
    fig.suptitle(f"{subject.label} ({subject.kind})")
    path = folder / f"compare{suffix}.png"
    fig.savefig(path, dpi=plots.DPI, facecolor="white")
    fig.clear()
    return frame, [path]


# -- console, files and W&B -------------------------------------------------------------------


def _console():
    from rich.console import Console

    return Console(width=max(100, int(os.environ.get("COLUMNS", 120))))


def _print_tables(frame: pd.DataFrame, subjects: list[Subject]) -> None:
    from rich.table import Table

    console = _console()
    frame = table.single_set(frame)
    per_layer = table.head_means(frame)
    last = subjects[-1]
    rows = per_layer.loc[per_layer["step"] == last.step]
    shown = [m for m in catalogue.console_metrics() if m in set(rows["metric"])]
    wide = rows.pivot_table(index="layer", columns="metric", values="value")
    out = Table(title=f"{last.label}: {last.kind}, per layer (heads averaged)")
    out.add_column("layer", justify="right")
    for metric in shown:
        out.add_column(metric, justify="right")
    for layer, values in wide.iterrows():
        out.add_row(str(layer), *[_fmt(values.get(m)) for m in shown])
    console.print(out)
    if len(subjects) > 1:
        means = table.layer_means(frame)
        wide = means.pivot_table(index="step", columns="metric", values="value")
        trend = Table(title="mean over blocks 1..L, per step")
        trend.add_column("step", justify="right")
        trend.add_column("checkpoint / revision")
        for metric in shown:
            trend.add_column(metric, justify="right")
        labels = {s.step: s.label for s in subjects}
        for step, values in wide.iterrows():
            trend.add_row(str(step), labels.get(step, ""), *[_fmt(values.get(m)) for m in shown])
        console.print(trend)


def _print_compare(subject: Subject, pooled: pd.DataFrame) -> None:
    from rich.table import Table

    out = Table(title=f"{subject.label} ({subject.kind}): pooled cosine of text A and text B")
    out.add_column("layer", justify="right")
    out.add_column("pooled cosine", justify="right")
    for row in pooled.itertuples(index=False):
        out.add_row(str(row.layer), f"{row.pooled_cosine:.4f}")
    _console().print(out)


def _fmt(value: Any) -> str:
    return "" if value is None or not np.isfinite(value) else f"{value:.4g}"


def _write_info(result: ProbeRunResult, cfg: DictConfig, mode: str) -> None:
    """``probe_info.json``: what was probed, encoder or decoder, at which step."""
    info = {
        "mode": mode,
        "compare": result.compare is not None,
        "subjects": [
            {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(s).items() if k != "load"}
            for s in result.subjects
        ],
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    (result.output_dir / "probe_info.json").write_text(json.dumps(info, indent=2, default=str))


def _wandb_runs(cfg: DictConfig, output_dir: Path, mode: str, subjects: list[Subject]) -> list:
    """The W&B runs of `cfg.logger` (offline unless logged in), with the probe's step axis."""
    if not any(
        str(conf.get("_target_", "")).endswith("WandbLogger")
        for conf in (cfg.get("logger") or {}).values()
    ):
        return []
    from lightning.pytorch.loggers import WandbLogger

    from repgeom.train import build_loggers

    conf = cfg.copy()
    with open_dict(conf):
        conf.logger = {k: v for k, v in cfg.logger.items() if "Wandb" in str(v.get("_target_"))}
        if conf.get("run_name") is None:
            conf.run_name = f"probe-{subjects[0].model.replace('/', '-')}"
    runs = []
    for logger in build_loggers(conf, output_dir):
        if isinstance(logger, WandbLogger):
            run = logger.experiment
            run.define_metric("probe/step")
            run.define_metric("probe/*", step_metric="probe/step")
            run.config.update(
                {"probe_run": OmegaConf.to_container(cfg, resolve=True), "mode": mode},
                allow_val_change=True,
            )
            runs.append(run)
    return runs


def _log_figures(run, paths: Iterable[Path], step: int) -> None:
    import wandb

    images = {f"probe/plots/{p.stem}": wandb.Image(str(p)) for p in paths}
    if images:
        run.log({**images, "probe/step": step})
