"""`hf_capture`: the Hugging Face twin of `GPT.capture()`, filling the same `Capture`.

Hidden states (the residual stream before any final norm), the final norm's output, attention
probabilities, queries and keys of one batch; for one stack of an encoder-decoder model
(``HFModel.stack``) everything is that stack's (`repgeom.models.hf.stacks`).
"""

from __future__ import annotations

import contextlib
import warnings

import torch

from repgeom.models.capture import Capture
from repgeom.models.hf.families import FAMILIES
from repgeom.models.hf.loading import HFModel
from repgeom.models.hf.qk import QKRecorder
from repgeom.models.hf.residual import ResidualRecorder
from repgeom.models.hf.stacks import forward_stack
from repgeom.models.hf.windows import special_token_ids


def hf_capture(
    hf: HFModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    attention: bool = True,
    include_special: bool = False,
) -> Capture:
    """Hidden states, queries, keys and attention of a Hugging Face model on a batch.

    For one stack of an encoder-decoder model (``hf.stack``) everything is that stack's: the
    encoder run alone, or the decoder fed the same ids (module docstring), with its
    self-attention only.

    Parameters
    ----------
    hf : HFModel
    input_ids : (B, T) int tensor
    attention_mask : (B, T) tensor, optional
        1 for real tokens, 0 for padding; None means no padding.
    attention : bool
        Also return attention probabilities (B, H, T, T) per layer.
    include_special : bool
        Keep BOS/EOS/CLS/SEP/PAD positions in ``valid`` (excluded by default: they dominate
        some layers). Padding is always excluded.

    Returns
    -------
    Capture
        On the model's device, in its dtype. ``hidden`` is the residual stream before the final
        norm, ``final_norm`` that norm's output (None for post-LN families); see the module
        docstring. ``queries``/``keys`` are empty for families without a record in
        `repgeom.models.hf.families.FAMILIES` (one warning per model, naming those with one).

    Notes
    -----
    On CPU, the first call in a process for a model class, stack and dtype forwards the batch
    twice and keeps the second (`_settle_first_call`): a hook on ``hf.model`` fires twice then.
    """
    input_ids = torch.as_tensor(input_ids)
    if input_ids.dim() != 2 or input_ids.dtype.is_floating_point:
        raise ValueError(
            "input_ids must be a (B, T) integer tensor, "
            f"got {tuple(input_ids.shape)} {input_ids.dtype}"
        )
    if attention_mask is not None:
        attention_mask = torch.as_tensor(attention_mask)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)}, input_ids "
                f"{tuple(input_ids.shape)}; they must match"
            )
    model = hf.model
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    attention_mask = None if attention_mask is None else attention_mask.to(device)

    recorder = QKRecorder(hf.blocks_owner, hf.family) if hf.has_qk else None
    if recorder is None and not hf._warned_qk:
        supported = ", ".join(sorted(f.name for f in FAMILIES.values() if f.qk))
        warnings.warn(
            f"{hf.name}: model family {hf.family!r} has no query/key hooks in repgeom "
            f"(supported: {supported}); hidden-state and attention "
            "metrics run, query/key metrics are skipped",
            stacklevel=2,
        )
        hf._warned_qk = True

    residual = _residual_recorder(hf)
    was_training = model.training
    model.eval()
    try:
        _settle_first_call(hf, input_ids, attention_mask, attention)
        with torch.no_grad(), residual or contextlib.nullcontext():
            if recorder is not None:
                with recorder:
                    states, attentions = forward_stack(hf, input_ids, attention_mask, attention)
                queries, keys = recorder.collect()
            else:
                states, attentions = forward_stack(hf, input_ids, attention_mask, attention)
                queries, keys = [], []
    finally:
        model.train(was_training)
    if residual is None:
        hidden, final_norm = list(states), None
    else:
        # Hugging Face's hidden_states: the embedding output and each block's input; its last
        # entry is the final norm's output in pre-LN models, so it becomes the last block's.
        last_block, final_norm = residual.collect()
        hidden = [*states[:-1], last_block]

    valid = torch.ones_like(input_ids, dtype=torch.bool)  # (B, T)
    if attention_mask is not None:
        valid &= attention_mask.bool()
    special = special_token_ids(hf.tokenizer)
    if not include_special and special:
        valid &= ~torch.isin(input_ids, torch.tensor(special, device=device))
    return Capture(
        hidden=hidden,
        final_norm=final_norm,
        queries=queries,
        keys=keys,
        attention=list(attentions) if attention else [],
        causal=hf.is_decoder,
        valid=valid,
    )


_SETTLED: set[tuple[str, str | None, torch.dtype]] = set()
"""(model class, stack, dtype) whose first CPU forward in this process has been run."""


def _settle_first_call(hf: HFModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                       attention: bool) -> None:
    """Run a model's first CPU forward of the process once and throw it away.

    On CPU, the first forward of a process sometimes rounds differently from every later one:
    in a GPT-2 (``gelu_new``) forward, the first ``torch.tanh`` (MKL's VML ``vsTanh``, which
    PyTorch calls from its parallel loop) gave other last bits in about 1 process of 10 on a
    loaded 2-core machine, with the same input bytes; in those processes the second call gave
    the reference bits, and 1,500 repeats inside one process never differed. A probe table of a
    process's first model then differed from another process's (a few values by 1e-5 relative,
    and near-duplicate states counted apart, which moved GRIDE by ~1%). Why the first call is
    not established; Intel documents MKL's results as reproducible run to run only under
    conditions (its "Reproducibility Conditions"), thread timing plausibly among them. With this,
    0 of 29 `probe.py` processes gave another table, against 3 of 29 without it, side by side.
    Keyed by model class, stack and dtype, each of which runs other kernels. Costs one
    micro-batch per key and process (on CPU only, where it was seen; no GPU was tried).
    """
    key = (type(hf.model).__name__, hf.stack, next(hf.model.parameters()).dtype)
    if key in _SETTLED or input_ids.device.type != "cpu":
        return
    with torch.no_grad():
        forward_stack(hf, input_ids, attention_mask, attention)
    _SETTLED.add(key)


def _residual_recorder(hf: HFModel) -> ResidualRecorder | None:
    """The hooks reading the residual stream; None (one warning) for an unknown family whose
    blocks or final norm cannot be located, such as ALBERT's shared layer groups."""
    try:
        return ResidualRecorder(hf.blocks_owner)
    except RuntimeError as error:
        if hf.family in FAMILIES:
            raise
        if not hf._warned_layout:
            warnings.warn(
                f"{hf.name}: {error}; its hidden states are taken as Hugging Face returns them "
                "(for a pre-LN model the last one is after the final norm) and no final_norm "
                "layer is measured",
                stacklevel=3,
            )
            hf._warned_layout = True
        return None
