"""The model families repgeom knows, one record each, and encoder or decoder from a config.

A family (``config.model_type``) is one `Family` entry in `FAMILIES`: whether it is a decoder,
and where its queries and keys are: either the projections hooked on its attention modules (how
their outputs split into heads, whether a rotary embedding turns them), or, for the families
added since (OLMo 1-3, Qwen2/3, Gemma 1-3, Phi-3, SmolLM3, Falcon), the query and key states its
attention modules hand to transformers' attention function, after every norm, clamp, bias and
rotary the model applies (`repgeom.models.hf.qk`). Its blocks and final
norm are found by one rule for every family (`repgeom.models.hf.residual`), an encoder-decoder
model's two stacks by another (`repgeom.models.hf.stacks`); the families our checkpoints are
exported as are named in `repgeom.models.export_hf`. Adding a family is one entry here.

Encoder or decoder: the config decides first (``is_decoder``, the family's record, then the
architecture names such as ``*ForCausalLM`` / ``*ForMaskedLM``); when it says nothing, one tiny
forward pass decides: a decoder's early positions do not change when a later token does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

# --------------------------------------------------------------------------------------------
# How each family's projection outputs split into per-head queries and keys (B, H, T, D)


def _heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(B, T, H*D) -> (B, H, T, D)."""
    B, T, _ = x.shape
    return x.view(B, T, -1, head_dim).transpose(1, 2)


def _qk_gpt2(attn: nn.Module, out: dict) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, _ = out["c_attn"].split(attn.split_size, dim=2)  # (B, T, C) each
    return _heads(q, attn.head_dim), _heads(k, attn.head_dim)


def _qk_bert(attn: nn.Module, out: dict) -> tuple[torch.Tensor, torch.Tensor]:
    D = attn.attention_head_size
    return _heads(out["query"], D), _heads(out["key"], D)


