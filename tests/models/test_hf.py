"""Hugging Face models into `Capture`: tiny random models of each family, built in conftest.py.

The queries and keys are checked twice, independently: (1) softmax(Q Kᵀ/√D + mask) must give the
attention probabilities the model itself returns, and (2) they must equal queries and keys
recomputed by hand from the weights (with our own RoPE for the rotary families).
"""

from __future__ import annotations

import math
import os
import warnings

import pytest
import torch

from repgeom.models.hf import hf_capture, load_hf_model, tokenize_windows
from repgeom.models.hf.families import is_decoder_by_experiment, is_decoder_from_config
from repgeom.models.hf.loading import looks_like_path

QK_FAMILIES = ["gpt2", "gpt2-scaled", "bert", "roberta", "xlm-roberta-xl", "gpt_neox", "opt",
               "llama", "mistral"]  # fmt: skip
DECODERS = {"gpt2", "gpt2-scaled", "gpt_neox", "opt", "llama", "mistral"}
WINDOW = 12


def padded_batch(hf, text):
    """Two windows; the second right-padded over its last 4 positions."""
    ids, mask = tokenize_windows(hf, text, window=WINDOW, n_windows=2)
    mask[1, -4:] = 0
    if hf.tokenizer.pad_token_id is not None:
        ids[1, -4:] = hf.tokenizer.pad_token_id
    return ids, mask


# --------------------------------------------------------------------------------------------
# Structure


@pytest.mark.parametrize("family", [*QK_FAMILIES, "electra"])
def test_encoder_or_decoder_from_config(tiny_hf, family):
    hf = tiny_hf(family)
    assert hf.is_decoder == (family in DECODERS)
    assert hf.kind == ("decoder" if family in DECODERS else "encoder")


def test_bert_configured_as_decoder_is_a_decoder():
    from transformers import BertConfig

    assert is_decoder_from_config(BertConfig(is_decoder=True)) is True
    assert is_decoder_from_config(BertConfig()) is False


def test_experiment_tells_causal_from_bidirectional(tiny_hf):
    # ELECTRA's config ("ElectraModel", model_type not in our lists) says nothing: the
    # experiment decides, and must agree with the known families.
    assert is_decoder_from_config(tiny_hf("electra").model.config) is None
    assert is_decoder_by_experiment(tiny_hf("gpt2").model) is True
    assert is_decoder_by_experiment(tiny_hf("llama").model) is True
    assert is_decoder_by_experiment(tiny_hf("bert").model) is False


@pytest.mark.parametrize("family", QK_FAMILIES)
def test_capture_matches_model_outputs(tiny_hf, family, tiny_text):
    hf = tiny_hf(family)
    cfg = hf.model.config
    ids, mask = padded_batch(hf, tiny_text)
    cap = hf_capture(hf, ids, mask)
    B, T, C, H = 2, WINDOW, cfg.hidden_size, cfg.num_attention_heads
    D = C // H

    assert cap.n_layers == cfg.num_hidden_layers == 2
    assert cap.causal == hf.is_decoder
    with torch.no_grad():
        ref = hf.model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    assert len(cap.hidden) == len(ref.hidden_states) == cfg.num_hidden_layers + 1
    assert all(h.shape == (B, T, C) for h in cap.hidden)
    # Embedding output and block inputs; the last entry is checked in test_hidden_is_the_...
    for h, r in zip(cap.hidden[:-1], ref.hidden_states[:-1], strict=True):
        torch.testing.assert_close(h, r)  # same computation; default float32 tolerances
    for layer in range(cap.n_layers):
        assert cap.queries[layer].shape == (B, H, T, D)
        assert cap.keys[layer].shape == (B, H, T, D)  # grouped-query keys repeated to H heads
        assert cap.attention[layer].shape == (B, H, T, T)
        torch.testing.assert_close(cap.attention[layer].sum(-1), torch.ones(B, H, T))


