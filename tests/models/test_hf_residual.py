"""`repgeom.models.hf.residual`: the block stack and the final norm, found by one rule and checked
against each family's layout written out by hand."""

from __future__ import annotations

import warnings

import pytest
import torch
from hf_cases import padded_batch

from repgeom.models.hf import hf_capture

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

    from repgeom.models.hf.residual import final_norm_module

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
