"""The one text reader (`repgeom.models.text_states`): a text that fits is one capture; a longer
one is read window by window, every token kept, the windows' states joined in text order."""

import pytest
import torch

from repgeom.models.hf import hf_capture
from repgeom.models.hf.windows import DEFAULT_WINDOW
from repgeom.models.text_states import read_text_states, text_window_ids


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_a_text_that_fits_is_one_capture(tiny_hf, family):
    hf = tiny_hf(family)
    text = "hello world"
    read = read_text_states(hf, text)
    ids = torch.tensor([hf.tokenizer(text)["input_ids"]])
    cap = hf_capture(hf, ids, torch.ones_like(ids), attention=False)
    assert read.n_windows == 1 and read.layer_names == cap.layer_names()
    for ours, theirs in zip(read.states, cap.text_states(), strict=True):
        assert torch.equal(ours, theirs)  # the same forward pass


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_a_long_text_is_every_window_joined(tiny_hf, tiny_text, family):
    hf = tiny_hf(family)
    window = 16
    read = read_text_states(hf, tiny_text, window=window)
    windows = text_window_ids(hf, tiny_text, window=window)
    assert read.n_windows == len(windows) > 1 and all(w.shape[1] <= window for w in windows)
    bare = hf.tokenizer(tiny_text, add_special_tokens=False)["input_ids"]
    assert read.states[0].shape[0] == len(bare) == len(read.tokens)  # no token dropped
    parts = [hf_capture(hf, w, torch.ones_like(w), attention=False).text_states()
             for w in windows]
    for layer, joined in enumerate(read.states):
        assert torch.equal(joined, torch.cat([p[layer] for p in parts]))


def test_window_default_and_bounds(tiny_hf):
    hf = tiny_hf("gpt2")
    positions = hf.model.config.max_position_embeddings
    longest = min(DEFAULT_WINDOW, positions)
    assert text_window_ids(hf, "a " * 400)[0].shape[1] == longest
    with pytest.raises(ValueError, match="window must be an integer"):
        read_text_states(hf, "a b", window=positions + 1)
