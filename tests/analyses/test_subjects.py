import doctest
import importlib

import numpy as np
import pytest
import torch

from repgeom.analyses.subjects import CheckpointSubject, HFSubject, load_subject, pool
from repgeom.models.hf import TokenizerMissingError, load_tokenizer_or_explain

TEXT = "Cats sleep a lot."


def test_folder_without_tokenizer_is_explained(tiny_hf_dir):
    folder = tiny_hf_dir / "model"  # save_pretrained of the model alone
    with pytest.raises(TokenizerMissingError, match=r"model has no tokenizer; pass tokenizer="):
        load_tokenizer_or_explain(folder)
    with pytest.raises(ValueError, match="has no tokenizer"):  # also through the loader
        load_subject(hf=str(folder))
    tok = load_tokenizer_or_explain(folder, tokenizer=str(tiny_hf_dir / "tokenizer"))
    assert tok(TEXT)["input_ids"][1:-1] == [tok.convert_tokens_to_ids(c) for c in TEXT]
    with pytest.raises(TokenizerMissingError, match="without tokenizer files"):
        load_tokenizer_or_explain(folder, tokenizer=str(folder))


def test_tokenizer_override_gives_the_same_states(tiny_hf_dir):
    a = HFSubject(tiny_hf_dir / "model_and_tokenizer")
    b = load_subject(hf=str(tiny_hf_dir / "model"), tokenizer=str(tiny_hf_dir / "tokenizer"))
    assert a.layer_names == ["embedding", "block_1", "block_2"]  # post-LN BERT: no final norm
    sa, sb = a.states(TEXT), b.states(TEXT)
    # one row per character: [CLS] and [SEP] are left out as in the probes
    assert [h.shape for h in sa] == [(len(TEXT), 32)] * 3
    for x, y in zip(sa, sb, strict=True):
        torch.testing.assert_close(x, y)
    assert a.tokens(TEXT) == list(TEXT)


def test_hf_states_are_hf_capture(tiny_hf_dir):
    from repgeom.models.hf import hf_capture

    s = HFSubject(tiny_hf_dir / "model_and_tokenizer")
    enc = s.hf.tokenizer(TEXT, return_tensors="pt")
    cap = hf_capture(s.hf, enc["input_ids"], enc["attention_mask"], attention=False)
    torch.testing.assert_close(s.states(TEXT)[2], cap.hidden[2][0, 1:-1])


def test_checkpoint_states(tiny_ckpt):
    s = load_subject(ckpt=str(tiny_ckpt))
    assert isinstance(s, CheckpointSubject)
    assert s.layer_names == ["embedding", "block_1", "block_2", "final_norm"]  # pre-LN
    states = s.states(TEXT)
    assert [h.shape for h in states] == [(len(TEXT), 16)] * 4
    ids = torch.as_tensor(s.lm.vocab.encode(TEXT.encode()).astype(np.int64))[None]
    cap = s.lm.model.capture(ids, attention=False)
    torch.testing.assert_close(states[1], cap.hidden[1][0])
    torch.testing.assert_close(states[-1], cap.final_norm[0])
    assert s.tokens(TEXT) == list(TEXT)
    long = "ab " * 40  # 120 bytes, block_size 64: two windows, 64 and 56 bytes, joined
    joined = s.states(long)
    assert [h.shape[0] for h in joined] == [120] * 4 and s.tokens(long) == list(long)
    first = s.lm.model.capture(ids.new_tensor(s.lm.vocab.encode(long[:64].encode()))[None],
                               attention=False)
    second = s.lm.model.capture(ids.new_tensor(s.lm.vocab.encode(long[64:].encode()))[None],
                                attention=False)
    torch.testing.assert_close(joined[1], torch.cat([first.hidden[1][0], second.hidden[1][0]]))
    with pytest.raises(ValueError, match="longer than one window"):
        s.queries_keys(long)


def test_load_subject_errors(tiny_ckpt):
    with pytest.raises(ValueError, match="exactly one"):
        load_subject()
    with pytest.raises(ValueError, match="tokenizer= is for hf"):
        load_subject(ckpt=str(tiny_ckpt), tokenizer="gpt2")
    with pytest.raises(FileNotFoundError):
        load_subject(ckpt="/nonexistent.ckpt")


def test_pool():
    h = torch.tensor([[1.0, 0], [3, 2]])
    assert pool(h).tolist() == [2, 1] and pool(h, "last").tolist() == [3, 2]
    with pytest.raises(ValueError, match="pooling"):
        pool(h, "max")


@pytest.mark.parametrize(
    "module", ["repgeom.analyses.example_data", "repgeom.probes.report.drift_cosine"])
def test_docstring_examples(module):
    module = importlib.import_module(module)
    assert doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE).failed == 0
