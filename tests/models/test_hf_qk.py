"""`repgeom.models.hf.qk`: queries and keys, checked twice, independently: (1) softmax(Q Kᵀ/√D +
mask) must give the attention probabilities the model itself returns, and (2) they must equal
queries and keys recomputed by hand from the weights (with our own RoPE for the rotary
families)."""

from __future__ import annotations

import pytest
import torch
from hf_cases import QK_FAMILIES, WINDOW, padded_batch, reproduce_attention

from repgeom.models.hf import hf_capture, tokenize_windows


@pytest.mark.parametrize("family", QK_FAMILIES)
def test_queries_and_keys_reproduce_attention(tiny_hf, family, tiny_text):
    hf = tiny_hf(family)
    ids, mask = padded_batch(hf, tiny_text)
    cap = hf_capture(hf, ids, mask)
    # Masks built here, not taken from the model: padding keys out, and the future for decoders.
    probs = reproduce_attention(cap, mask, hf.is_decoder)
    for p, attention in zip(probs, cap.attention, strict=True):
        # Same float32 product up to summation order: 1e-5 absolute on probabilities. The
        # weights (std 0.3) make attention peaked, so a wrong head split, rotary or scale
        # changes it by far more than that.
        torch.testing.assert_close(p, attention, atol=1e-5, rtol=1e-4)


# --------------------------------------------------------------------------------------------
# Queries and keys against the weights, by hand


