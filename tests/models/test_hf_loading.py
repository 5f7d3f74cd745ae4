"""`repgeom.models.hf.loading`: paths, hub names, folders without a config or a tokenizer."""

from __future__ import annotations

import os

import pytest
import torch
from hf_cases import WINDOW

from repgeom.models.hf import hf_capture, load_hf_model, tokenize_windows
from repgeom.models.hf.loading import looks_like_path

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


def test_multimodal_model_is_a_clear_error(tmp_path, tiny_hf_folder):
    """Gemma 3 4B and up (model_type gemma3) hold their language model beside a vision tower:
    named, with the way to probe the language model, instead of an AttributeError deep in the
    probe."""
    from transformers import AutoModel, Gemma3Config

    text = dict(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, intermediate_size=64)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                          image_token_index=39, boi_token_index=38, eoi_token_index=37)
    AutoModel.from_config(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"multimodal model \(gemma3.*language_model"):
        load_hf_model(tmp_path, tokenizer=tiny_hf_folder("gemma3_text"))


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
