"""`repgeom.models.hf.capture.hf_capture`: tiny random models of each family (conftest.py) into
`Capture`, against the models' own outputs; valid positions, dtypes, devices, unknown families.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hf_cases import QK_FAMILIES, WINDOW, padded_batch, reproduce_attention

from repgeom.models.hf import hf_capture, load_hf_model, tokenize_windows


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


def test_capture_checks_its_inputs(tiny_hf, tiny_text):
    hf = tiny_hf("gpt2")
    ids, mask = tokenize_windows(hf, tiny_text, window=WINDOW, n_windows=2)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        hf_capture(hf, ids, mask[:, :-1])
    with pytest.raises(ValueError, match="input_ids must be a"):
        hf_capture(hf, ids[0])


def test_the_first_forward_of_a_model_class_in_a_process_is_run_twice(tiny_hf, tiny_text,
                                                                        monkeypatch):
    """The first capture of a model class in a process forwards its batch once more and throws
    the first result away (`capture._settle_first_call`: on a loaded CPU that first forward
    sometimes rounds differently from every later one); later captures forward once, and every
    capture gives the same bits."""
    from repgeom.models.hf import capture

    monkeypatch.setattr(capture, "_SETTLED", set())  # as in a fresh process
    hf = tiny_hf("gpt2")
    ids, mask = padded_batch(hf, tiny_text)
    calls = []
    hook = hf.model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        first = hf_capture(hf, ids, mask)
        after_first = len(calls)
        second = hf_capture(hf, ids, mask)
    finally:
        hook.remove()
    assert (after_first, len(calls) - after_first) == (2, 1)
    for a, b in zip(first.hidden + first.attention, second.hidden + second.attention, strict=True):
        assert torch.equal(a, b)  # same process, same input: bit for bit