def _per_head_fused(qkv: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k of a fused (B, T, 3C) output laid out per head as [q_h | k_h | v_h] (not as
    [q | k | v]): GPT-NeoX's ``view(B, T, H, 3D)``, BLOOM's ``view(B, T, H, 3, D)``."""
    B, T, _ = qkv.shape
    qkv = qkv.view(B, T, -1, 3 * head_dim).transpose(1, 2)  # (B, H, T, 3D)
    q, k, _ = qkv.chunk(3, dim=-1)
    return q, k


def _qk_neox(attn: nn.Module, out: dict) -> tuple[torch.Tensor, torch.Tensor]:
    return _per_head_fused(out["query_key_value"], attn.head_size)


def _qk_bloom(attn: nn.Module, out: dict) -> tuple[torch.Tensor, torch.Tensor]:
    # No position in q or k: BLOOM adds its ALiBi bias to the scores (repgeom.models.hf).
    return _per_head_fused(out["query_key_value"], attn.head_dim)


def _qk_proj(attn: nn.Module, out: dict) -> tuple[torch.Tensor, torch.Tensor]:
    # Llama/Mistral give k fewer heads than q under grouped-query attention: (B, Hkv, T, D).
    return _heads(out["q_proj"], attn.head_dim), _heads(out["k_proj"], attn.head_dim)


def _qk_t5(attn: nn.Module, out: dict) -> tuple[torch.Tensor, torch.Tensor]:
    D = attn.key_value_proj_dim
    return _heads(out["q"], D), _heads(out["k"], D)


# --------------------------------------------------------------------------------------------
# The records


@dataclass(frozen=True)
class QKHooks:
    """Where a family's queries and keys are read (`repgeom.models.hf.qk.QKRecorder`).

    With ``at_product`` they are the ``query`` and ``key`` arguments of the attention function
    the modules call (`repgeom.models.hf.qk.ATTENTION`), and ``projections``, ``split`` and
    ``rotary`` are unused.
    """

    attention: tuple[str, ...]  # class names of the self-attention modules, one per layer
    projections: tuple[str, ...] = ()  # their submodules whose outputs are hooked
    split: Callable[[nn.Module, dict], tuple[torch.Tensor, torch.Tensor]] | None = None
    rotary: bool = False
    cross: tuple[str, ...] = ()  # attribute names of same-class cross-attention modules, skipped
    at_product: bool = False


@dataclass(frozen=True)
class Family:
    """What repgeom knows of one Hugging Face model family.

    name : ``config.model_type``.
    is_decoder : True (causal), False (bidirectional encoder), or None when the config's other
        fields decide (an encoder-decoder family: each stack says, `repgeom.models.hf.stacks`).
    qk : where its queries and keys are; None for a family read without them.
    """

    name: str
    is_decoder: bool | None
    qk: QKHooks | None = None
    encoder_if: str = ""
    """A config flag that, when true, makes a model of this family bidirectional (Gemma 3's
    ``use_bidirectional_attention``: EmbeddingGemma), whatever `is_decoder` says."""


def _family(name: str, is_decoder: bool | None, attention: str, projections: tuple[str, ...],
            split: Callable, **qk: Any) -> Family:
    return Family(name, is_decoder, QKHooks((attention,), projections, split, **qk))


def _at_product(name: str, attention: str, **family: Any) -> Family:
    """A decoder whose queries and keys are read where its attention function receives them."""
    return Family(name, True, QKHooks((attention,), at_product=True), **family)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        _family("gpt2", True, "GPT2Attention", ("c_attn",), _qk_gpt2),
        _family("bert", False, "BertSelfAttention", ("query", "key"), _qk_bert),
        _family("roberta", False, "RobertaSelfAttention", ("query", "key"), _qk_bert),
        _family("xlm-roberta-xl", False, "XLMRobertaXLSelfAttention", ("query", "key"),
                _qk_bert),
        _family("gpt_neox", True, "GPTNeoXAttention", ("query_key_value",), _qk_neox,
                rotary=True),
        _family("bloom", True, "BloomAttention", ("query_key_value",), _qk_bloom),
        _family("opt", True, "OPTAttention", ("q_proj", "k_proj"), _qk_proj),
        _family("llama", True, "LlamaAttention", ("q_proj", "k_proj"), _qk_proj, rotary=True),
        _family("mistral", True, "MistralAttention", ("q_proj", "k_proj"), _qk_proj,
                rotary=True),
        _family("t5", None, "T5Attention", ("q", "k"), _qk_t5, cross=("EncDecAttention",)),
        # Read at the product: what follows the projections differs from family to family
        # (QK-norm, clip_qkv, fused or grouped projections, NoPE layers; docs/probing.md).
        _at_product("olmo", "OlmoAttention"),
        _at_product("olmo2", "Olmo2Attention"),
        _at_product("olmo3", "Olmo3Attention"),
        _at_product("qwen2", "Qwen2Attention"),
        _at_product("qwen3", "Qwen3Attention"),
        _at_product("gemma", "GemmaAttention"),
        _at_product("gemma2", "Gemma2Attention"),
        # Gemma 3's masks follow use_bidirectional_attention (Gemma 1/2's do not: causal).
        _at_product("gemma3_text", "Gemma3Attention", encoder_if="use_bidirectional_attention"),
        _at_product("phi3", "Phi3Attention"),
        _at_product("smollm3", "SmolLM3Attention"),
        _at_product("falcon", "FalconAttention"),
    )
}
"""Every known family by ``config.model_type``. A family not here still gets hidden states and
attention, with a warning (`repgeom.models.hf.capture`)."""


# --------------------------------------------------------------------------------------------
# Encoder or decoder


def is_decoder_from_config(config: Any) -> bool | None:
    """Decoder (True), encoder (False), or None when the config does not say."""
    if getattr(config, "is_decoder", False):  # e.g. BERT configured as a causal decoder
        return True
    family = FAMILIES.get(config.model_type)
    if family is not None and family.encoder_if and getattr(config, family.encoder_if, False):
        return False
    if family is not None and family.is_decoder is not None:
        return family.is_decoder
    architectures = getattr(config, "architectures", None) or []
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures):
        return True
    if any(a.endswith("ForMaskedLM") for a in architectures):
        return False
    return None


@torch.no_grad()
def is_decoder_by_experiment(model: nn.Module) -> bool:
    """Change the last of three tokens: a causal model's first two positions do not move."""
    vocab = model.get_input_embeddings().num_embeddings
    device = next(model.parameters()).device
    ids = torch.tensor([[1, 2, 3], [1, 2, 4]], device=device) % vocab
    h = model(input_ids=ids).last_hidden_state.float()  # (2, 3, C)
    # Rows are computed in one batch, so equal inputs give equal outputs up to rounding.
    return torch.allclose(h[0, :2], h[1, :2], rtol=1e-4, atol=1e-5)
