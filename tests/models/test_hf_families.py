"""The papers' decoder families against their own outputs: Pythia (GPT-NeoX, partial rotary),
BLOOM (ALiBi) and OPT, each a tiny random model (`tiny_hf_models.build_tiny_hf`, seed 0).

Each model is run twice on one batch of three windows (whole, right-padded, left-padded): once
by `hf_capture`, once directly with ``output_hidden_states`` and ``output_attentions`` (eager
attention). Checked: (a) the hidden states follow the layer convention of `repgeom.models.hf`
(embedding output, block outputs, final norm apart) and equal the model's own; (b) the attention
is the model's own; (c) softmax(Q Kᵀ/√D + position bias + masks), with masks and BLOOM's ALiBi
built here from the paper, is the model's attention to 1e-5; (d) the probe's `measure` gives
every catalogue metric, the query/key ones included, at every layer.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from hf_cases import DECODERS, QK_FAMILIES

from repgeom.models.hf import hf_capture, tokenize_windows
from repgeom.models.hf.families import is_decoder_by_experiment, is_decoder_from_config
from repgeom.probes.core import catalogue
from repgeom.probes.core.measure import ProbeSettings, measure

FAMILIES = ["gpt_neox", "bloom", "opt"]
WINDOW = 16
# Where each family keeps its blocks, its final norm and each block's pre-attention norm.
LAYOUT = {
    "gpt_neox": ("layers", "final_layer_norm"),
    "bloom": ("h", "ln_f"),
    "opt": ("decoder.layers", "decoder.final_layer_norm"),
}


def padded_batch(hf, text):
    """Three windows: row 0 whole, row 1 right-padded over 4 positions, row 2 left-padded
    over 3 (pad ids where the tokenizer has a pad token)."""
    ids, mask = tokenize_windows(hf, text, window=WINDOW, n_windows=3)
    mask[1, -4:] = 0
    mask[2, :3] = 0
    pad = hf.tokenizer.pad_token_id
    if pad is not None:
        ids[mask == 0] = pad
    return ids, mask


@pytest.fixture(scope="module")
def run(tiny_hf, tiny_text):
    """`run(family)` -> (hf, ids, mask, our capture, the model's own output, block outputs)."""
    done: dict = {}

    def make(family: str):
        if family not in done:
            hf = tiny_hf(family)
            ids, mask = padded_batch(hf, tiny_text)
            cap = hf_capture(hf, ids, mask)
            blocks = hf.model.get_submodule(LAYOUT[family][0])
            outputs: list[torch.Tensor] = []
            handles = [b.register_forward_hook(
                lambda m, a, o: outputs.append(o[0] if isinstance(o, tuple) else o))
                for b in blocks]  # fmt: skip
            try:
                with torch.no_grad():
                    ref = hf.model(input_ids=ids, attention_mask=mask, output_hidden_states=True,
                                   output_attentions=True, use_cache=False)
            finally:
                for handle in handles:
                    handle.remove()
            done[family] = (hf, ids, mask, cap, ref, outputs)
        return done[family]

    return make


def max_abs(xs, ys) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(xs, ys, strict=True))


@pytest.mark.parametrize("family", FAMILIES)
def test_decoder_with_eager_attention(run, family):
    hf = run(family)[0]
    assert is_decoder_from_config(hf.model.config) is True  # by family name, not by experiment
    assert hf.is_decoder and hf.has_qk
    assert hf.model.config._attn_implementation == "eager"


# --------------------------------------------------------------------------------------------
# (a) hidden states, (b) attention


@pytest.mark.parametrize("family", FAMILIES)
def test_hidden_states_are_the_models_own(run, family):
    hf, ids, mask, cap, ref, block_outputs = run(family)
    n = hf.model.config.num_hidden_layers
    assert len(cap.hidden) == len(ref.hidden_states) == len(block_outputs) + 1 == n + 1
    # Embedding output and the input of every later block: Hugging Face's entries 0..L-1.
    assert max_abs(cap.hidden[:-1], ref.hidden_states[:-1]) == 0.0  # one computation, one CPU
    # Every block's output, the last one included (before the final norm).
    assert max_abs(cap.hidden[1:], block_outputs) == 0.0
    # The final norm is its own layer: Hugging Face's last entry, the norm of our last state.
    assert cap.final_norm is not None
    assert max_abs([cap.final_norm], [ref.hidden_states[-1]]) == 0.0
    with torch.no_grad():
        normed = hf.model.get_submodule(LAYOUT[family][1])(cap.hidden[-1])
    torch.testing.assert_close(cap.final_norm, normed, rtol=0, atol=1e-6)
    assert not torch.allclose(cap.hidden[-1], ref.hidden_states[-1], atol=1e-3)


