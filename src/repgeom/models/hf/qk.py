"""Queries and keys of Hugging Face attention layers, per family: hooks on the projections.

Forward hooks on the attention projections of the families below, split into heads, rotated by
the model's own rotary function where the family uses one, and with grouped-query key heads
repeated to the number of query heads. A "query" is defined so that
``softmax(Q @ K.T / sqrt(D) + mask)`` is exactly the model's attention, with the family's
position bias added to the scores where it has one (T5's relative bias, BLOOM's ALiBi): that
bias is not part of Q or K. The family table and the scaling and bias rules are in
`repgeom.models.hf`'s docstring.
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn


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
    # No position in q or k: BLOOM adds its ALiBi bias to the scores (module docstring).
    return _per_head_fused(out["query_key_value"], attn.head_dim)


def _qk_proj(attn: nn.Module, out: dict) -> tuple[torch.Tensor, torch.Tensor]:
    # Llama/Mistral give k fewer heads than q under grouped-query attention: (B, Hkv, T, D).
    return _heads(out["q_proj"], attn.head_dim), _heads(out["k_proj"], attn.head_dim)


def _qk_t5(attn: nn.Module, out: dict) -> tuple[torch.Tensor, torch.Tensor]:
    D = attn.key_value_proj_dim
    return _heads(out["q"], D), _heads(out["k"], D)


@dataclass(frozen=True)
class _QKFamily:
    attention: tuple[str, ...]  # class names of the self-attention modules, one per layer
    projections: tuple[str, ...]  # their submodules whose outputs are hooked
    split: Callable[[nn.Module, dict], tuple[torch.Tensor, torch.Tensor]]
    rotary: bool = False
    cross: tuple[str, ...] = ()  # attribute names of same-class cross-attention modules, skipped


QK_FAMILIES: dict[str, _QKFamily] = {
    "gpt2": _QKFamily(("GPT2Attention",), ("c_attn",), _qk_gpt2),
    "bert": _QKFamily(("BertSelfAttention",), ("query", "key"), _qk_bert),
    "roberta": _QKFamily(("RobertaSelfAttention",), ("query", "key"), _qk_bert),
    "xlm-roberta-xl": _QKFamily(("XLMRobertaXLSelfAttention",), ("query", "key"), _qk_bert),
    "gpt_neox": _QKFamily(("GPTNeoXAttention",), ("query_key_value",), _qk_neox, rotary=True),
    "bloom": _QKFamily(("BloomAttention",), ("query_key_value",), _qk_bloom),
    "opt": _QKFamily(("OPTAttention",), ("q_proj", "k_proj"), _qk_proj),
    "llama": _QKFamily(("LlamaAttention",), ("q_proj", "k_proj"), _qk_proj, rotary=True),
    "mistral": _QKFamily(("MistralAttention",), ("q_proj", "k_proj"), _qk_proj, rotary=True),
    "t5": _QKFamily(("T5Attention",), ("q", "k"), _qk_t5, cross=("EncDecAttention",)),
}


class QKRecorder:
    """Hooks on every layer's attention projections; `collect()` turns what they saw into Q, K."""

    def __init__(self, model: nn.Module, family: str) -> None:
        self.spec = QK_FAMILIES[family]
        self.layers = [
            m
            for name, m in model.named_modules()
            if type(m).__name__ in self.spec.attention
            and not getattr(m, "is_cross_attention", False)
            and name.rpartition(".")[2] not in self.spec.cross
        ]
        n_layer = model.config.num_hidden_layers
        if len(self.layers) != n_layer:
            raise RuntimeError(
                f"found {len(self.layers)} {'/'.join(self.spec.attention)} modules in a {family} "
                f"model with {n_layer} layers; this transformers version lays {family} out "
                "differently from what repgeom.models.hf expects"
            )
        self.seen: list[dict[str, Any]] = [{} for _ in self.layers]
        self.handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> QKRecorder:
        for attn, seen in zip(self.layers, self.seen, strict=True):
            for name in self.spec.projections:
                self.handles.append(getattr(attn, name).register_forward_hook(_store(seen, name)))
            if self.spec.rotary:
                hook = _store_position_embeddings(seen, inspect.signature(attn.forward))
                self.handles.append(attn.register_forward_pre_hook(hook, with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def collect(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        queries, keys = [], []
        for i, (attn, seen) in enumerate(zip(self.layers, self.seen, strict=True)):
            required = self.spec.projections + (
                ("position_embeddings",) if self.spec.rotary else ()
            )
            missing = [name for name in required if seen.get(name) is None]
            if missing:
                raise RuntimeError(f"layer {i}: the forward pass never reached {missing}")
            q, k = self.spec.split(attn, seen)  # (B, H, T, D), (B, Hkv, T, D)
            if self.spec.rotary:
                cos, sin = seen["position_embeddings"]
                q, k = _rotary_function(attn)(q, k, cos, sin)
            if k.size(1) != q.size(1):  # grouped-query attention, as transformers' repeat_kv
                k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)  # (B, H, T, D)
            # Fold any score scale other than 1/sqrt(D) into Q, so Q K^T / sqrt(D) is the score.
            D = q.size(-1)
            factor = _score_scale(attn, D) * math.sqrt(D)
            if not math.isclose(factor, 1.0, rel_tol=1e-9):
                q = q * factor
            queries.append(q.contiguous())
            keys.append(k.contiguous())
        return queries, keys


def _score_scale(attn: nn.Module, head_dim: int) -> float:
    """What the module multiplies q.k by: ``scaling`` (transformers' attention modules),
    BLOOM's ``inv_norm_factor`` (its ``baddbmm`` alpha), else 1/sqrt(D)."""
    for name in ("scaling", "inv_norm_factor"):
        value = getattr(attn, name, None)
        if value is not None:
            return float(value)
    return head_dim**-0.5


def _store(seen: dict, name: str) -> Callable:
    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        seen[name] = output

    return hook


def _store_position_embeddings(seen: dict, signature: inspect.Signature) -> Callable:
    def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        seen["position_embeddings"] = signature.bind_partial(*args, **kwargs).arguments.get(
            "position_embeddings"
        )

    return hook


def _rotary_function(attn: nn.Module) -> Callable:
    """The family's own ``apply_rotary_pos_emb(q, k, cos, sin)``, from its modeling module."""
    fn = getattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb", None)
    if fn is None:
        raise RuntimeError(f"{type(attn).__module__} has no apply_rotary_pos_emb")
    return fn
