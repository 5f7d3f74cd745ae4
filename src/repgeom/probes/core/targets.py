"""What the probe reads: our GPT on a probe set, and probe.py's two kinds of target.

`probe_gpt` is the one function that runs our GPT on a probe set and measures it, for the
training callback and for probe.py's checkpoints alike. `CheckpointTarget` (ours) and
`HFTarget` (Hugging Face) share one interface: ``load(device)``, ``probe(request, loaded)`` (the
probe set, captures and `measure`) and ``id_columns()`` (the table's ``model``/``revision``);
compare mode reads one text of the loaded model with `repgeom.models.text_states`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch

from repgeom.models.capture import Capture
from repgeom.models.checkpoints import (
    load_gpt,
    read_checkpoint,
    run_dir_of,
    validation_windows_for,
)
from repgeom.probes.core import catalogue
from repgeom.probes.core.measure import ProbeOutput, ProbeSettings, measure
from repgeom.probes.core.prediction import lm_loss
from repgeom.probes.core.prediction.lm_loss import Masking
from repgeom.probes.core.prediction.tokens import TokenStates
from repgeom.probes.core.sampling import ProbeSet, WindowPool, draw, probe_set
from repgeom.probes.core.spec import ProbeRequest, ProbeSpec, resolve, training_probe
from repgeom.probes.core.texts import byte_windows, default_text, read_text

T = TypeVar("T")

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


class Stopwatch:
    """Seconds spent inside an iterator's ``next`` (the forward passes of lazy captures)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def timed(self, items: Iterable[T]) -> Iterator[T]:
        iterator = iter(items)
        while True:
            started = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                return
            finally:
                self.seconds += time.perf_counter() - started
            yield item


def probe_gpt(
    model: torch.nn.Module,
    probes: ProbeSet,
    *,
    batch_size: int,
    settings: ProbeSettings,
    keep_states: bool = False,
    masking: Masking | None = None,
) -> ProbeOutput:
    """`measure` our GPT on a probe set: eval mode, no gradients, the caller's RNG untouched.

    The states come from the sampled positions of every window (`GPT.capture_positions`: no
    attention materialised, causal windows cut after their last sampled position, the last
    block run at the sampled rows only); attention and Q/K from the first
    `probes.attention_windows` windows, whole. The ``lm_loss`` and ``bpc`` rows
    (`repgeom.probes.core.prediction.lm_loss`): a decoder's from the head on the captured final
    states,
    an encoder's from one more forward pass of the windows masked as `masking` says (none
    without it).
    """
    was_training = model.training
    device = next(model.parameters()).device
    model.eval()
    devices = [device] if device.type == "cuda" else []
    whole = probes.windows[: probes.attention_windows]
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            # each window only up to its last sampled position where the model is causal
            clock = Stopwatch()
            started = time.perf_counter()
            states = [model.capture_positions(probes.windows, probes.positions,
                                              batch_size=batch_size)]
            tokens = None
            if model.config.causal:  # the head on the final states: no forward pass
                tokens = lm_loss.gpt_state_loss(model, states[0], probes.windows,
                                                probes.positions)
            elif masking is not None:
                tokens = lm_loss.gpt_masked_loss(model, probes.windows, masking,
                                                 seed=settings.seed, batch_size=batch_size)
            clock.seconds += time.perf_counter() - started
            attention = clock.timed(gpt_captures(
                model, whole, None, batch_size=batch_size, attention=settings.attention
            ))
            output = measure(states, attention, settings, keep_states=keep_states)
            if tokens is not None:
                output.rows += tokens.rows()
                output.tokens = tokens
            _finish_output(output, probes, settings)
            output.forward_seconds = clock.seconds
            return output
    finally:
        model.train(was_training)


def _finish_output(output: ProbeOutput, probes: ProbeSet, settings: ProbeSettings) -> None:
    """The probe set's texts (`ProbeOutput.texts`), and the per-token values
    (`tokens.TokenStates`) where ``settings.per_token`` asks: the states' surprisals where the
    loss was read at them (decoders), their local IDs."""
    output.texts = probes.texts
    if not settings.per_token:
        return
    loss = output.tokens
    surprisal = loss.surprisal if loss is not None and loss.per_state else None
    output.token_states = TokenStates.of(probes.positions, probes.windows, surprisal,
                                         output.local_ids, output.layer_names)


