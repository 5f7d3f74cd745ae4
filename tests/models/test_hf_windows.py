"""`repgeom.models.hf.windows`: text cut into windows with the tokenizer's special tokens."""

from __future__ import annotations

import pytest
import torch
from hf_cases import WINDOW

from repgeom.models.hf import tokenize_windows
from repgeom.models.hf.windows import sliding_window, sliding_window_warning

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


@pytest.mark.parametrize("family,window", [("gemma3_text", 4), ("olmo3", 4), ("gemma2", 4),
                                           ("mistral-sw", 4), ("qwen2-sw", 4), ("mistral", 4096),
                                           ("qwen2", None), ("llama", None), ("gpt2", None)])
def test_sliding_window_is_read_from_layer_types_or_sliding_window(tiny_hf, family, window):
    """Gemma/OLMo-3 through layer_types, Mistral through sliding_window alone, Qwen2 only with
    use_sliding_window (its default sliding_window=4096 is unused otherwise)."""
    hf = tiny_hf(family)
    assert sliding_window(hf) == window
    message = sliding_window_warning(hf, 16)
    if window is not None and window < 16:
        assert f"window=16 is longer than {hf.name}'s sliding window" in message
        assert f"(config.sliding_window={window})" in message
        assert f"give window<={window}" in message
        assert sliding_window_warning(hf, window) is None
    else:
        assert message is None
