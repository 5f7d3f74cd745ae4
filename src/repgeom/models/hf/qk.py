"""Queries and keys of Hugging Face attention layers: hooks on the projections.

Forward hooks on the attention projections that each family's record names
(`repgeom.models.hf.families.FAMILIES`), split into heads, rotated by
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
from typing import Any

import torch
import torch.nn as nn

from repgeom.models.hf.families import FAMILIES


class QKRecorder:
    """Hooks on every layer's attention projections; `collect()` turns what they saw into Q, K."""

    def __init__(self, model: nn.Module, family: str) -> None:
        self.spec = FAMILIES[family].qk
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
