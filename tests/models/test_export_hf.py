"""`export_hf`: our checkpoints as Hugging Face folders that compute exactly what we compute.

Checkpoints come from real tiny `train.py` runs of every kind of model (decoder/encoder x pre/post
LN); their weights are then drawn with std 0.3, so a transposed, swapped or mis-split weight
changes every output by far more than float32 rounding.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_runs import subprocess_env
from hydra_configs import compose_train

from repgeom.cli.export_hf import main
from repgeom.data import enwik8
from repgeom.data.vocab import Vocab
from repgeom.models.export_hf import build_tokenizer, bytes_to_unicode, export_hf
from repgeom.models.hf import hf_capture, load_hf_model
from repgeom.models.lightning_module import CharLM
from repgeom.train import train

# (model, masking) -> the class the export must write (module docstring of export_hf).
KINDS = {
    ("gpt_tiny", "causal"): "GPT2LMHeadModel",
    ("gpt_tiny", "bidirectional"): "XLMRobertaXLModel",
    ("bert_small", "bidirectional"): "BertModel",
    ("bert_small", "causal"): "BertModel",
}
# Float32 on O(1) activations: the two implementations differ only in summation order (fused
# vs. split projections, SDPA vs. an explicit softmax), which moves values by ~1e-6.
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """`checkpoint(model, masking)` -> last.ckpt of a 2-step tiny run, weights redrawn."""
    made: dict[tuple[str, str], Path] = {}

    def make(model: str, masking: str) -> Path:
        if (model, masking) not in made:
            run = tmp_path_factory.mktemp(f"{model}_{masking}")
            overrides = ["probe=none", "logger=csv", "trainer.max_steps=2",
                         "trainer.val_check_interval=2", f"model={model}",
                         f"masking={masking}"]  # fmt: skip
            train(compose_train(run, overrides))
            path = run / "checkpoints" / "last.ckpt"
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
            generator = torch.Generator().manual_seed(0)
            seen = set()
            for tensor in ckpt["state_dict"].values():  # tied tensors share storage: draw once
                if tensor.data_ptr() not in seen:
                    seen.add(tensor.data_ptr())
                    tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.3)
            torch.save(ckpt, path)
            made[model, masking] = path
        return made[model, masking]

    return make


def load_ours(path: Path):
    return CharLM.load_from_checkpoint(path, map_location="cpu", weights_only=True).eval()


# ---------------------------------------------------------------------------------------------
# Weights


@pytest.mark.parametrize("model, masking", list(KINDS))
def test_export_computes_what_the_checkpoint_computes(tmp_path, checkpoint, model, masking):
    from transformers import AutoModel

    ckpt = checkpoint(model, masking)
    folder = export_hf(ckpt, tmp_path / "hf")
    ours = load_ours(ckpt)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == [KINDS[model, masking]]

    hf = AutoModel.from_pretrained(folder).eval()
    V, T = ours.vocab.size, ours.model.config.block_size
    ids = torch.randint(0, V, (3, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cap = ours.model.capture(ids, attention=False)
        out = hf(input_ids=ids, output_hidden_states=True)
    # Hugging Face's hidden states: the embedding output and each block's input, then the
    # final norm's output where there is one (pre-LN), else the last block's output.
    last = cap.final_norm if cap.final_norm is not None else cap.hidden[-1]
    assert (cap.final_norm is None) == (ours.model.config.norm == "post")
    expected = [*cap.hidden[:-1], last]
    assert len(out.hidden_states) == len(expected)
    for h, r in zip(out.hidden_states, expected, strict=True):
        torch.testing.assert_close(h, r, **TOL)


def test_decoder_logits_equal_ours(tmp_path, checkpoint):
    from transformers import AutoModelForCausalLM

    ckpt = checkpoint("gpt_tiny", "causal")
    folder = export_hf(ckpt, tmp_path / "hf")
    ours = load_ours(ckpt)
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    # The exact GELU (nn.GELU), not GPT-2's tanh approximation "gelu_new".
    assert hf.config.activation_function == "gelu"
    ids = torch.randint(0, ours.vocab.size, (4, ours.model.config.block_size))
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).logits, ours.model(ids), **TOL)
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # tied


@pytest.mark.parametrize("model, masking", list(KINDS))
def test_hf_capture_of_the_export_equals_our_capture(tmp_path, checkpoint, model, masking):
    """Both probe paths read the same states: hidden (before the final norm), final norm,
    queries, keys and attention, layer by layer."""
    ckpt = checkpoint(model, masking)
    hf = load_hf_model(export_hf(ckpt, tmp_path / "hf"))
    ours = load_ours(ckpt)
    assert hf.is_decoder == ours.model.config.causal
    ids = torch.randint(0, ours.vocab.size, (2, ours.model.config.block_size))
    theirs = hf_capture(hf, ids)
    mine = ours.model.capture(ids)
    assert theirs.valid.all()  # no special tokens in our vocabulary's text ids
    pairs = {
        "hidden": (mine.hidden, theirs.hidden),
        "queries": (mine.queries, theirs.queries),
        "keys": (mine.keys, theirs.keys),
        "attention": (mine.attention, theirs.attention),
    }
    for name, (a, b) in pairs.items():
        assert len(a) == len(b) > 0, name
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(y, x, **TOL)
    if mine.final_norm is None:
        assert theirs.final_norm is None
    else:
        torch.testing.assert_close(theirs.final_norm, mine.final_norm, **TOL)


def test_model_without_biases_exports_exactly(tmp_path):
    """bias=false: a LayerNorm or Linear without bias is one with a zero bias."""
    from repgeom.models.export_hf import to_hf
    from repgeom.models.gpt import GPT, GPTConfig

    for causal in (True, False):
        model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=2, n_head=2, n_embd=16,
                              bias=False, causal=causal)).eval()  # fmt: skip
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.3)
        hf = to_hf(model)
        ids = torch.randint(0, 20, (2, 8))
        with torch.no_grad():
            cap = model.capture(ids, attention=False)
            out = hf(input_ids=ids, output_hidden_states=True)
        torch.testing.assert_close(out.hidden_states[-1], cap.final_norm, **TOL)
        torch.testing.assert_close(out.hidden_states[1], cap.hidden[1], **TOL)


@pytest.mark.slow
def test_cli_writes_a_folder_that_loads_without_repgeom(tmp_path, checkpoint):
    ckpt = checkpoint("gpt_tiny", "causal")
    folder = main([str(ckpt), str(tmp_path / "hf")])
    text = enwik8.split(enwik8.load_raw("sample")[0])[1][:500].decode("utf-8", "replace")
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    script = f"""
import sys, numpy as np, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained({str(folder)!r})
model = AutoModelForCausalLM.from_pretrained({str(folder)!r}).eval()
text = open({str(tmp_path / "text.txt")!r}, encoding="utf-8").read()
ids = tok(text)["input_ids"][:{load_ours(ckpt).model.config.block_size}]
with torch.no_grad():
    logits = model(input_ids=torch.tensor([ids])).logits[0]