@torch.no_grad()
def test_bloom_embedding_output_includes_its_embedding_norm(run):
    hf, ids, _, cap, _, _ = run("bloom")
    expected = hf.model.word_embeddings_layernorm(hf.model.word_embeddings(ids))
    torch.testing.assert_close(cap.hidden[0], expected, rtol=0, atol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_is_the_models_own(run, family):
    hf, ids, mask, cap, ref, _ = run(family)
    H, T = hf.model.config.num_attention_heads, ids.size(1)
    assert len(cap.attention) == len(ref.attentions) == hf.model.config.num_hidden_layers
    assert all(a.shape == (3, H, T, T) for a in cap.attention)
    assert max_abs(cap.attention, ref.attentions) == 0.0


# --------------------------------------------------------------------------------------------
# (c) queries and keys give the attention


def alibi(n_heads: int, T: int) -> torch.Tensor:
    """ALiBi as Press et al. 2022 define it: -m_h (t - j), slopes m_h = 2^(-8 (h+1) / H) for a
    power-of-two H. (H, T, T). BLOOM adds m_h * (key position) instead: the two differ by a
    constant per query row, which the softmax ignores."""
    assert n_heads & (n_heads - 1) == 0
    slopes = 2.0 ** (-8.0 * torch.arange(1, n_heads + 1) / n_heads)  # (H,)
    distance = torch.arange(T)[:, None] - torch.arange(T)[None, :]  # t - j
    return -slopes[:, None, None] * distance  # (H, T, T)


def softmax_qk(cap, mask, bias=None):
    """softmax(Q Kᵀ/√D + bias) per layer, with the causal and padding masks built here."""
    T = mask.size(1)
    allowed = mask.bool()[:, None, None, :] & torch.ones(T, T, dtype=torch.bool).tril()
    probs = []
    for q, k in zip(cap.queries, cap.keys, strict=True):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, T)
        if bias is not None:
            scores = scores + bias
        probs.append(scores.masked_fill(~allowed, float("-inf")).softmax(-1))
    return probs


def real_rows(probs, mask):
    """The rows of real (unpadded) queries: a left-padded window's padded first query has no
    key it may attend to, and the model fills that row with something of its own."""
    rows = mask.bool()[:, None, :].expand(-1, probs[0].size(1), -1)  # (B, H, T)
    return [p[rows] for p in probs]  # (n, T) each


@pytest.mark.parametrize("family", FAMILIES)
def test_softmax_of_queries_and_keys_is_the_attention(run, family):
    hf, ids, mask, cap, ref, _ = run(family)
    cfg = hf.model.config
    H, T, D = cfg.num_attention_heads, ids.size(1), cfg.hidden_size // cfg.num_attention_heads
    shapes = {t.shape for t in (*cap.queries, *cap.keys)}
    assert shapes == {(3, H, T, D)} and len(cap.queries) == len(cap.keys) == 2
    bias = alibi(H, T) if family == "bloom" else None
    ours = real_rows(softmax_qk(cap, mask, bias), mask)
    theirs = real_rows(list(ref.attentions), mask)
    # Same float32 product up to summation order. Weights of std 0.3 make attention peaked, so
    # a wrong head split, rotary or scale would move it by far more than 1e-5.
    assert max_abs(ours, theirs) < 1e-5
    if family == "gpt_neox":  # Pythia's layout: rotary on part of each head's dims only
        assert 0 < cfg.rope_parameters["partial_rotary_factor"] < 1
    if family == "bloom":  # ALiBi is needed: without it the same Q, K give another attention
        assert max_abs(real_rows(softmax_qk(cap, mask), mask), theirs) > 1e-2


