"""A Hugging Face model loaded once with its language-model head, for the probe's loss rows.

A decoder-only model is loaded through ``AutoModelForCausalLM``: its base model (what
``AutoModel`` would load, the same weights and forward) is what the probes capture, and its head
turns the captured final states into the next token's probabilities
(`repgeom.probes.core.prediction.lm_loss`). Where the weights hold no head (a folder written by
``save_pretrained`` of a base model whose head is not tied to its embedding) or the family has
no causal-LM class, the base model alone is loaded, as before, and no loss is written.

A bidirectional encoder is loaded through ``AutoModelForMaskedLM`` where its weights hold the
masked-LM head (BERT, RoBERTa as published): its base model is probed, and the loss rows come
from one more forward pass of masked windows
(`repgeom.probes.core.prediction.lm_loss.hf_masked_loss`).
An encoder saved without that head is loaded through ``AutoModel`` as before, silently: most
encoders' base checkpoints have none, and their probe needs none.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch


def load_with_head(name: str, kwargs: dict[str, Any], causal: bool | None) -> tuple[Any, Any]:
    """(base model, model with its head or None): ``AutoModelForCausalLM`` for a decoder
    (`causal`) whose weights hold its head, ``AutoModelForMaskedLM`` for an encoder
    (`causal` False) whose weights hold its masked-LM head, else ``AutoModel`` and None."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

    if causal:
        try:
            full, info = AutoModelForCausalLM.from_pretrained(name, output_loading_info=True,
                                                              **kwargs)
        except ValueError:  # no causal-LM class for this model type
            full = info = None
        if full is not None:
            if not info.get("missing_keys"):
                return full.base_model, full
            warnings.warn(
                f"{name}: its weights hold no language-model head ({sorted(info['missing_keys'])}"
                " missing); probing its base model, without the lm_loss rows", stacklevel=3)
            return full.base_model, None
    if causal is False:
        try:
            full, info = AutoModelForMaskedLM.from_pretrained(name, output_loading_info=True,
                                                              **kwargs)
        except ValueError:  # no masked-LM class for this model type
            full = info = None
        if full is not None and not info.get("missing_keys"):
            return full.base_model, full
    return AutoModel.from_pretrained(name, **kwargs), None


def head_of(full: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The function the causal-LM model applies to its base model's last hidden state: its
    output embedding (``lm_head``, ``embed_out``, ...), soft-capped as Gemma 2 and 3 cap their
    logits where the config says so (``final_logit_softcapping``: cap · tanh(logits / cap))."""
    head = full.get_output_embeddings()
    cap = getattr(full.config, "final_logit_softcapping", None)
    if cap is None:
        return head
    return lambda states: torch.tanh(head(states) / cap) * cap


def check_head(full: Any, head: Callable, final: torch.Tensor, input_ids: torch.Tensor,
               attention_mask: torch.Tensor | None, *, rtol: float = 1e-4) -> str:
    """"" when `head` on the captured final states of one window equals the model's own logits
    (its forward on that window), else why not: the loss rows are then left out, rather than
    written from a head that does something else (a soft cap, a projection, a scale)."""
    with torch.no_grad():
        own = full(input_ids=input_ids[:1], attention_mask=None if attention_mask is None
                   else attention_mask[:1]).logits[0].float()
        ours = head(final[:1].reshape(-1, final.shape[-1])).float()
    if own.shape != ours.shape:
        return f"its logits have shape {tuple(own.shape)}, the head gives {tuple(ours.shape)}"
    keep = slice(None) if attention_mask is None else attention_mask[0].bool().to(own.device)
    error = float((own[keep] - ours[keep]).abs().max())
    scale = float(own[keep].abs().max())
    if not error <= rtol * max(scale, 1.0):
        return f"its head on the captured final states is {error:.3g} off its own logits"
    return ""
