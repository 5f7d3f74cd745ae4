"""What the probe reads: our GPT on a probe set, and probe.py's two kinds of target.

`probe_gpt` is the one function that runs our GPT on a probe set and measures it, for the
training callback and for probe.py's checkpoints alike. `CheckpointTarget` (ours) and
`HFTarget` (Hugging Face) share one interface: ``load(device)``, ``probe(cfg, loaded)`` (the
probe set, captures and `measure`), ``text_states(loaded, text)`` (compare mode) and
``id_columns()`` (the table's ``model``/``revision``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from repgeom.data.datamodule import choose_windows
from repgeom.models.capture import Capture
from repgeom.models.checkpoints import datamodule_for, load_charlm, read_checkpoint, run_dir_of
from repgeom.probes import catalogue
from repgeom.probes.measure import ProbeOutput, ProbeSettings, measure
from repgeom.probes.sampling import (
    DEFAULT_ATTENTION_WINDOWS,
    DEFAULT_N_STATES,
    DEFAULT_POSITIONS_PER_WINDOW,
    ProbeSet,
    choose_positions,
    fit_to_text,
    probe_set,
)
from repgeom.probes.spec import training_probe
from repgeom.probes.texts import byte_windows, default_text, read_text

DEFAULT_HF_WINDOW = 256
"""Tokens per window of a Hugging Face model (at most its positions) unless window= says."""
PROTOCOL_HF_WINDOW = {"llm_microscope": 512}
"""Protocols whose windows differ (conf/protocol/): the Shape of Learning authors' 512-token
chunks."""


def gpt_captures(
    model: torch.nn.Module,
    windows: torch.Tensor,
    valid: torch.Tensor | None,
    *,
    batch_size: int,
    attention: bool,
) -> Iterator[Capture]:
    """`model.capture()` on micro-batches of `batch_size` windows, with their `valid` rows."""
    device = next(model.parameters()).device
    for start in range(0, len(windows), batch_size):
        ids = windows[start : start + batch_size].to(device)
        capture: Capture = model.capture(ids, attention=attention)
        if valid is not None:
            capture.valid = valid[start : start + batch_size]
        yield capture


def probe_gpt(
    model: torch.nn.Module,
    probes: ProbeSet,
    *,
    batch_size: int,
    settings: ProbeSettings,
    keep_states: bool = False,
) -> ProbeOutput:
    """`measure` our GPT on a probe set: eval mode, no gradients, the caller's RNG untouched.

    The states come from the sampled positions of every window (`GPT.capture_positions`: no
    attention materialised, causal windows cut after their last sampled position, the last
    block run at the sampled rows only); attention and Q/K from the first
    `probes.attention_windows` windows, whole.
    """
    was_training = model.training
    device = next(model.parameters()).device
    model.eval()
    devices = [device] if device.type == "cuda" else []
    whole = probes.windows[: probes.attention_windows]
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            # each window only up to its last sampled position where the model is causal
            states = [model.capture_positions(probes.windows, probes.positions,
                                              batch_size=batch_size)]
            attention = gpt_captures(
                model, whole, None, batch_size=batch_size, attention=settings.attention
            )
            return measure(states, attention, settings, keep_states=keep_states)
    finally:
        model.train(was_training)


# ---------------------------------------------------------------------------------------------
# probe.py's targets: one class per kind of model, one interface (load, probe, text_states)


def probe_settings(cfg: DictConfig, base: dict[str, Any], seed: int) -> ProbeSettings:
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


@dataclass
class CheckpointTarget:
    """A checkpoint of ours, probed as the training probe did (its `ProbeSpec`, its data).

    ``load`` is called only when the target is probed, so a run with many checkpoints holds one
    model in memory at a time.
    """

    path: Path
    step: int
    label: str = ""
    model: str = ""  # the `model` column: the run folder's name
    kind: str = ""  # "decoder" or "encoder", known once loaded
    source: str = "ours"
    stack: ClassVar[str | None] = None  # our models have one stack of layers (`HFTarget.stack`)

    def __post_init__(self) -> None:
        self.label = self.label or f"{self.path.stem} (step {self.step})"
        self.model = self.model or run_dir_of(self.path).name

    def id_columns(self) -> dict[str, Any]:
        return {"model": self.model}

    def load(self, device: torch.device):
        module = load_charlm(self.path, device)
        self.kind = "decoder" if module.model.config.causal else "encoder"
        return module

    def probe(self, cfg: DictConfig, loaded: Any) -> ProbeOutput:
        """`probe_gpt` on the training probe's probe set (or `cfg.text_file`'s windows)."""
        ckpt = read_checkpoint(self.path)
        run_dir = run_dir_of(self.path)
        trained = training_probe(ckpt, run_dir)
        model = loaded.model
        block_size = model.config.block_size
        options = probe_set_options(cfg, trained, ckpt)
        seed, n_states = options["seed"], options["n_states"]
        per_window = options["positions_per_window"]
        attention_windows, batch_size = options["attention_windows"], options["batch_size"]
        settings = probe_settings(cfg, trained.settings, seed)
        recorded = trained.origin != "none"
        window = cfg.get("window")
        if window is not None and window != block_size:
            raise ValueError(
                f"window={window}: our checkpoints are probed on windows of their block_size "
                f"({block_size}); leave window unset"
            )
        if not recorded and cfg.get("text_file") is None:
            print(
                f"note: {self.path} carries no training probe config and its run folder none "
                f"either; probing n_states={n_states}, seed={seed} (numbers need not match a "
                "training probe)"
            )
        if cfg.get("text_file") is None:
            probes = checkpoint_probe_set(self.path, ckpt, loaded.vocab, block_size,
                                          **options)
        else:
            all_windows = byte_windows(loaded.vocab, read_text(cfg.text_file), window=block_size)
            wanted, per_window = fit_to_text(n_states, per_window, len(all_windows), block_size)
            windows = all_windows[torch.from_numpy(choose_windows(len(all_windows), wanted, seed))]
            positions = choose_positions(torch.ones(windows.shape, dtype=torch.bool), per_window,
                                         seed)
            probes = ProbeSet(windows, positions, min(attention_windows, len(windows)))
            _note_short(probes.n_states, n_states)
        print(
            f"Probing {self.label} ({self.kind}): {probes.n_states} states from "
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

    def text_states(self, loaded: Any, text: str, *, include_special: bool):
        """Hidden states of one text at every layer and its characters (`HFTarget.text_states`)."""
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


@dataclass
class HFTarget:
    """A Hugging Face model (hub name or folder) at one revision, or one stack of it.

    An encoder-decoder model (T5, ByT5) is two targets, ``stack="encoder"`` and
    ``stack="decoder"`` (`repgeom.models.hf.model_stacks`), whose ``model`` column is
    ``<name>:encoder`` and ``<name>:decoder``. ``tokenizer`` is where the tokenizer comes from
    when the model's folder has none (`repgeom.models.hf.load_tokenizer_or_explain`).
    """

    name: str
    revision: str | None
    step: int
    dtype: str | None = None
    kind: str = ""
    source: str = "hf"
    tokenizer: str | None = None
    stack: str | None = None
    alias: str = ""  # the `model` column when not `name` (probe.py's model_name=)

    @property
    def model(self) -> str:
        shown = self.alias or self.name
        return f"{shown}:{self.stack}" if self.stack else shown

    @property
    def label(self) -> str:
        return f"{self.model}@{self.revision}" if self.revision else self.model

    def id_columns(self) -> dict[str, Any]:
        return {"model": self.model, "revision": self.revision}

    def load(self, device: torch.device):
        from repgeom.models import hf as hf_module

        model = hf_module.load_hf_model(
            self.name,
            revision=self.revision,
            device=device,
            dtype=self.dtype,
            tokenizer=self.tokenizer,
            stack=self.stack,
        )
        self.kind = model.kind
        return model

    def probe(self, cfg: DictConfig, loaded: Any) -> ProbeOutput:
        """`measure` on random positions of the text's windows (special tokens left out)."""
        seed_cfg = cfg.get("seed")
        seed = 0 if seed_cfg is None else int(seed_cfg)
        settings = probe_settings(cfg, {}, seed)
        probes, mask = _hf_probe_set(cfg, loaded, seed)
        print(
            f"Probing {self.label} ({self.kind}, {loaded.family}): {probes.n_states} "
            f"states from {len(probes.windows)} windows of {probes.windows.shape[1]} tokens"
        )
        from repgeom.models.hf import hf_capture

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

    def text_states(self, loaded: Any, text: str, *, include_special: bool):
        """Hidden states of one text at every layer, valid positions only, and its tokens.

        Returns
        -------
        states : list of (T, C) float tensors, layer 0 (embedding) .. L
        tokens : list of str, length T
        """
        from repgeom.models.hf import hf_capture

        ids = torch.tensor([loaded.tokenizer(text)["input_ids"]])  # (1, T), specials included
        max_positions = getattr(loaded.model.config, "max_position_embeddings", None)
        if max_positions is not None and ids.shape[1] > max_positions:
            raise ValueError(
                f"the text is {ids.shape[1]} tokens, more than {loaded.name}'s {max_positions}"
            )
        capture = hf_capture(loaded, ids, attention=False, include_special=include_special)
        keep = capture.valid[0].cpu()
        tokens = loaded.tokenizer.convert_ids_to_tokens(ids[0][keep].tolist())
        if not keep.any():
            raise ValueError(f"the text {text!r} has no tokens left after removing special tokens")
        states = [h[0][keep.to(h.device)].float().cpu() for h in capture.hidden]
        return states, tokens


