"""The two stacks of an encoder-decoder model (T5, ByT5), each run as a model of its own.

- the encoder: ``model.encoder`` alone on the text's windows, bidirectional;
- the decoder: the whole model with the same window as ``input_ids`` and as
  ``decoder_input_ids`` (not shifted right behind a start token), so the decoder reads the text
  causally while its cross-attention reads the encoder's states of that same window. This keeps
  the two stacks' rows on the same tokens and positions (the same probe set, special tokens and
  padding masks), and position t of the decoder holds token t as input, as in a decoder-only
  model. It is a reconstruction setting, not T5's span-corruption pre-training task: the
  decoder can read the whole window through cross-attention, so it is causal in its own
  self-attention only.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

STACKS = ("encoder", "decoder")
"""The two stacks of an encoder-decoder model, probed as two models in this order."""


def forward_stack(
    hf: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, attention: bool
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None]:
    """One forward pass of the probed stack: (hidden states, self-attention probabilities).

    For the stacks of an encoder-decoder model (`repgeom.models.hf.capture.hf_capture`): the
    encoder alone on the text; the decoder on the same text as ``decoder_input_ids`` (same
    mask), cross-attending to the encoder's output of the same window. Its cross-attention
    probabilities are not returned.
    """
    model = hf.model
    kwargs: dict[str, Any] = {"output_hidden_states": True, "output_attentions": attention}
    if "use_cache" in inspect.signature(model.forward).parameters:
        kwargs["use_cache"] = False  # a decoder would otherwise keep every layer's keys and values
    if hf.stack == "encoder":
        kwargs.pop("use_cache", None)
        out = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        return out.hidden_states, out.attentions
    if hf.stack == "decoder":
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=input_ids,
            decoder_attention_mask=attention_mask,
            **kwargs,
        )
        return out.decoder_hidden_states, out.decoder_attentions
    out = model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    return out.hidden_states, out.attentions