# Where each family keeps its blocks and its final norm, written out by hand (not found by the
# rule that hf.py uses) so that the rule is checked against the families' real layouts.
LAYOUT = {
    "gpt2": ("h", "ln_f"),
    "gpt2-scaled": ("h", "ln_f"),
    "gpt_neox": ("layers", "final_layer_norm"),
    "bloom": ("h", "ln_f"),  # beside ln_f, the embedding norm word_embeddings_layernorm
    "opt": ("decoder.layers", "decoder.final_layer_norm"),
    "opt-post": ("decoder.layers", None),
    "llama": ("layers", "norm"),
    "mistral": ("layers", "norm"),
    "xlm-roberta-xl": ("encoder.layer", "encoder.LayerNorm"),
    "bert": ("encoder.layer", None),
    "roberta": ("encoder.layer", None),
    "electra": ("encoder.layer", None),
}


@pytest.mark.parametrize("family", sorted(LAYOUT))
def test_hidden_is_the_residual_stream_and_final_norm_its_norm(tiny_hf, family, tiny_text):
    """The one layer convention: ``hidden`` is the embedding output and every block's output,
    before any final norm; ``final_norm`` is the final norm applied to the last of them."""
    hf = tiny_hf(family)
    ids, mask = padded_batch(hf, tiny_text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # electra: no query/key hooks, warned elsewhere
        cap = hf_capture(hf, ids, mask)
    stack_name, norm_name = LAYOUT[family]
    blocks = hf.model.get_submodule(stack_name)
    outputs = []
    handles = [
        b.register_forward_hook(lambda m, a, o: outputs.append(o[0] if isinstance(o, tuple) else o))
        for b in blocks
    ]
    try:
        with torch.no_grad():
            ref = hf.model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    finally:
        for h in handles:
            h.remove()
    assert len(outputs) == len(blocks) == cap.n_layers
    torch.testing.assert_close(cap.hidden[0], ref.hidden_states[0])
    for h, out in zip(cap.hidden[1:], outputs, strict=True):
        torch.testing.assert_close(h, out)  # the same forward pass twice: float32 defaults
    if norm_name is None:
        assert cap.final_norm is None
        # Post-LN: Hugging Face's hidden states already are the residual stream.
        for h, r in zip(cap.hidden, ref.hidden_states, strict=True):
            torch.testing.assert_close(h, r)
        return
    norm = hf.model.get_submodule(norm_name)
    with torch.no_grad():
        torch.testing.assert_close(cap.final_norm, norm(cap.hidden[-1]))
    # Pre-LN: Hugging Face's last hidden state is the final norm's output, not the residual.
    torch.testing.assert_close(cap.final_norm, ref.hidden_states[-1])
    torch.testing.assert_close(cap.final_norm, ref.last_hidden_state)
    assert not torch.allclose(cap.hidden[-1], ref.hidden_states[-1], atol=1e-3)


def test_final_norm_rule_refuses_two_candidates(tiny_hf_folder):
    from transformers import AutoModel

    from repgeom.models.hf import final_norm_module

    model = AutoModel.from_pretrained(tiny_hf_folder("gpt2"))
    assert final_norm_module(model) is model.ln_f
    model.ln_extra = torch.nn.LayerNorm(model.config.n_embd)
    with pytest.raises(RuntimeError, match=r"several norms beside the block stack"):
        final_norm_module(model)


@pytest.mark.filterwarnings("ignore:.*no query/key hooks")  # tested elsewhere
def test_unknown_layout_keeps_hugging_face_hidden_states_and_warns(tiny_hf, tiny_text):
    """ALBERT shares one block over all layers: no list of num_hidden_layers blocks to hook.
    An unknown family still gets its hidden states (post-LN ALBERT's are the residual stream)."""
    from transformers import AlbertConfig, AlbertModel

    from repgeom.models.hf import HFModel

    bert = tiny_hf("bert")
    config = AlbertConfig(
        vocab_size=len(bert.tokenizer),
        embedding_size=16,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
    )
    model = AlbertModel(config).eval()
    hf = HFModel(model, bert.tokenizer, "albert", is_decoder=False, name="tiny-albert")
    ids, mask = padded_batch(bert, tiny_text)
    with pytest.warns(UserWarning, match="expected one nn.ModuleList of 3 blocks") as record:
        cap = hf_capture(hf, ids, mask)
        hf_capture(hf, ids, mask)
    assert sum("ModuleList" in str(w.message) for w in record) == 1  # once per model
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    assert cap.final_norm is None and len(cap.hidden) == 4
    for h, r in zip(cap.hidden, ref.hidden_states, strict=True):
        torch.testing.assert_close(h, r)


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


def reproduce_attention(cap, mask, causal):
    """softmax(Q Kᵀ/√D + mask) per layer, from the captured queries and keys."""
    T = mask.size(1)
    allowed = mask.bool()[:, None, None, :].to(cap.queries[0].device)  # (B, 1, 1, T)
    if causal:
        allowed = allowed & torch.ones(T, T, dtype=torch.bool, device=allowed.device).tril()
    probs = []
    for q, k in zip(cap.queries, cap.keys, strict=True):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, T)
        probs.append(scores.masked_fill(~allowed, float("-inf")).softmax(-1))
    return probs