# ---------------------------------------------------------------------------------------------
# probe.py's targets: one class per kind of model, one interface (load, probe, id_columns)


def checkpoint_spec(request: ProbeRequest, path: Path, ckpt: dict) -> tuple[ProbeSpec, str]:
    """The resolved spec of checkpoint `path` (read as `ckpt`): `request`, then its training
    probe's spec, then the defaults; the seed falls back to the run's training seed. Also where
    the training probe's spec was found (`training_probe`)."""
    trained, origin = training_probe(ckpt, run_dir_of(path))
    seed = ckpt["hyper_parameters"].get("seed", ProbeSpec.seed)
    return resolve(request, trained, seed=seed), origin


def checkpoint_probe_set(path: Path, ckpt: dict, vocab, block_size: int,
                         spec: ProbeSpec) -> ProbeSet:
    """The probe set drawn from the validation data of checkpoint `path` (read as `ckpt`), as
    the training probe drew it given its spec."""
    validation = validation_windows_for(ckpt, run_dir_of(path), block_size)
    if validation.vocab != vocab:
        raise ValueError(
            f"{path}: the checkpoint's vocabulary ({vocab}) differs from its data's "
            f"({validation.vocab}); was the data changed?"
        )
    return probe_set(validation, spec)


def checkpoint_masking(ckpt: dict, vocab) -> Masking | None:
    """How an encoder checkpoint's validation masked its windows (None for a decoder)."""
    hparams = ckpt["hyper_parameters"]
    masking = hparams.get("masking") or {}
    if masking.get("causal", True):
        return None
    return Masking.of(vocab, masking)


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
    reference: bool = False  # probed for its states only (`HFTarget.reference`)
    stack: ClassVar[str | None] = None  # our models have one stack of layers (`HFTarget.stack`)

    def __post_init__(self) -> None:
        self.label = self.label or f"{self.path.stem} (step {self.step})"
        self.model = self.model or run_dir_of(self.path).name

    def id_columns(self) -> dict[str, Any]:
        return {"model": self.model}

    def load(self, device: torch.device):
        loaded = load_gpt(self.path, device)
        self.kind = "decoder" if loaded.model.config.causal else "encoder"
        return loaded

    def probe(self, request: ProbeRequest, loaded: Any) -> ProbeOutput:
        """`probe_gpt` on the training probe's probe set (or `request.text_file`'s windows)."""
        ckpt = read_checkpoint(self.path)
        spec, origin = checkpoint_spec(request, self.path, ckpt)
        block_size = loaded.model.config.block_size
        if request.window is not None and request.window != block_size:
            raise ValueError(
                f"window={request.window}: our checkpoints are probed on windows of their "
                f"block_size ({block_size}); leave window unset"
            )
        if request.text_file is None:
            if origin == "none":
                print(
                    f"note: {self.path} carries no training probe config and its run folder "
                    f"none either; probing n_states={spec.n_states}, seed={spec.seed} (numbers "
                    "need not match a training probe)"
                )
            probes = checkpoint_probe_set(self.path, ckpt, loaded.vocab, block_size, spec)
        else:
            windows = byte_windows(loaded.vocab, read_text(request.text_file), window=block_size)
            probes = draw(WindowPool.of_windows(windows), spec)
        print(
            f"Probing {self.label} ({self.kind}): {probes.n_states} states from "
            f"{len(probes.windows)} windows of {block_size} characters (probe config: "
            f"{origin})"
        )
        settings = spec.probe_settings()
        return probe_gpt(
            loaded.model,
            probes,
            batch_size=spec.batch_size,
            settings=settings,
            keep_states=bool(catalogue.select(settings).pairs),
            masking=checkpoint_masking(ckpt, loaded.vocab),
        )


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
    files: str | None = None
    """The folder of this revision's files when the trajectory loop fetched them
    (`repgeom.models.hub.downloads`); None: ``from_pretrained`` fetches them itself."""
    reference: bool = False
    """Probed for its states only, and none of its rows written: the final revision that a
    shard of a trajectory (``shard=``) compares its own revisions with when another shard owns
    it."""
    retry_budget_s: float | None = None
    """Seconds of hub retries allowed for what the load itself fetches (a hub config, a hub
    ``tokenizer``): the run's ``retry_budget_s=``; None: the default."""

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
            self.files or self.name,  # the revision's files where the trajectory fetched them
            revision=None if self.files else self.revision,
            device=device,
            dtype=self.dtype,
            tokenizer=self.tokenizer,
            stack=self.stack,
            retry_budget_s=self.retry_budget_s,
        )
        self.kind = model.kind
        return model

    def probe(self, request: ProbeRequest, loaded: Any) -> ProbeOutput:
        """`measure` on random positions of the text's windows (special tokens left out)."""
        from repgeom.models.hf import hf_capture
        from repgeom.models.hf.windows import sliding_window_warning

        spec = resolve(request)
        settings = spec.probe_settings()
        probes = hf_probe_set(loaded, request, spec)
        print(
            f"Probing {self.label} ({self.kind}, {loaded.family}): {probes.n_states} "
            f"states from {len(probes.windows)} windows of {probes.windows.shape[1]} tokens"
        )

        slid = sliding_window_warning(loaded, int(probes.windows.shape[1]))
        if slid:
            warnings.warn(slid, stacklevel=2)
        loss = lm_loss.HFLoss.of(loaded)

        def captures(n_windows: int, positions: torch.Tensor | None, attention: bool):
            for start in range(0, n_windows, spec.batch_size):
                stop = min(start + spec.batch_size, n_windows)
                capture = hf_capture(
                    loaded,
                    probes.windows[start:stop],
                    probes.attention_mask[start:stop],
                    attention=attention,
                    include_special=request.include_special,
                )
                if positions is not None:
                    capture.valid = capture.valid & positions[start:stop].to(capture.valid.device)
                    if loss is not None:  # the head on this batch's final states
                        loss.add(capture, probes.windows[start:stop],
                                 probes.attention_mask[start:stop],
                                 None if probes.characters is None
                                 else probes.characters[start:stop])
                yield capture

        clock = Stopwatch()
        with torch.random.fork_rng(devices=[]):
            output = measure(
                clock.timed(captures(len(probes.windows), probes.positions, attention=False)),
                clock.timed(captures(probes.attention_windows, None,
                                     attention=settings.attention)),
                settings,
                keep_states=bool(catalogue.select(settings).pairs),
            )
        if loss is not None:
            output.warnings += loss.warnings
            tokens = loss.result()
        else:  # an encoder with its masked-LM head: one more forward pass, masked windows
            started = time.perf_counter()
            tokens, why = lm_loss.hf_masked_loss(
                loaded, probes.windows, probes.attention_mask, probes.characters,
                seed=settings.seed, batch_size=spec.batch_size)
            clock.seconds += time.perf_counter() - started
            output.warnings += [why] if why else []
        output.forward_seconds = clock.seconds
        output.warnings += [slid] if slid else []
        if tokens is not None:
            output.rows += tokens.rows()
            output.tokens = tokens
        _finish_output(output, probes, settings)
        return output


