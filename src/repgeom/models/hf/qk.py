"""Queries and keys of Hugging Face attention layers: hooks on the projections, or at the product.

Two ways, by family (`repgeom.models.hf.families.FAMILIES`):

- hooks on the projections (the first ten families: GPT-2 to T5): forward hooks on the
  attention projections the family's record names, split into heads, rotated by the model's
  own rotary function where the family uses one;
- at the product (OLMo 1-3, Qwen2/3, Gemma 1-3, Phi-3, SmolLM3, Falcon): the model is loaded
  with the attention implementation `ATTENTION`, registered with transformers' public
  ``AttentionInterface`` (and the eager mask with ``AttentionMaskInterface``). It is the
  family's own ``eager_attention_forward``, called with the same arguments, that also keeps
  the ``query`` and ``key`` states it receives while a `QKRecorder` is open: after every norm
  (OLMo-2/3's and Qwen3's and Gemma 3's ``q_norm``/``k_norm``), clamp (OLMo's ``clip_qkv``),
  bias (Qwen2), fused-projection split (Phi-3, Falcon) and rotary (none on SmolLM3's NoPE
  layers) the module applies, and with the ``scaling`` it passes (Gemma 2/3's
  ``query_pre_attn_scalar``). The attention probabilities are those of that eager function,
  soft-capped where the model soft-caps (Gemma 2/3's ``softcap``); the cap is applied after the
  product, so it is not part of Q or K.

Either way, grouped-query key heads are repeated to the number of query heads. A "query" is
defined so that ``softmax(Q @ K.T / sqrt(D) + mask)`` is exactly the model's attention (before
any soft-cap), with the family's position bias added to the scores where it has one (T5's
relative bias, BLOOM's and Falcon-RW's ALiBi): that bias is not part of Q or K. The family
table and the scaling and bias rules are in `repgeom.models.hf`'s docstring.
"""

from __future__ import annotations

import inspect
import math
import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from repgeom.models.hf.families import FAMILIES

ATTENTION = "repgeom_eager"
"""The attention implementation of the families read at the product: their own eager attention,
which also hands its query and key to an open `QKRecorder`."""

_OPEN: weakref.WeakKeyDictionary[nn.Module, dict] = weakref.WeakKeyDictionary()
"""Attention module -> what its open `QKRecorder` keeps of its layer."""


def attention_implementation(family: str) -> str:
    """The ``attn_implementation`` a `family` model is loaded with: `ATTENTION` for the families
    read at the product (registered with transformers on first use), else ``"eager"``."""
    record = FAMILIES.get(family)
    if record is None or record.qk is None or not record.qk.at_product:
        return "eager"
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    AttentionInterface.register(ATTENTION, _eager_keeping_qk)
    AttentionMaskInterface.register(ATTENTION, eager_mask)  # the masks eager attention reads
    return ATTENTION


def _eager_keeping_qk(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The module's family's own ``eager_attention_forward``; keeps query (B, H, T, D), key
    (B, Hkv, T, D) and the score scale for an open `QKRecorder`."""
    seen = _OPEN.get(module)
    if seen is not None:
        seen["query"], seen["key"], seen["scaling"] = query, key, kwargs.get("scaling")
    eager = _family_function(module, "eager_attention_forward")
    return eager(module, query, key, value, attention_mask, **kwargs)


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
        if self.spec.at_product and any(attn in _OPEN for attn in self.layers):
            # One record per attention module: a second recorder would take it over and, on
            # leaving, end the first's, whose later forward passes would go unrecorded.
            raise RuntimeError(
                "a QKRecorder is already open on this model; leave it (or collect() from it) "
                "before opening another on the same model"
            )
        for attn, seen in zip(self.layers, self.seen, strict=True):
            if self.spec.at_product:
                seen.clear()
                _OPEN[attn] = seen
            for name in self.spec.projections:
                self.handles.append(getattr(attn, name).register_forward_hook(_store(seen, name)))
            if self.spec.rotary:
                hook = _store_position_embeddings(seen, inspect.signature(attn.forward))
                self.handles.append(attn.register_forward_pre_hook(hook, with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for attn in self.layers:
            _OPEN.pop(attn, None)
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def collect(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        queries, keys = [], []
        for i, (attn, seen) in enumerate(zip(self.layers, self.seen, strict=True)):
            if self.spec.at_product:
                if seen.get("query") is None or seen.get("scaling") is None:
                    raise RuntimeError(
                        f"layer {i}: no query and key reached repgeom's attention function; "
                        f"load the model with load_hf_model, which sets "
                        f"attn_implementation={ATTENTION!r} for this family"
                    )
                q, k, scale = seen["query"], seen["key"], float(seen["scaling"])
            else:
                q, k, scale = self._from_projections(i, attn, seen)
            if k.size(1) != q.size(1):  # grouped-query attention, as transformers' repeat_kv
                k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)  # (B, H, T, D)
            # Fold any score scale other than 1/sqrt(D) into Q, so Q K^T / sqrt(D) is the score.
            D = q.size(-1)
            factor = scale * math.sqrt(D)
            if not math.isclose(factor, 1.0, rel_tol=1e-9):
                q = q * factor
            queries.append(q.contiguous())
            keys.append(k.contiguous())
        return queries, keys

    def _from_projections(self, i: int, attn: nn.Module, seen: dict
                          ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """q (B, H, T, D), k (B, Hkv, T, D) and the score scale of layer `i`, from the hooked
        projections."""
        required = self.spec.projections + (("position_embeddings",) if self.spec.rotary else ())
        missing = [name for name in required if seen.get(name) is None]
        if missing:
            raise RuntimeError(f"layer {i}: the forward pass never reached {missing}")
        q, k = self.spec.split(attn, seen)  # (B, H, T, D), (B, Hkv, T, D)
        if self.spec.rotary:
            cos, sin = seen["position_embeddings"]
            q, k = _family_function(attn, "apply_rotary_pos_emb")(q, k, cos, sin)
        return q, k, _score_scale(attn, q.size(-1))


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


def _family_function(attn: nn.Module, name: str) -> Callable:
    """The family's own `name` (``apply_rotary_pos_emb``, ``eager_attention_forward``), from the
    modeling module of its attention class."""
    fn = getattr(sys.modules[type(attn).__module__], name, None)
    if fn is None:
        raise RuntimeError(f"{type(attn).__module__} has no {name}")
    return fn