def probe_set_options(cfg: Mapping[str, Any], trained, ckpt: dict) -> dict[str, Any]:
    """The probe set's options for a checkpoint: `cfg`'s (probe.py's command line), else the
    training probe's (`trained`, from `training_probe`), else the defaults of
    `repgeom.probes.sampling`; the seed falls back to the run's training seed."""
    recorded = trained.origin != "none"
    seed = cfg.get("seed")
    if seed is None:
        seed = trained.seed
    if seed is None:
        seed = ckpt["hyper_parameters"].get("seed", 0)
    return {
        "seed": int(seed),
        "n_states": int(cfg.get("n_states") or trained.n_states or DEFAULT_N_STATES),
        "positions_per_window": _positions_per_window(
            cfg, trained.positions_per_window if recorded else None, default=not recorded),
        "attention_windows": int(
            cfg.get("attention_windows") or trained.attention_windows or DEFAULT_ATTENTION_WINDOWS
        ),
        "batch_size": int(cfg.get("batch_size") or trained.batch_size or 16),
    }


def checkpoint_probe_set(path: Path, ckpt: dict, vocab, block_size: int, *, seed: int,
                         n_states: int, positions_per_window: int | None,
                         attention_windows: int, batch_size: int) -> ProbeSet:
    """The probe set drawn from the validation data of checkpoint `path` (read as `ckpt`), as
    the training probe drew it given its options (`probe_set_options`)."""
    datamodule = datamodule_for(ckpt, run_dir_of(path), block_size, batch_size)
    if datamodule.vocab != vocab:
        raise ValueError(
            f"{path}: the checkpoint's vocabulary ({vocab}) differs from its data's "
            f"({datamodule.vocab}); was the data changed?"
        )
    return probe_set(
        datamodule,
        n_states=n_states,
        positions_per_window=positions_per_window,
        attention_windows=attention_windows,
        block_size=block_size,
        seed=seed,
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
    from repgeom.models.hf import special_token_ids, tokenize_windows

    text = read_text(cfg.text_file) if cfg.get("text_file") else default_text(cfg.text_source)
    window = cfg.get("window")
    if window is None:
        positions = getattr(hf.model.config, "max_position_embeddings", None)
        default = PROTOCOL_HF_WINDOW.get(str(cfg.get("protocol")), DEFAULT_HF_WINDOW)
        window = min(default, positions) if positions else default
    ids, mask = tokenize_windows(hf, text, window=int(window))
    candidates = mask.bool()
    if not cfg.include_special:
        candidates &= ~torch.isin(ids, torch.tensor(special_token_ids(hf.tokenizer)))
    usable = int(candidates[0].sum())
    n_states = int(cfg.n_states or DEFAULT_N_STATES)
    wanted, per_window = fit_to_text(
        n_states, _positions_per_window(cfg, None, default=True), len(ids), usable
    )
    chosen = torch.from_numpy(choose_windows(len(ids), wanted, seed))
    positions = choose_positions(candidates[chosen], per_window, seed)
    attention_windows = int(cfg.get("attention_windows") or DEFAULT_ATTENTION_WINDOWS)
    probes = ProbeSet(ids[chosen], positions, min(attention_windows, len(chosen)))
    _note_short(probes.n_states, n_states)
    return probes, mask[chosen]