def hf_probe_set(hf: Any, request: ProbeRequest, spec: ProbeSpec) -> ProbeSet:
    """The probe set of a Hugging Face model's text (`request.text_file`, else the
    `request.text_source`) in windows of `request.window` tokens (else the protocol's, at most
    the model's positions): random positions among each window's tokens, special tokens left out
    unless `request.include_special`; the windows' attention mask comes with it."""
    from repgeom.models.hf import special_token_ids, tokenize_windows
    from repgeom.models.hf.windows import DEFAULT_WINDOW, default_window, window_characters

    text = read_text(request.text_file) if request.text_file else default_text(
        request.text_source)
    window = request.window
    if window is None:
        window = default_window(hf, PROTOCOL_HF_WINDOW.get(spec.protocol, DEFAULT_WINDOW))
    ids, mask = tokenize_windows(hf, text, window=int(window))
    candidates = mask.bool()
    special = tuple(int(i) for i in special_token_ids(hf.tokenizer))
    if not request.include_special:
        candidates &= ~torch.isin(ids, torch.tensor(special, dtype=ids.dtype))

    def take(chosen: np.ndarray):
        index = torch.from_numpy(chosen)
        return ids[index], candidates[index], mask[index]

    characters = window_characters(hf, text, window=int(window))
    return draw(WindowPool(len(ids), int(candidates[0].sum()), take, special, characters), spec)
