"""Pre-softmax attention scores (Godey et al. 2024, Figs. 7 and 10): the scores are the model's,
the table's statistics are those of the scores, and bad input fails with its name."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from tiny_hf_models import build_tiny_hf

from repgeom.analyses import scores
from repgeom.analyses.subjects import load_subject
from repgeom.cli import scores as scores_command

TEXT = "the cat sat on the mat, and then it slept."


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("gpt2")
    build_tiny_hf("gpt2", folder)
    return str(folder)


def _weights_scores(folder: str, text: str) -> tuple[list[torch.Tensor], tuple]:
    """Independent of repgeom's hooks: GPT-2's scores from each block's input (Hugging Face's
    hidden_states[l]), its ln_1 and c_attn weights, and the model's own attention."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    ids = AutoTokenizer.from_pretrained(folder)(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model(ids, output_hidden_states=True, output_attentions=True)
        expected = []
        for block, h in zip(model.h, out.hidden_states, strict=False):
            q, k, _ = block.attn.c_attn(block.ln_1(h)).split(model.config.n_embd, dim=2)
            H, T = model.config.n_head, ids.shape[1]
            q = q.view(T, H, -1).transpose(0, 1).double()  # (H, T, D)
            k = k.view(T, H, -1).transpose(0, 1).double()
            S = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            expected.append(S.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf))
    return expected, out.attentions