@pytest.mark.parametrize("family", ["gpt_neox", "llama", "bert"])
def test_float64_weights(tiny_hf_folder, tiny_text, family):
    hf = load_hf_model(tiny_hf_folder(family), dtype=torch.float64)
    ids, mask = padded_batch(hf, tiny_text)
    cap = hf_capture(hf, ids, mask)
    assert all(t.dtype == torch.float64 for t in (*cap.hidden, *cap.queries, *cap.keys))
    # BERT keeps float64 throughout; Llama and GPT-NeoX take their softmax in float32 whatever
    # the weights' dtype (eager_attention_forward), so their probabilities carry float32 rounding.
    atol = 1e-12 if family == "bert" else 1e-6
    probs = reproduce_attention(cap, mask, hf.is_decoder)
    for p, attention in zip(probs, cap.attention, strict=True):
        torch.testing.assert_close(p, attention, atol=atol, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_cuda_matches_cpu(tiny_hf, tiny_hf_folder, tiny_text, family):
    cpu = tiny_hf(family)
    gpu = load_hf_model(tiny_hf_folder(family), device="cuda")
    ids, mask = padded_batch(cpu, tiny_text)
    a, b = hf_capture(cpu, ids, mask), hf_capture(gpu, ids, mask)
    assert b.hidden[0].device.type == "cuda" and b.valid.device.type == "cuda"
    for x, y in zip(
        [*a.hidden, *a.queries, *a.keys, *a.attention],
        [*b.hidden, *b.queries, *b.keys, *b.attention],
        strict=True,
    ):
        # TF32 matmuls may be on for CUDA: about 1e-3 relative.
        torch.testing.assert_close(y.cpu(), x, atol=1e-2, rtol=1e-2)


def test_without_attention(tiny_hf, tiny_text):
    hf = tiny_hf("gpt2")
    ids, mask = tokenize_windows(hf, tiny_text, window=WINDOW, n_windows=2)
    cap = hf_capture(hf, ids, mask, attention=False)
    assert cap.attention == []
    assert len(cap.queries) == len(cap.keys) == 2


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
# Valid positions and special tokens


def test_valid_excludes_special_tokens_and_padding(tiny_hf, tiny_text):
    hf = tiny_hf("bert")
    ids, mask = padded_batch(hf, tiny_text)  # [CLS] text [SEP] in each row; row 1 padded at the end
    assert (ids[:, 0] == hf.tokenizer.cls_token_id).all()
    assert ids[0, -1] == hf.tokenizer.sep_token_id

    valid = hf_capture(hf, ids, mask, attention=False).valid
    expected = torch.ones(2, WINDOW, dtype=torch.bool)
    expected[:, 0] = False  # CLS
    expected[0, -1] = False  # SEP
    expected[1, -4:] = False  # padding (its SEP was padded over)
    assert torch.equal(valid, expected)

    valid = hf_capture(hf, ids, mask, attention=False, include_special=True).valid
    assert torch.equal(valid, mask.bool())  # padding stays out


@pytest.mark.parametrize("family,first_special", [("llama", True), ("opt", True), ("gpt2", False)])
def test_valid_for_decoders(tiny_hf, family, first_special, tiny_text):
    hf = tiny_hf(family)
    ids, mask = tokenize_windows(hf, tiny_text, window=WINDOW, n_windows=2)
    valid = hf_capture(hf, ids, mask, attention=False).valid
    assert torch.equal(valid[:, 0], torch.full((2,), not first_special))  # BOS where added
    assert valid[:, 1:].all()
    assert hf_capture(hf, ids, mask, attention=False, include_special=True).valid.all()


# --------------------------------------------------------------------------------------------
# Unknown family


def test_unknown_family_captures_hidden_states_and_warns_once(tiny_hf_folder, tiny_text):
    hf = load_hf_model(tiny_hf_folder("electra"))  # fresh: the warning is once per model
    ids, mask = tokenize_windows(hf, tiny_text, window=WINDOW, n_windows=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cap = hf_capture(hf, ids, mask)
        hf_capture(hf, ids, mask)
    ours = [w for w in caught if "query/key" in str(w.message)]
    assert len(ours) == 1
    assert "'electra'" in str(ours[0].message) and ours[0].filename == __file__
    assert not hf.has_qk and hf.family == "electra"
    assert len(cap.hidden) == hf.model.config.num_hidden_layers + 1
    assert cap.hidden[0].shape == (2, WINDOW, hf.model.config.hidden_size)
    assert cap.queries == [] and cap.keys == []
    assert len(cap.attention) == hf.model.config.num_hidden_layers  # attention still read


# --------------------------------------------------------------------------------------------
# Windows of text


@pytest.mark.parametrize(
    "family,prefix,suffix",
    [
        ("gpt2", [], []),
        ("bert", ["[CLS]"], ["[SEP]"]),
        ("llama", ["<s>"], []),
        ("opt", ["</s>"], []),
    ],
)
def test_windows_cut_text_in_order_with_special_tokens(tiny_hf, family, prefix, suffix, tiny_text):
    hf = tiny_hf(family)
    ids, mask = tokenize_windows(hf, tiny_text, window=WINDOW)
    content = WINDOW - len(prefix) - len(suffix)
    text_ids = hf.tokenizer(tiny_text, add_special_tokens=False)["input_ids"]
    assert ids.shape == (len(text_ids) // content, WINDOW)  # every full window, no overlap
    assert torch.equal(mask, torch.ones_like(ids))
    for row in ids.tolist():
        assert row[: len(prefix)] == hf.tokenizer.convert_tokens_to_ids(prefix)
        assert row[WINDOW - len(suffix) :] == hf.tokenizer.convert_tokens_to_ids(suffix)
    body = ids[:, len(prefix) : WINDOW - len(suffix)].flatten().tolist()
    assert body == text_ids[: len(body)]
    assert tokenize_windows(hf, tiny_text, window=WINDOW, n_windows=3)[0].shape == (3, WINDOW)


def test_text_shorter_than_window_is_a_clear_error(tiny_hf, tiny_text):
    hf = tiny_hf("bert")
    with pytest.raises(ValueError, match=r"10 tokens long .* needs 30 text tokens plus 2 special"):
        tokenize_windows(hf, "short text", window=32)
    with pytest.raises(ValueError, match=r"n_windows=1000 but the text .* holds only"):
        tokenize_windows(hf, tiny_text, window=32, n_windows=1000)
    with pytest.raises(ValueError, match="longer than .* 64 positions"):
        tokenize_windows(hf, tiny_text, window=65)
    with pytest.raises(ValueError, match="no room for text"):
        tokenize_windows(hf, tiny_text, window=2)


def test_capture_checks_its_inputs(tiny_hf, tiny_text):
    hf = tiny_hf("gpt2")
    ids, mask = tokenize_windows(hf, tiny_text, window=WINDOW, n_windows=2)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        hf_capture(hf, ids, mask[:, :-1])
    with pytest.raises(ValueError, match="input_ids must be a"):
        hf_capture(hf, ids[0])


# --------------------------------------------------------------------------------------------
# Loading errors


def test_paths_told_from_hub_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    for hub_name in ["gpt2", "EleutherAI/pythia-160m", "facebook/opt-125m"]:
        assert not looks_like_path(hub_name)
    for path in ["./gpt2", "../models/x", "/abs/model", "~/model", "a/b/c", "outputs/run", "x/"]:
        assert looks_like_path(path)


@pytest.mark.parametrize("relative", [True, False])
def test_missing_path_is_a_clear_error(tmp_path, monkeypatch, relative):
    monkeypatch.chdir(tmp_path)
    path = "./no/such/model" if relative else str(tmp_path / "no-such-model")
    with pytest.raises(FileNotFoundError, match="no such local folder"):
        load_hf_model(path)


def test_home_folder_is_expanded(tiny_hf_folder, monkeypatch):
    folder = tiny_hf_folder("gpt2")
    monkeypatch.setenv("HOME", os.path.dirname(folder))
    hf = load_hf_model("~/" + os.path.basename(folder))
    assert hf.name == folder and hf.family == "gpt2"


def test_folder_without_config_is_a_clear_error(tmp_path):
    (tmp_path / "last.ckpt").write_bytes(b"not a hugging face model")
    with pytest.raises(ValueError, match="no config.json"):
        load_hf_model(tmp_path)


# --------------------------------------------------------------------------------------------
# Model folders without a tokenizer


def test_folder_without_tokenizer_names_the_fix(tiny_hf_folder, tiny_hf, tiny_text):
    from repgeom.models.hf import TokenizerMissingError

    bare = tiny_hf_folder("gpt2", tokenizer=False)  # the weights of tiny_hf("gpt2") (seed 0)
    # Before: "the text is 0 tokens long" at the first window; now the load says what is missing.
    with pytest.raises(TokenizerMissingError, match=r"has no tokenizer; pass tokenizer=<name"):
        load_hf_model(bare)
    hf = load_hf_model(bare, tokenizer=tiny_hf_folder("gpt2"))
    reference = tiny_hf("gpt2")
    ids, mask = tokenize_windows(hf, tiny_text, window=WINDOW, n_windows=2)
    torch.testing.assert_close(ids, tokenize_windows(reference, tiny_text, window=WINDOW,
                                                     n_windows=2)[0])
    cap, ref = hf_capture(hf, ids, mask), hf_capture(reference, ids, mask)
    for h, r in zip([*cap.hidden, cap.final_norm], [*ref.hidden, ref.final_norm], strict=True):
        torch.testing.assert_close(h, r, rtol=0, atol=0)  # same weights, same input, same CPU


def test_tokenizer_larger_than_the_embedding_is_refused(tmp_path, tiny_hf_folder):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_hf_folder("gpt2"))
    tok.add_tokens(["<extra>"])  # one more token than the model has embedding rows
    tok.save_pretrained(tmp_path / "tok")
    with pytest.raises(ValueError, match=r"has 41 tokens but .* embedding has 40 rows"):
        load_hf_model(tiny_hf_folder("gpt2"), tokenizer=str(tmp_path / "tok"))


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
