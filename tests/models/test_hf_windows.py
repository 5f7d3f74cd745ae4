"""`repgeom.models.hf.windows`: text cut into windows with the tokenizer's special tokens."""

from __future__ import annotations

import pytest
import torch
from hf_cases import WINDOW

from repgeom.models.hf import tokenize_windows

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
