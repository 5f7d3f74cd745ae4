"""`repgeom.models.hf.stacks`: an encoder-decoder model (T5) probed as two models, one per stack."""

from __future__ import annotations

import math

import pytest
import torch
from hf_cases import padded_batch

from repgeom.models.hf import hf_capture, load_hf_model

# --------------------------------------------------------------------------------------------
# Encoder-decoder models: two stacks, two models


@pytest.fixture(scope="module")
def t5_stacks(tiny_hf_folder):
    folder = tiny_hf_folder("t5")
    return {stack: load_hf_model(folder, stack=stack) for stack in ("encoder", "decoder")}


def test_t5_is_two_models(tiny_hf_folder, t5_stacks):
    from repgeom.models.hf import model_stacks

    folder = tiny_hf_folder("t5")
    assert model_stacks(folder) == ("encoder", "decoder")
    assert model_stacks(tiny_hf_folder("gpt2")) == (None,)
    with pytest.raises(ValueError, match=r"encoder-decoder model \(t5\); pass stack='encoder'"):
        load_hf_model(folder)
    with pytest.raises(ValueError, match="has one stack of layers; pass stack=None"):
        load_hf_model(tiny_hf_folder("gpt2"), stack="encoder")
    assert {s: (hf.kind, hf.is_decoder) for s, hf in t5_stacks.items()} == {
        "encoder": ("encoder", False), "decoder": ("decoder", True)}


def test_t5_stacks_match_the_model_outputs(t5_stacks, tiny_text):
    enc, dec = t5_stacks["encoder"], t5_stacks["decoder"]
    ids, mask = padded_batch(enc, tiny_text)
    model = enc.model
    with torch.no_grad():
        ref_enc = model.encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True,
                                output_attentions=True)
        ref = model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids,
                    decoder_attention_mask=mask, output_hidden_states=True,
                    output_attentions=True, use_cache=False)
    for hf, states, attentions, stack, n_blocks in (
        (enc, ref_enc.hidden_states, ref_enc.attentions, model.encoder, 2),
        (dec, ref.decoder_hidden_states, ref.decoder_attentions, model.decoder, 3),
    ):
        cap = hf_capture(hf, ids, mask)
        assert cap.causal is hf.is_decoder
        # Hugging Face's last entry is after final_layer_norm; ours is the last block's output
        # and the norm is its own layer: the stack's own norm applied to it gives HF's last entry.
        assert len(cap.hidden) == len(states) == n_blocks + 1
        for h, r in zip(cap.hidden[:-1], states[:-1], strict=True):
            torch.testing.assert_close(h, r, rtol=0, atol=0)
        torch.testing.assert_close(cap.final_norm, states[-1], rtol=0, atol=0)
        with torch.no_grad():
            torch.testing.assert_close(stack.final_layer_norm(cap.hidden[-1]), states[-1])
        assert not torch.allclose(cap.hidden[-1], states[-1])  # the norm does change the states
        assert len(cap.attention) == n_blocks  # self-attention only: no cross-attention
        for a, r in zip(cap.attention, attentions, strict=True):
            torch.testing.assert_close(a, r, rtol=0, atol=0)
    torch.testing.assert_close(ref.encoder_last_hidden_state, ref_enc.last_hidden_state)


def test_t5_queries_and_keys_reproduce_attention(t5_stacks, tiny_text):
    """T5's scores are q·k + relative position bias, unscaled: Q K^T/sqrt(D) must be q·k."""
    for hf in t5_stacks.values():
        ids, mask = padded_batch(hf, tiny_text)
        cap = hf_capture(hf, ids, mask)
        sublayer = hf.blocks_owner.block[0].layer[0]  # pre-LN: layer_norm, then SelfAttention
        attn = sublayer.SelfAttention  # block 0's holds the bias table all blocks share
        T = ids.size(1)
        with torch.no_grad():
            bias = attn.compute_bias(T, T)  # (1, H, T, T), computed by the model's own code
        allowed = mask.bool()[:, None, None, :]
        if hf.is_decoder:
            allowed = allowed & torch.ones(T, T, dtype=torch.bool).tril()
        assert len(cap.queries) == len(cap.attention) == len(hf.blocks_owner.block)
        for q, k, attention in zip(cap.queries, cap.keys, cap.attention, strict=True):
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) + bias
            probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
            # Same float32 product up to summation order, as in test_queries_and_keys_...
            torch.testing.assert_close(probs, attention, atol=1e-5, rtol=1e-4)
        with torch.no_grad():  # and Q is sqrt(D) times the model's own q projection
            q_proj = attn.q(sublayer.layer_norm(cap.hidden[0]))
        D = attn.key_value_proj_dim
        expected = q_proj.view(*q_proj.shape[:2], -1, D).transpose(1, 2) * math.sqrt(D)
        torch.testing.assert_close(cap.queries[0], expected)