def test_scores_are_the_models_own(tiny_gpt2):
    subject = load_subject(hf=tiny_gpt2)
    got = scores.text_scores(subject, TEXT)
    expected, attentions = _weights_scores(tiny_gpt2, TEXT)
    assert len(got) == 2 and got[0].shape == (4, len(TEXT), len(TEXT))
    for S, E, A in zip(got, expected, attentions, strict=True):
        # float32 forward passes on both sides (hooked vs recomputed): rounding only
        torch.testing.assert_close(S, E, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(S.softmax(-1), A[0].double(), rtol=1e-5, atol=1e-6)


def test_encoder_and_checkpoint_scores_give_the_models_attention(tiny_hf_dir, tiny_ckpt):
    from repgeom.models.lightning_module import CharLM

    # BERT: no mask, CLS and SEP included as the model's softmax includes them
    subject = load_subject(hf=str(tiny_hf_dir / "model_and_tokenizer"))
    enc = subject.hf.tokenizer(TEXT, return_tensors="pt")
    with torch.no_grad():
        attentions = subject.hf.model(**enc, output_attentions=True).attentions
    got = scores.text_scores(subject, TEXT)
    assert got[0].shape[-1] == len(TEXT) + 2 and torch.isfinite(got[0]).all()
    for S, A in zip(got, attentions, strict=True):
        torch.testing.assert_close(S.softmax(-1), A[0].double(), rtol=1e-5, atol=1e-6)
    # our causal checkpoint: its own attention probabilities from capture()
    subject = load_subject(ckpt=tiny_ckpt)
    lm = CharLM.load_from_checkpoint(tiny_ckpt, map_location="cpu", weights_only=True).eval()
    ids = torch.as_tensor(np.asarray(lm.vocab.encode(TEXT.encode()), dtype=np.int64))[None]
    with torch.no_grad():
        attention = lm.model.capture(ids, attention=True).attention
    for S, P in zip(scores.text_scores(subject, TEXT), attention, strict=True):
        torch.testing.assert_close(S.softmax(-1), P[0].double(), rtol=1e-5, atol=1e-6)


def test_statistics_are_those_of_the_scores(tiny_gpt2, tmp_path):
    texts = [TEXT, "a dog."]
    subject = load_subject(hf=tiny_gpt2)
    table = scores_command.main([f"hf={tiny_gpt2}", f"text={texts[0]}", f"text={texts[1]}",
                         f"out={tmp_path}"])
    written = pd.read_csv(tmp_path / "scores.csv")
    assert (tmp_path / "scores.png").stat().st_size > 10_000
    assert (tmp_path / "extremes.png").stat().st_size > 10_000
    assert len(written) == 2 * len(scores.STATISTICS)
    assert written["layer_name"].unique().tolist() == ["block_1", "block_2"]
    pd.testing.assert_frame_equal(written.drop(columns="model"), table.drop(columns="model"),
                                  check_dtype=False)
    # Independent numpy statistics from the weights' scores of both texts (layer 2).
    per_text = [_weights_scores(tiny_gpt2, t)[0][1].numpy() for t in texts]
    allowed = [np.isfinite(S) for S in per_text]
    every = np.concatenate([S[a] for S, a in zip(per_text, allowed, strict=True)])
    # rows with two keys or more: a decoder's first row has one, so max = min there
    row_max = np.concatenate([S[:, 1:].max(-1).ravel() for S in per_text])
    row_min = np.concatenate([np.where(a, S, np.inf)[:, 1:].min(-1).ravel()
                              for S, a in zip(per_text, allowed, strict=True)])
    seq_max = np.concatenate([S.max(axis=(1, 2)) for S in per_text])  # per text and head
    block_2 = written[written["layer"] == 2].set_index("statistic")
    n = sum(len(t) * (len(t) + 1) // 2 for t in texts) * 4  # causal pairs x 4 heads
    assert block_2.loc["score", "n"] == n == every.size
    assert block_2.loc["row_max", "n"] == row_max.size == 4 * (len(TEXT) - 1 + len(texts[1]) - 1)
    for statistic, x in (("score", every), ("row_max", row_max), ("row_min", row_min),
                         ("sequence_max", seq_max)):
        row = block_2.loc[statistic]
        # float32 forward passes on both sides: rounding of order 1e-6 of the scores
        assert row["mean"] == pytest.approx(x.mean(), abs=1e-5), statistic
        assert row["q50"] == pytest.approx(np.median(x), abs=1e-5), statistic
        assert row["q95"] == pytest.approx(np.quantile(x, 0.95), abs=1e-5), statistic
        assert row["max"] == pytest.approx(x.max(), abs=1e-5), statistic
    assert (block_2.loc["row_max", "mean"] > block_2.loc["score", "mean"]
            > block_2.loc["row_min", "mean"])
    # A subset of the scores (max_scores) keeps the extremes exact
    few = scores.collect(subject, texts, max_scores=100)
    everything = scores.collect(subject, texts)
    assert few[1].score.size == 100 and few[1].n_scores == n
    np.testing.assert_array_equal(few[1].row_max, everything[1].row_max)
    assert np.isin(few[1].score, everything[1].score).all()
    # ... and is uniform over all texts: a cap of half the scores keeps about half of each text's
    half = scores.collect(subject, texts, max_scores=n // 2)
    for text in texts:
        own = scores.collect(subject, [text])[1].score
        assert np.isin(own, half[1].score).mean() == pytest.approx(0.5, abs=0.1)


def test_bad_input_fails_with_its_name(tiny_gpt2, tmp_path):
    bad_csv = tmp_path / "texts.csv"
    pd.DataFrame({"sentence": ["a b"]}).to_csv(bad_csv, index=False)
    with pytest.raises(ValueError, match="has no 'text' column"):
        scores_command.main([f"hf={tiny_gpt2}", f"csv={bad_csv}", f"out={tmp_path}"])
    with pytest.raises(ValueError, match="give text=... and/or csv="):
        scores_command.main([f"hf={tiny_gpt2}", f"out={tmp_path}"])
    with pytest.raises(ValueError, match="give exactly one of hf="):
        scores_command.main([f"out={tmp_path}", "text=abc"])
    subject = load_subject(hf=tiny_gpt2)
    with pytest.raises(ValueError, match="no query row attends to two positions"):
        scores.collect(subject, ["a"])
    with pytest.raises(ValueError, match="no text given"):
        scores.collect(subject, [])
    with pytest.raises(ValueError, match="max_scores"):
        scores.collect(subject, [TEXT], max_scores=0)
    electra = tmp_path / "electra"
    build_tiny_hf("electra", electra)
    with pytest.warns(UserWarning, match="no query/key hooks"):
        subject = load_subject(hf=str(electra))
    with pytest.raises(ValueError, match="queries and keys of model family 'electra'"):
        scores.collect(subject, [TEXT])
