"""Encoder or decoder: read from a Hugging Face config, or found by one tiny forward pass.

The config decides first (``is_decoder``, the family name, then the architecture names such as
``*ForCausalLM`` / ``*ForMaskedLM``); when it says nothing, one tiny forward pass decides: a
decoder's early positions do not change when a later token does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

# Families known by name. Others are told apart by their architecture names or by experiment.
DECODER_FAMILIES = frozenset({"gpt2", "gpt_neox", "bloom", "opt", "llama", "mistral"})
ENCODER_FAMILIES = frozenset({"bert", "roberta", "xlm-roberta-xl"})


def is_decoder_from_config(config: Any) -> bool | None:
    """Decoder (True), encoder (False), or None when the config does not say."""
    if getattr(config, "is_decoder", False):  # e.g. BERT configured as a causal decoder
        return True
    if config.model_type in DECODER_FAMILIES:
        return True
    if config.model_type in ENCODER_FAMILIES:
        return False
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
