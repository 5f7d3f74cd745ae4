"""The LM loss rows on the probe's own windows: `probe.py ckpt=` of a decoder and of an encoder
equals the training module's own validation loss on the same windows and positions, and the
training callback writes the same rows."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra_configs import compose_job, compose_probe, compose_train

from repgeom.models.checkpoints import read_checkpoint
from repgeom.models.lightning_module import CharLM
from repgeom.probes.core import table
from repgeom.probes.core.targets import checkpoint_probe_set, checkpoint_spec
from repgeom.probes.run.job import probe_request
from repgeom.probes.run.runner import probe
from repgeom.train import train

SMALL = ["n_states=192", "settings.max_order=8", "settings.state_batch_size=192",
         "metrics=[default]", "settings.distributions=false", "device=cpu", "plot_metrics=[]"]


@pytest.fixture(scope="module")
def encoder_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("encoder")
    train(compose_train(run_dir, ["logger=csv", "masking=bidirectional"]))
    return run_dir


def _model_rows(frame, step=None):
    rows = frame.loc[frame["layer"] == table.MODEL_LAYER]
    if step is not None:
        rows = rows.loc[rows["step"] == step]
    assert (rows["layer_name"] == "model").all()
    return rows.set_index("metric")


def _validation_loss(path: Path) -> float:
    """The training module's own loss (`CharLM._loss`/`_logits_loss`, what validation_step
    logs) on the windows `probe.py ckpt=` draws, at the positions it predicts."""
    module = CharLM.load_from_checkpoint(path, map_location="cpu").eval()
    ckpt = read_checkpoint(path)
    request = probe_request(compose_probe(path.parent, SMALL))
    spec, _ = checkpoint_spec(request, path, ckpt)
    probes = checkpoint_probe_set(path, ckpt, module.vocab, module.model.config.block_size, spec)
    windows = probes.windows
    with torch.no_grad():
        if module.causal:  # the next character at each sampled position inside its window
            targets = torch.full_like(windows, -100)
            targets[:, :-1] = torch.where(probes.positions[:, :-1], windows[:, 1:], -100)
            return float(module._logits_loss(windows, targets))
        # an encoder: validation's masking of the windows (one extra column, which _loss drops)
        padded = torch.cat([windows, windows[:, :1]], dim=1)
        return float(module._loss(padded, generator_seed=spec.seed)[0])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["decoder", "encoder"])
def test_probe_py_bpc_equals_the_validation_loss_on_the_same_windows(
        kind, trained_run, encoder_run, tmp_path) -> None:
    run = trained_run if kind == "decoder" else encoder_run
    path = run / "checkpoints" / "last.ckpt"
    frame = probe(compose_job(tmp_path, [f"ckpt={path}", *SMALL])).frame
    rows = _model_rows(frame)
    expected = _validation_loss(path)
    # float32 logits on both sides, other kernels (the probe's head runs on the sampled rows):
    # measured 7e-7 (decoder) and 3e-8 (encoder); the bound asked for is 1e-4
    assert rows.loc["lm_loss", "value"] == pytest.approx(expected, abs=1e-4)
    assert rows.loc["bpc", "value"] == pytest.approx(expected / math.log(2), abs=1e-4)
    assert 0 < rows.loc["lm_loss", "std"] < 0.2 * rows.loc["lm_loss", "value"]


@pytest.mark.slow
def test_the_training_callback_writes_the_loss_rows_at_every_probe_step(trained_run) -> None:
    frame = table.read_table(trained_run)
    steps = sorted(set(frame.loc[frame["layer"] >= 0, "step"]))
    for step in steps:
        rows = _model_rows(frame, step)
        assert set(rows.index) == {"lm_loss", "bpc"}
        assert rows.loc["bpc", "value"] == pytest.approx(rows.loc["lm_loss", "value"]
                                                         / math.log(2), rel=1e-12)
    first, last = (_model_rows(frame, s).loc["lm_loss", "value"] for s in (steps[0], steps[-1]))
    assert first == pytest.approx(math.log(205), rel=0.1)  # untrained: about uniform
    assert last < first  # trained for 20 steps


HF_SMALL = ["n_states=96", "settings.max_order=8", "settings.state_batch_size=96",
            "metrics=[default]", "settings.distributions=false", "device=cpu", "plot_metrics=[]",
            "window=32"]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "opt", "gemma2"])  # opt: a BOS token first,
# left out; gemma2: logits soft-capped (final_logit_softcapping)
def test_probe_py_hf_lm_loss_equals_the_models_own_loss(family, tiny_hf_folder, text_file,
                                                         tmp_path) -> None:
    """`probe.py hf=<tiny decoder>`: lm_loss is AutoModelForCausalLM's own loss (its forward
    with labels) on the same windows, at the tokens after the probed states."""
    from transformers import AutoModelForCausalLM

    from repgeom.models.hf import load_hf_model
    from repgeom.probes.core.spec import resolve
    from repgeom.probes.core.targets import hf_probe_set

    folder = tiny_hf_folder(family)
    args = [f"hf={folder}", f"text_file={text_file}", *HF_SMALL]
    rows = _model_rows(probe(compose_job(tmp_path, args)).frame)
    request = probe_request(compose_probe(tmp_path, args))
    probes = hf_probe_set(load_hf_model(folder), request, resolve(request))
    ids, mask, positions = probes.windows, probes.attention_mask, probes.positions
    labels = torch.full_like(ids, -100)  # the model shifts them: logits at p predict label p+1
    follows = positions[:, :-1] & mask[:, 1:].bool()
    labels[:, 1:] = torch.where(follows, ids[:, 1:], -100)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        own = float(model(input_ids=ids, attention_mask=mask, labels=labels).loss)
    # float32 on both sides, the head applied to the same final states: measured ~1e-7
    assert rows.loc["lm_loss", "value"] == pytest.approx(own, abs=1e-5)
    # the tiny tokenizers' tokens are one character each (their offsets say so)
    assert rows.loc["bpc", "value"] == pytest.approx(own / math.log(2), abs=1e-5)


@pytest.mark.slow
def test_a_decoder_saved_without_its_head_gets_no_loss_rows(tiny_hf_folder, text_file,
                                                            tmp_path) -> None:
    """The tiny Llama is saved as its base model, and Llama's head is not tied to its
    embedding: the head is not in the weights, so no loss is written (and it says why)."""
    args = [f"hf={tiny_hf_folder('llama')}", f"text_file={text_file}", *HF_SMALL]
    with pytest.warns(UserWarning, match="no language-model head"):
        frame = probe(compose_job(tmp_path, args)).frame
    assert not (frame["layer"] == table.MODEL_LAYER).any()
    assert (frame["metric"] == "anisotropy").any()


@pytest.mark.slow
def test_the_loss_is_drawn_beside_the_intrinsic_dimension(trained_run) -> None:
    from repgeom.probes.report.plots.loss import loss_beside_id

    frame = table.read_table(trained_run)
    fig = loss_beside_id(frame)
    top, bottom = fig.axes
    bpc = _model_rows(frame).loc["bpc"].sort_values("step")
    x, y = bottom.lines[0].get_data()
    assert list(x) == bpc["step"].tolist() and list(y) == pytest.approx(bpc["value"].tolist())
    assert len(top.lines[0].get_xdata()) == len(x)
    # the training run's end-of-run figures include it (conf/probe/default.yaml plot_metrics)
    assert (table.plot_dir(trained_run) / "loss_beside_id.png").is_file()


def _byte_level_hf(text: str):
    """A GPT-2-style byte-level BPE tokenizer trained on `text` (multi-byte characters split
    into byte tokens), as the `hf` that the window functions read."""
    from types import SimpleNamespace

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator([text[:200]], trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=backend)
    return SimpleNamespace(tokenizer=tok, model=SimpleNamespace(config=SimpleNamespace()),
                           name="byte-level")


def test_hf_characters_per_token_partition_the_text() -> None:
    """bpc's characters (UTF-8 bytes, as enwik8 and our byte-level models count them) come from
    the offset mapping: they add up to the text the windows hold (its decoded bytes, an
    independent count); counting each token decoded alone is off (a byte of a multi-byte
    character decodes to a 3-byte replacement character); our export's byte tokens are one
    each, as in the ckpt= probe of the same model."""
    from types import SimpleNamespace

    from repgeom.data.vocab import Vocab
    from repgeom.models.export_hf import build_tokenizer
    from repgeom.models.hf.windows import tokenize_windows, window_characters

    text = "Le café déjà vu — naïve façade, über straße; the quick brown fox 🦊 jumps. " * 30
    hf = _byte_level_hf(text)
    ids, _ = tokenize_windows(hf, text, window=16)
    characters = window_characters(hf, text, window=16)
    assert characters.shape == ids.shape and (characters >= 0).all()
    held = len(hf.tokenizer.decode(ids.flatten().tolist()).encode("utf-8"))
    assert float(characters.sum()) == pytest.approx(held, abs=1e-9)
    by_decode = sum(len(hf.tokenizer.decode([t]).encode("utf-8")) for t in ids.flatten().tolist())
    assert abs(by_decode - held) > 0.02 * held  # the bias the offsets remove
    ours = SimpleNamespace(tokenizer=build_tokenizer(Vocab(range(256)), model_max_length=64),
                           model=SimpleNamespace(config=SimpleNamespace()), name="export")
    assert (window_characters(ours, text, window=16) == 1).all()


def test_hf_targets_leave_out_special_tokens_and_read_the_characters() -> None:
    from repgeom.probes.core.prediction.lm_loss import hf_targets

    windows = torch.tensor([[2, 10, 11, 12, 3, 0], [2, 13, 14, 15, 16, 3]])  # BOS .. EOS, pad
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    valid = torch.tensor([[1, 1, 1, 1, 1, 0], [0, 1, 0, 0, 1, 0]], dtype=torch.bool)
    characters = torch.tensor([[0, 1, 2, 3, 0, 0], [0, 4, 5, 6, 7, 0]], dtype=torch.float64)
    targets, has, chars = hf_targets(windows, valid, mask, characters, torch.tensor([0, 2, 3]))
    assert targets.tolist() == [10, 11, 12, 3, 0, 14, 3]
    # an EOS (or padding, or the window's end) is no text to predict
    assert has.tolist() == [True, True, True, False, False, True, False]
    assert chars.tolist()[:3] == [1, 2, 3] and chars[5] == 5
    _, _, none = hf_targets(windows, valid, mask, None, torch.tensor([0, 2, 3]))
    assert np.isnan(none).all()


def _tiny_masked_lm(folder: Path) -> str:
    """A tiny BERT with its masked-LM head and a tokenizer with a mask token, one token per
    character (the tests' tiny text is in its vocabulary)."""
    from tokenizers import Tokenizer, models, processors
    from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast

    tokens = ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz .,;:'\n"]
    vocab = {t: i for i, t in enumerate(tokens)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    PreTrainedTokenizerFast(tokenizer_object=backend, cls_token="[CLS]", sep_token="[SEP]",
                            pad_token="<pad>", unk_token="<unk>",
                            mask_token="[MASK]").save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                        pad_token_id=0)
    BertForMaskedLM(config).save_pretrained(folder)
    return str(folder)


@pytest.mark.slow
def test_probe_py_hf_encoder_lm_loss_equals_the_masked_lm_own_loss(text_file, tmp_path) -> None:
    """`probe.py hf=<tiny BERT with its MLM head>`: lm_loss is AutoModelForMaskedLM's own loss
    (its forward with labels) on the probe's windows, masked with the probe's seed."""
    from transformers import AutoModelForMaskedLM

    from repgeom.models.hf import load_hf_model, special_token_ids
    from repgeom.probes.core.prediction.lm_loss import hf_mlm_mask
    from repgeom.probes.core.spec import resolve
    from repgeom.probes.core.targets import hf_probe_set

    folder = _tiny_masked_lm(tmp_path / "bert_mlm")
    args = [f"hf={folder}", f"text_file={text_file}", *HF_SMALL]
    rows = _model_rows(probe(compose_job(tmp_path / "out", args)).frame)
    request = probe_request(compose_probe(tmp_path, args))
    hf = load_hf_model(folder)
    assert hf.lm is not None and not hf.is_decoder
    spec = resolve(request)
    probes = hf_probe_set(hf, request, spec)
    special = torch.tensor(special_token_ids(hf.tokenizer))
    inputs, labels = hf_mlm_mask(probes.windows, probes.attention_mask, special,
                                 hf.tokenizer.mask_token_id, spec.seed)
    assert 0.05 < (labels != -100).float().mean() < 0.3  # ~15% of the text tokens
    assert not torch.isin(labels[labels != -100], special).any()
    model = AutoModelForMaskedLM.from_pretrained(folder).eval()
    with torch.no_grad():
        own = float(model(input_ids=inputs, attention_mask=probes.attention_mask,
                          labels=labels).loss)
    # float32 on both sides, the same forward in batches: measured ~1e-7
    assert rows.loc["lm_loss", "value"] == pytest.approx(own, abs=1e-5)
    assert rows.loc["bpc", "value"] == pytest.approx(own / math.log(2), abs=1e-5)
