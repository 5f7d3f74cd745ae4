"""Tiny models for the analyses, built on disk with no download.

- ``tiny_hf_dir``: a 2-layer random BERT saved with ``save_pretrained`` and a character-level
  tokenizer (a `tokenizers` BPE model without merges; CLS ... SEP around every text);
- ``tiny_ckpt``: a Lightning-format checkpoint of a 2-layer random `CharLM` (written by hand:
  ``state_dict`` + ``hyper_parameters``, what ``load_from_checkpoint`` reads), no training.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch

CHARS = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:'!?\n")
SPECIALS = ["<pad>", "<unk>", "[CLS]", "[SEP]"]
VOCAB = {t: i for i, t in enumerate(SPECIALS + CHARS)}


@pytest.fixture(scope="session")
def tiny_hf_dir(tmp_path_factory):
    import transformers
    from tokenizers import Tokenizer, models, processors
    from transformers import AutoModel, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny_bert")
    config = transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=128, pad_token_id=0)
    torch.manual_seed(0)
    model = AutoModel.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    model.save_pretrained(folder / "model")
    backend = Tokenizer(models.BPE(vocab=VOCAB, merges=[], unk_token="<unk>"))
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, cls_token="[CLS]", sep_token="[SEP]",
                                  pad_token="<pad>", unk_token="<unk>")
    model.save_pretrained(folder / "model_and_tokenizer")
    tok.save_pretrained(folder / "model_and_tokenizer")
    tok.save_pretrained(folder / "tokenizer")
    return folder


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    from repgeom.data.vocab import Vocab
    from repgeom.models.lightning_module import CharLM

    torch.manual_seed(0)
    hparams = dict(
        model=dict(vocab_size=0, name="tiny", block_size=64, n_layer=2, n_head=2, n_embd=16),
        masking=dict(name="causal", causal=True),
        optim=dict(),
        vocab=Vocab.from_bytes("".join(CHARS).encode()).to_dict(),
    )
    hparams["model"]["vocab_size"] = Vocab.from_dict(hparams["vocab"]).size
    lm = CharLM(**hparams)
    path = tmp_path_factory.mktemp("ckpt") / "tiny.ckpt"
    torch.save({"state_dict": lm.state_dict(), "hyper_parameters": dict(lm.hparams),
                "pytorch-lightning_version": L.__version__}, path)
    return path