@torch.no_grad()
def test_bloom_queries_and_keys_by_hand(run):
    """BLOOM's fused projection is laid out per head as [q_h | k_h | v_h] (its ``_reshape``:
    ``view(B, T, H, 3, D)``), and its scores are q·k/√D (``inv_norm_factor``) with no factor to
    fold into Q."""
    hf, ids, mask, cap, _, _ = run("bloom")
    H = hf.model.config.num_attention_heads
    for layer, block in enumerate(hf.model.h):
        attn = block.self_attention
        assert attn.inv_norm_factor == pytest.approx(attn.head_dim**-0.5) and attn.beta == 1.0
        fused = attn.query_key_value
        qkv = block.input_layernorm(cap.hidden[layer]) @ fused.weight.T + fused.bias  # (B,T,3C)
        B, T, C3 = qkv.shape
        per_head = qkv.view(B, T, H, 3, C3 // (3 * H))
        torch.testing.assert_close(cap.queries[layer], per_head[..., 0, :].transpose(1, 2))
        torch.testing.assert_close(cap.keys[layer], per_head[..., 1, :].transpose(1, 2))
        # Read as [q | k | v] (GPT-2's layout) the same output gives other queries.
        naive = qkv[..., : C3 // 3].view(B, T, H, -1).transpose(1, 2)
        assert not torch.allclose(cap.queries[layer], naive, atol=1e-3)


# --------------------------------------------------------------------------------------------
# (d) the probe's measurement, every metric


@pytest.mark.parametrize("family", FAMILIES)
def test_probe_measures_every_metric_with_queries_and_keys(tiny_hf, tiny_text, family):
    hf = tiny_hf(family)
    ids, mask = tokenize_windows(hf, tiny_text, window=32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "no query/key hooks" warning, nor any other
        cap = hf_capture(hf, ids, mask)
    settings = ProbeSettings(metrics=("all",), distributions=True, max_order=8,
                             state_batch_size=128, distribution_samples=500)
    out = measure([cap], [cap], settings)
    assert out.warnings == []
    frame = pd.DataFrame(out.rows)
    # A number is NaN only with its reason in `note`: a layer whose states are mostly copies
    # (a tiny random model's embedding; ProbeSettings.max_copy_share), or an ID profile with no
    # plateau (id_scales). Every other number is finite.
    noted = frame["note"].fillna("") != "" if "note" in frame else False
    assert np.isfinite(frame.loc[~noted, "value"]).all()
    assert frame.loc[noted, "note"].str.match(r"(copies|no plateau)").all()
    n_blocks, H = hf.model.config.num_hidden_layers, hf.model.config.num_attention_heads
    assert out.layer_names == ["embedding", "block_1", "block_2", "final_norm"]
    for entry in catalogue.BUILTIN.values():
        for output in entry.outputs:
            if output.pattern == "twonn_llm_microscope":  # only under that TwoNN convention
                continue
            if output.pattern.endswith(("_chance", "_p")):  # only with null_permutations > 0
                continue
            rows = frame[[output.matches(m) for m in frame["metric"]]]
            assert len(rows), output.pattern
            if entry.reads == "states":
                assert set(rows["layer"]) == {0, 1, 2, 3}, output.pattern
            elif entry.per_head:  # attention and qk_alignment: every head of every block
                for _, one in rows.groupby("metric"):
                    assert sorted(zip(one["layer"], one["head"], strict=True)) == [
                        (layer, head) for layer in range(1, n_blocks + 1) for head in range(H)]
            elif entry.reads == "qk":  # qk_cosine_concat: one row per block
                assert sorted(rows["layer"]) == [1, 2] and (rows["head"] == -1).all()
    # The per-head query/key rows are the captured Q and K's: head 0 of block 1, by hand.
    Q, K, valid = cap.queries[0][:, 0].double(), cap.keys[0][:, 0].double(), cap.valid
    q_mean, k_mean = Q[valid].mean(0), K[valid].mean(0)
    dot = frame[(frame["metric"] == "qk_dot") & (frame["layer"] == 1) & (frame["head"] == 0)]
    assert float(dot["value"].iloc[0]) == pytest.approx(float(q_mean @ k_mean), rel=1e-9)


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


def test_every_export_target_is_a_known_family():
    # An exported folder is read back through its family's record (Q/K hooks, decoder or not).
    from repgeom.models.export_hf import EXPORT_TARGETS
    from repgeom.models.hf.families import FAMILIES

    for target in EXPORT_TARGETS.values():
        assert FAMILIES[target.family].qk is not None