def split_heads(x, n_head):
    B, T, C = x.shape
    return x.view(B, T, n_head, C // n_head).transpose(1, 2)  # (B, H, T, D)


def rope(x, n_rotary, theta):
    """Rotate-half RoPE (GPT-NeoX / Llama layout) on the first `n_rotary` dims of (B, H, T, D)."""
    T = x.size(-2)
    inv_freq = 1.0 / theta ** (torch.arange(0, n_rotary, 2, dtype=torch.float) / n_rotary)
    angle = torch.arange(T, dtype=torch.float)[:, None] * inv_freq[None, :]  # (T, n_rotary/2)
    cos, sin = angle.cos(), angle.sin()
    half = n_rotary // 2
    x1, x2, rest = x[..., :half], x[..., half:n_rotary], x[..., n_rotary:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def by_hand_case(tiny_hf, tiny_text, family):
    hf = tiny_hf(family)
    ids, mask = tokenize_windows(hf, tiny_text, window=WINDOW, n_windows=2)
    return hf, hf_capture(hf, ids, mask), hf.model.config.num_attention_heads


@torch.no_grad()
def test_gpt2_qk_by_hand(tiny_hf, tiny_text):
    hf, cap, H = by_hand_case(tiny_hf, tiny_text, "gpt2")
    C = hf.model.config.hidden_size
    for layer, block in enumerate(hf.model.h):
        x = block.ln_1(cap.hidden[layer])  # (B, T, C): pre-LN block input
        qkv = x @ block.attn.c_attn.weight + block.attn.c_attn.bias  # Conv1D stores (in, out)
        q, k = qkv[..., :C], qkv[..., C : 2 * C]
        torch.testing.assert_close(cap.queries[layer], split_heads(q, H))
        torch.testing.assert_close(cap.keys[layer], split_heads(k, H))


@torch.no_grad()
def test_gpt2_inverse_layer_scale_is_folded_into_queries(tiny_hf, tiny_text):
    hf, cap, H = by_hand_case(tiny_hf, tiny_text, "gpt2-scaled")
    C = hf.model.config.hidden_size
    for layer, block in enumerate(hf.model.h):
        x = block.ln_1(cap.hidden[layer])
        q = (x @ block.attn.c_attn.weight + block.attn.c_attn.bias)[..., :C]
        # scores are q·k / (sqrt(D) (layer + 1)), so Q = q / (layer + 1) for Q·K / sqrt(D)
        torch.testing.assert_close(cap.queries[layer], split_heads(q, H) / (layer + 1))


@pytest.mark.parametrize("family", ["bert", "roberta"])
@torch.no_grad()
def test_bert_qk_by_hand(tiny_hf, tiny_text, family):
    hf, cap, H = by_hand_case(tiny_hf, tiny_text, family)
    for layer, block in enumerate(hf.model.encoder.layer):
        x = cap.hidden[layer]  # post-LN: the block input is the previous state itself
        attn = block.attention.self
        q = x @ attn.query.weight.T + attn.query.bias
        k = x @ attn.key.weight.T + attn.key.bias
        torch.testing.assert_close(cap.queries[layer], split_heads(q, H))
        torch.testing.assert_close(cap.keys[layer], split_heads(k, H))


@torch.no_grad()
def test_gpt_neox_qk_by_hand(tiny_hf, tiny_text):
    hf, cap, H = by_hand_case(tiny_hf, tiny_text, "gpt_neox")
    cfg = hf.model.config
    D = cfg.hidden_size // H
    n_rotary = int(D * cfg.rope_parameters["partial_rotary_factor"])
    assert 0 < n_rotary < D  # the tiny config exercises partial rotary, as in Pythia
    theta = cfg.rope_parameters["rope_theta"]
    for layer, block in enumerate(hf.model.layers):
        x = block.input_layernorm(cap.hidden[layer])
        fused = block.attention.query_key_value
        qkv = split_heads(x @ fused.weight.T + fused.bias, H)  # (B, H, T, 3D), per head [q|k|v]
        q, k = qkv[..., :D], qkv[..., D : 2 * D]
        torch.testing.assert_close(cap.queries[layer], rope(q, n_rotary, theta))
        torch.testing.assert_close(cap.keys[layer], rope(k, n_rotary, theta))


@pytest.mark.parametrize("family", ["llama", "mistral"])
@torch.no_grad()
def test_llama_qk_by_hand(tiny_hf, tiny_text, family):
    hf, cap, H = by_hand_case(tiny_hf, tiny_text, family)
    cfg = hf.model.config
    D = cfg.hidden_size // H
    groups = H // cfg.num_key_value_heads
    assert groups > 1  # the tiny config exercises grouped-query attention
    theta = cfg.rope_parameters["rope_theta"]
    for layer, block in enumerate(hf.model.layers):
        x = block.input_layernorm(cap.hidden[layer])
        q = rope(split_heads(x @ block.self_attn.q_proj.weight.T, H), D, theta)
        k = rope(
            split_heads(x @ block.self_attn.k_proj.weight.T, cfg.num_key_value_heads), D, theta
        )
        torch.testing.assert_close(cap.queries[layer], q)
        for head in range(H):  # query head h reads key head h // groups
            torch.testing.assert_close(cap.keys[layer][:, head], k[:, head // groups])


@torch.no_grad()
def test_opt_queries_are_unscaled_projections(tiny_hf, tiny_text):
    hf, cap, H = by_hand_case(tiny_hf, tiny_text, "opt")
    for layer, block in enumerate(hf.model.decoder.layers):
        x = block.self_attn_layer_norm(cap.hidden[layer])
        proj = block.self_attn.q_proj
        torch.testing.assert_close(
            cap.queries[layer], split_heads(x @ proj.weight.T + proj.bias, H)
        )


# --------------------------------------------------------------------------------------------
# Families read at the product (repgeom.models.hf.qk.ATTENTION)


@torch.no_grad()
def test_olmo_queries_and_keys_are_clamped_then_rotated(tiny_hf, tiny_text):
    """OLMo clamps q, k and v to [-clip_qkv, clip_qkv] after the projection, then rotates q and
    k (scores scaled by 1/sqrt(D) alone: nothing folded into Q)."""
    hf, cap, H = by_hand_case(tiny_hf, tiny_text, "olmo")
    cfg = hf.model.config
    clip, D, theta = cfg.clip_qkv, cfg.hidden_size // H, cfg.rope_parameters["rope_theta"]
    for layer, block in enumerate(hf.model.layers):
        x = block.input_layernorm(cap.hidden[layer])
        q = x @ block.self_attn.q_proj.weight.T
        assert float((q.abs() > clip).float().mean()) > 0.1  # the tiny config does clamp
        expected = rope(split_heads(q.clamp(-clip, clip), H), D, theta)
        torch.testing.assert_close(cap.queries[layer], expected)
        unclamped = rope(split_heads(q, H), D, theta)
        assert not torch.allclose(cap.queries[layer], unclamped, atol=1e-3)


@torch.no_grad()
def test_smollm3_nope_layer_has_no_rotary(tiny_hf, tiny_text):
    """SmolLM3 skips the rotary embedding on its NoPE layers (``no_rope_layers[i] == 0``): there
    Q is the projection itself; on a rotary layer it is not."""
    hf, cap, H = by_hand_case(tiny_hf, tiny_text, "smollm3")
    assert hf.model.config.no_rope_layers == [1, 0]
    for layer, block in enumerate(hf.model.layers):
        x = block.input_layernorm(cap.hidden[layer])
        q = split_heads(x @ block.self_attn.q_proj.weight.T, H)
        assert torch.allclose(cap.queries[layer], q, atol=1e-6) == (layer == 1)


@torch.no_grad()
def test_qwen3_queries_are_normalised_per_head(tiny_hf, tiny_text):
    """Qwen3's q_norm is an RMSNorm over each head's D dims, before rotary: up to the rotation,
    which keeps each rotated pair's summed squares, Q is the model's q_norm of each head's
    projection, and not the projection itself."""
    hf, cap, H = by_hand_case(tiny_hf, tiny_text, "qwen3")
    for layer, block in enumerate(hf.model.layers):
        x = block.input_layernorm(cap.hidden[layer])
        q = split_heads(x @ block.self_attn.q_proj.weight.T, H)
        normed = block.self_attn.q_norm(q)  # the model's own norm, per head
        # rotary turns pairs of dims (i, i + D/2): their summed squares are kept
        torch.testing.assert_close(pairs(cap.queries[layer]), pairs(normed))
        assert not torch.allclose(pairs(cap.queries[layer]), pairs(q), atol=1e-3)


def pairs(t):
    """Summed squares of each rotary pair of dims (i, i + D/2) of (..., D)."""
    half = t.size(-1) // 2
    return t[..., :half] ** 2 + t[..., half:] ** 2


def test_family_read_at_the_product_needs_its_attention_implementation(tiny_hf, tiny_text,
                                                                       tiny_hf_folder):
    import dataclasses

    from transformers import AutoModel

    hf = tiny_hf("olmo2")
    plain = AutoModel.from_pretrained(tiny_hf_folder("olmo2"), attn_implementation="eager")
    ids, mask = tokenize_windows(hf, tiny_text, window=WINDOW, n_windows=2)
    with pytest.raises(RuntimeError, match="load the model with load_hf_model"):
        hf_capture(dataclasses.replace(hf, model=plain.eval()), ids, mask)


def test_a_second_recorder_on_one_model_is_refused(tiny_hf, tiny_text):
    """Read at the product, one record per attention module: a nested recorder would take it
    over and, on leaving, end the outer one's, whose later forwards went unrecorded (stale Q/K,
    silently). It is refused; the outer one still records, and after it another may open."""
    from repgeom.models.hf.qk import QKRecorder

    hf = tiny_hf("olmo2")
    ids, mask = tokenize_windows(hf, tiny_text, window=WINDOW, n_windows=2)
    with torch.no_grad(), QKRecorder(hf.blocks_owner, "olmo2") as outer:
        hf.model(input_ids=ids[:1], attention_mask=mask[:1])
        with pytest.raises(RuntimeError, match="a QKRecorder is already open on this model"):
            QKRecorder(hf.blocks_owner, "olmo2").__enter__()
        hf.model(input_ids=ids[1:], attention_mask=mask[1:])
        q, k = outer.collect()
    expected = hf_capture(hf, ids[1:], mask[1:], attention=False, include_special=True)
    torch.testing.assert_close(q[0], expected.queries[0])
    torch.testing.assert_close(k[-1], expected.keys[-1])