np.save({str(tmp_path / "ids.npy")!r}, np.array(ids))
np.save({str(tmp_path / "logits.npy")!r}, logits.numpy())
assert not [m for m in sys.modules if m.startswith("repgeom")], "repgeom was imported"
"""
    env = subprocess_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("PYTHONPATH", None)  # only what a user without repgeom on the path has
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    ours = load_ours(ckpt)
    ids = np.load(tmp_path / "ids.npy")
    assert ids.tolist() == ours.vocab.encode(text.encode("utf-8"))[: len(ids)].tolist()
    with torch.no_grad():
        expected = ours.model(torch.from_numpy(ids)[None])[0]
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "logits.npy")), expected, **TOL)


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        export_hf(tmp_path / "nope.ckpt", tmp_path / "out")


# ---------------------------------------------------------------------------------------------
# Tokenizer


def test_byte_alphabet_is_the_tokenizers_bytelevel_one():
    from tokenizers import pre_tokenizers

    table = bytes_to_unicode()
    assert sorted(table) == list(range(256))
    assert set(table.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert all(table[b] == chr(b) for b in range(ord("!"), ord("~") + 1))  # printable: itself
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"  # GPT-2's well-known pair


def texts_to_check() -> list[str]:
    """Text of every kind: enwik8 (markup, entities, non-ASCII), specials' names, control and
    unseen bytes, and random Unicode from every plane."""
    data, _ = enwik8.load_raw("sample")
    valid = enwik8.split(data)[1].decode("utf-8", errors="replace")
    rng = np.random.default_rng(0)
    texts = [valid[i : i + 2000] for i in range(0, len(valid), len(valid) // 8)]
    texts += [
        "",
        " ",
        "\n\n\t\r\n  ",
        "[MASK] [UNK] [PAD] [MASK][MASK]",
        "<page><title>Ünïcødé — “quotes” &amp; €</title></page>",
        "\x00\x01\x7f emoji 😀🧪 CJK 漢字 RTL שלום",
    ]
    for _ in range(20):  # random code points, surrogates (not encodable in UTF-8) excluded
        points = rng.integers(0, 0x10FFFF, size=int(rng.integers(1, 50)))
        texts.append("".join(chr(p) for p in points if not 0xD800 <= p <= 0xDFFF))
    texts.append("".join(chr(p) for p in rng.integers(32, 256, size=300)))  # Latin-1 range
    return texts


@pytest.mark.parametrize("pad", [False, True])
def test_tokenizer_gives_our_ids_for_any_text(tmp_path, pad):
    from transformers import AutoTokenizer

    data, _ = enwik8.load_raw("sample")
    vocab = Vocab.from_bytes(enwik8.split(data)[0])
    build_tokenizer(vocab, model_max_length=64, pad=pad).save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)  # from the files alone
    assert (tok.mask_token_id, tok.unk_token_id) == (vocab.mask_id, vocab.unk_id)
    assert tok.pad_token_id == (vocab.size if pad else None)
    assert tok.bos_token_id is None and tok.eos_token_id is None
    for text in texts_to_check():
        expected = vocab.encode(text.encode("utf-8")).tolist()
        got = tok(text, verbose=False)["input_ids"]
        assert got == expected, text[:80]
        if vocab.unk_id not in expected:  # every byte known: decoding gives the text back
            assert tok.decode(got) == text


def test_tokenizer_of_a_small_vocabulary_maps_unseen_bytes_to_unk(tmp_path):
    vocab = Vocab.from_bytes(b"abc\n")
    tok = build_tokenizer(vocab, model_max_length=8)
    # Ids in byte order: \n (10) -> 0, a -> 1, b -> 2, c -> 3; "é" is two unseen bytes.
    assert tok("ab\ncé")["input_ids"] == [1, 2, 0, 3, 5, 5]
    # A literal "[MASK]" is six bytes, none of them seen (split_special_tokens), not the mask.
    assert tok("[MASK]")["input_ids"] == [5] * 6
    assert (vocab.mask_id, vocab.unk_id) == (4, 5)
