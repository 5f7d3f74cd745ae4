"""Golden test of every family repgeom reads: the captured queries and keys give the model's own
attention, and the captured hidden states are the model's own.

For each family (`tiny_hf_models.FAMILIES`: the 10 first families, the 11 read at the product,
and variants of a few), a tiny random model is run twice on one batch of three windows (whole,
right-padded, left-padded): by `hf_capture`, and by a second copy of the model loaded here
with ``attn_implementation="eager"`` and ``output_attentions``/``output_hidden_states``. Checked,
at every layer and head:

- softmax(soft-cap(Q Kᵀ/√D + position bias) + mask), from the captured Q and K, equals the
  model's own eager attention probabilities to 1e-5. The masks (padding, causal, sliding
  window), the position biases (BLOOM's and Falcon-RW's ALiBi from Press et al. 2022; T5's
  relative bias from the model's own ``compute_bias``) and the soft-cap (Gemma 2's
  ``attn_logit_softcapping``: cap · tanh(s / cap)) are built here from the config;
- the hidden states equal ``output_hidden_states`` (the embedding output and each block's
  input) and each block's output, and the final norm's output is Hugging Face's last entry.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from repgeom.models.hf import hf_capture, load_hf_model, tokenize_windows

FIRST = ["gpt2", "gpt2-scaled", "bert", "roberta", "xlm-roberta-xl", "gpt_neox", "bloom", "opt",
         "opt-post", "llama", "mistral", "mistral-sw", "t5:encoder", "t5:decoder"]  # fmt: skip
AT_PRODUCT = ["olmo", "olmo2", "olmo3", "qwen2", "qwen2-sw", "qwen3", "gemma", "gemma2",
              "gemma3_text", "gemma3_text-bidirectional", "phi3", "smollm3", "falcon", "falcon-mq",
              "falcon-rw"]  # fmt: skip
ENCODERS = {"bert", "roberta", "xlm-roberta-xl", "t5:encoder", "gemma3_text-bidirectional"}
WINDOW = 16


def padded_batch(hf, text):
    """Three windows: row 0 whole, row 1 right-padded over 4 positions, row 2 left-padded
    over 3 (pad ids where the tokenizer has a pad token)."""
    ids, mask = tokenize_windows(hf, text, window=WINDOW, n_windows=3)
    mask[1, -4:] = 0
    mask[2, :3] = 0
    if hf.tokenizer.pad_token_id is not None:
        ids[mask == 0] = hf.tokenizer.pad_token_id
    return ids, mask


def alibi(n_heads: int, T: int) -> torch.Tensor:
    """ALiBi as Press et al. 2022 define it: -m_h (t - j), m_h = 2^(-8 (h+1) / H) for a
    power-of-two H. (H, T, T). BLOOM and Falcon add m_h · (key's real-token index) instead:
    the two differ by a constant per query row, which the softmax ignores."""
    assert n_heads & (n_heads - 1) == 0
    slopes = 2.0 ** (-8.0 * torch.arange(1, n_heads + 1) / n_heads)
    distance = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    return -slopes[:, None, None] * distance


def blocks_of(owner: nn.Module) -> nn.ModuleList:
    """The outermost ModuleList with as many entries as the model has blocks."""
    n = len(owner.block) if hasattr(owner, "block") else owner.config.num_hidden_layers
    return next(m for m in owner.modules() if isinstance(m, nn.ModuleList) and len(m) == n)


@torch.no_grad()
def reference(folder: str, stack: str | None, ids, mask):
    """The model's own run, eager attention: (hidden states, attentions, block outputs,
    the probed stack's module)."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    owner = model if stack is None else getattr(model, stack)
    outputs: list[torch.Tensor] = []
    handles = [b.register_forward_hook(
        lambda m, a, o: outputs.append(o[0] if isinstance(o, tuple) else o))
        for b in blocks_of(owner)]  # fmt: skip
    kwargs = dict(attention_mask=mask, output_hidden_states=True, output_attentions=True)
    try:
        if stack == "encoder":
            out = model.encoder(input_ids=ids, **kwargs)
            states, attentions = out.hidden_states, out.attentions
        elif stack == "decoder":
            out = model(input_ids=ids, decoder_input_ids=ids, decoder_attention_mask=mask,
                        use_cache=False, **kwargs)
            states, attentions = out.decoder_hidden_states, out.decoder_attentions
        else:
            out = model(input_ids=ids, use_cache=False, **kwargs)
            states, attentions = out.hidden_states, out.attentions
    finally:
        for handle in handles:
            handle.remove()
    return states, attentions, outputs, owner


def position_bias(case: str, owner: nn.Module, H: int, T: int, D: int):
    """The score bias a family adds to q·k/√D: (H, T, T), (1, H, T, T) or None."""
    if case == "bloom":
        return alibi(H, T)
    if case == "falcon-rw":  # FalconModel divides its ALiBi by sqrt(D) before adding it
        return alibi(H, T) / math.sqrt(D)
    if case.startswith("t5"):  # block 0's SelfAttention holds the table all blocks share
        with torch.no_grad():
            return owner.block[0].layer[0].SelfAttention.compute_bias(T, T)
    return None


def allowed_keys(mask, causal: bool, window: int | None):
    """(B, 1, T, T): padding keys out; the future out for decoders; keys ``window`` or more
    positions away out on a sliding-window layer (back for a decoder, either way for an
    encoder: Gemma 3's bidirectional windows)."""
    T = mask.size(1)
    allowed = mask.bool()[:, None, None, :].expand(-1, 1, T, -1)
    distance = torch.arange(T)[:, None] - torch.arange(T)[None, :]  # t - j
    if causal:
        allowed = allowed & (distance >= 0)
    if window is not None:
        allowed = allowed & (distance.abs() < window)
    return allowed


def sliding_windows(config, n_layers: int) -> list[int | None]:
    """Per layer, its sliding window (keys t - j < W only), or None for full attention: where
    ``layer_types`` says (Gemma 2/3, OLMo-3; Qwen2 writes its use_sliding_window and
    max_window_layers there), else every layer when ``sliding_window`` is set (Mistral)."""
    types = getattr(config, "layer_types", None)
    if types is None:
        slides = bool(getattr(config, "sliding_window", None)) and getattr(
            config, "use_sliding_window", True) is not False
        types = ["sliding_attention" if slides else "full_attention"] * n_layers
    return [config.sliding_window if t == "sliding_attention" else None for t in types]


def real_rows(probs, mask):
    """The rows of real queries: a left-padded window's padded queries may attend to no key,
    and each model fills those rows with something of its own."""
    rows = mask.bool()[:, None, :].expand(-1, probs.size(1), -1)  # (B, H, T)
    return probs[rows]


@pytest.fixture(scope="module")
def golden(tiny_hf_folder, tiny_text):
    done: dict = {}

    def make(case: str):
        if case not in done:
            family, _, stack = case.partition(":")
            folder = tiny_hf_folder(family)
            hf = load_hf_model(folder, stack=stack or None)
            ids, mask = padded_batch(hf, tiny_text)
            cap = hf_capture(hf, ids, mask)
            done[case] = (hf, ids, mask, cap, reference(folder, stack or None, ids, mask))
        return done[case]

    return make


@pytest.mark.parametrize("case", FIRST + AT_PRODUCT)
def test_softmax_of_captured_queries_and_keys_is_the_models_attention(golden, case):
    hf, ids, mask, cap, (_, attentions, _, owner) = golden(case)
    config = owner.config
    n_layers = len(attentions)
    assert hf.has_qk and hf.is_decoder == (case not in ENCODERS)
    assert len(cap.queries) == len(cap.keys) == len(cap.attention) == n_layers >= 2
    B, T = ids.shape
    H = attentions[0].size(1)
    D = cap.queries[0].size(-1)
    assert {tuple(t.shape) for t in (*cap.queries, *cap.keys)} == {(B, H, T, D)}
    bias = position_bias(case, owner, H, T, D)
    cap_at = getattr(config, "attn_logit_softcapping", None)
    for layer, (q, k, window) in enumerate(zip(cap.queries, cap.keys,
                                               sliding_windows(config, n_layers), strict=True)):
        scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, H, T, T)
        if bias is not None:
            scores = scores + bias
        if cap_at is not None:
            scores = cap_at * torch.tanh(scores / cap_at)
        allowed = allowed_keys(mask, hf.is_decoder, window)
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        # Same float32 product up to summation order: 1e-5 absolute on probabilities. Weights
        # of std 0.3 make attention peaked, so a missed norm, clamp, bias, rotary, scale,
        # soft-cap or head split moves it by far more.
        error = float((real_rows(probs, mask) - real_rows(attentions[layer], mask)).abs().max())
        assert error < 1e-5, f"{case} layer {layer}: {error}"
    # The model's own attention is what the capture hands to the probes.
    for ours, theirs in zip(cap.attention, attentions, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@pytest.mark.parametrize("case", FIRST + AT_PRODUCT)
def test_captured_hidden_states_are_the_models_own(golden, case):
    hf, ids, mask, cap, (states, _, block_outputs, _) = golden(case)
    assert len(cap.hidden) == len(states) == len(block_outputs) + 1
    # One computation on one CPU: the same bits.
    for ours, theirs in zip(cap.hidden[:-1], states[:-1], strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    for ours, theirs in zip(cap.hidden[1:], block_outputs, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    last = cap.final_norm if cap.final_norm is not None else cap.hidden[-1]
    torch.testing.assert_close(last, states[-1], rtol=0, atol=0)


@pytest.mark.parametrize("case", ["gemma2", "bloom", "falcon-rw"])
def test_soft_cap_and_alibi_are_needed(golden, case):
    """Without Gemma 2's soft-cap or the ALiBi bias, the same Q and K give another attention:
    the golden test above checks them, it does not pass without them."""
    hf, ids, mask, cap, (_, attentions, _, owner) = golden(case)
    q, k = cap.queries[0], cap.keys[0]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    window = sliding_windows(owner.config, len(attentions))[0]
    probs = scores.masked_fill(~allowed_keys(mask, True, window), float("-inf")).softmax(-1)
    assert float((real_rows(probs, mask) - real_rows(attentions[0], mask)).abs().max()) > 1e-2
