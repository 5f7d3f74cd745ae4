"""recipe.pad_vocab (issue 41): the embedding/output matrix padded to a multiple of 64 rows
changes neither the initial weights, the loss, its gradients, the captured states nor the
checkpoints' keys and shapes, and checkpoints of either layout load into the other."""

from pathlib import Path

import pytest
import torch
from hydra_configs import compose_train
from omegaconf import OmegaConf

from repgeom.data.vocab import Vocab
from repgeom.models.gpt import GPT, GPTConfig
from repgeom.models.lightning_module import CharLM
from repgeom.models.recipe import VOCAB_MULTIPLE, vocab_multiple

VOCAB = 207  # enwik8's byte vocabulary with [MASK] and [UNK]: gpt_small's 207 symbols


def _gpt(multiple: int, causal: bool = True) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, block_size=32, n_layer=2, n_head=2, n_embd=32,
                         causal=causal, vocab_multiple=multiple))


def test_the_matrix_is_padded_to_256_rows_and_the_state_dict_is_not() -> None:
    plain, padded = _gpt(1), _gpt(VOCAB_MULTIPLE)
    assert padded.lm_head.weight.shape == (256, 32) and padded.config.padded_vocab_size == 256
    assert padded.transformer.wte.weight is padded.lm_head.weight  # still tied
    assert torch.count_nonzero(padded.lm_head.weight[VOCAB:]) == 0
    # the same keys, shapes and values as the unpadded model seeded alike: the vocabulary rows
    # draw the same random numbers, and every later weight too
    want, got = plain.state_dict(), padded.state_dict()
    assert list(got) == list(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key
    assert padded.num_params() == plain.num_params()  # N of MFU: padding is layout


@pytest.mark.parametrize("causal", [True, False])
def test_the_loss_gradients_and_captured_states_are_unchanged(causal: bool) -> None:
    plain, padded = _gpt(1, causal), _gpt(VOCAB_MULTIPLE, causal)
    idx = torch.randint(0, VOCAB, (3, 32), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, VOCAB, (3, 32), generator=torch.Generator().manual_seed(2))
    losses = []
    for model in (plain, padded):
        logits = model(idx)
        assert logits.shape == (3, 32, VOCAB)  # the padded logits never reach a loss
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        losses.append(loss)
    # another matmul width (256 columns, not 207) may sum in another order: float32 rounding
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=0)
    grad = padded.lm_head.weight.grad
    assert torch.count_nonzero(grad[VOCAB:]) == 0  # the padding rows never learn
    torch.testing.assert_close(grad[:VOCAB], plain.lm_head.weight.grad, rtol=1e-5, atol=1e-8)
    # what the probes read: the embedding lookup and blocks, no output layer: bit for bit
    a, b = plain.capture(idx), padded.capture(idx)
    for x, y in zip([*a.hidden, *a.queries, *a.keys, *a.attention],
                    [*b.hidden, *b.queries, *b.keys, *b.attention], strict=True):
        assert torch.equal(x, y)


def test_checkpoints_of_either_layout_load_into_the_other() -> None:
    plain, padded = _gpt(1), _gpt(VOCAB_MULTIPLE)
    with torch.no_grad():
        for p in plain.parameters():
            p.add_(torch.randn_like(p))
    padded.load_state_dict(plain.state_dict())  # an old checkpoint into the padded layout
    assert torch.equal(padded.lm_head.weight[:VOCAB], plain.lm_head.weight)
    assert torch.count_nonzero(padded.lm_head.weight[VOCAB:]) == 0
    fresh = _gpt(1)
    fresh.load_state_dict(padded.state_dict())  # and back: a GPU run's checkpoint on the CPU
    for key, value in plain.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


def test_pad_vocab_is_on_for_cuda_only_and_off_under_recipe_off(tmp_path: Path) -> None:
    default = OmegaConf.to_container(compose_train(tmp_path).recipe)
    off = OmegaConf.to_container(compose_train(tmp_path, ["recipe=off"]).recipe)
    assert vocab_multiple(default, "cuda") == 64 and vocab_multiple(default, "cpu") == 1
    assert vocab_multiple(off, "cuda") == 1


def test_a_charlm_checkpoint_round_trip_keeps_the_padding(tmp_path: Path) -> None:
    cfg = compose_train(tmp_path)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model.update(vocab_size=VOCAB, causal=True, vocab_multiple=VOCAB_MULTIPLE)
    vocab = Vocab(range(205))
    optim = OmegaConf.to_container(cfg.optim, resolve=False)
    optim["scheduler"] = {"warmup_steps": 1, "total_steps": 10, "min_lr_ratio": 0.1}
    module = CharLM(model, OmegaConf.to_container(cfg.masking), optim, vocab.to_dict())
    assert module.model.lm_head.weight.shape[0] == 256
    assert module.state_dict()["model.lm_head.weight"].shape[0] == VOCAB
    assert module.state_dict()["_forward.lm_head.weight"].shape[0] == VOCAB
    path = tmp_path / "m.ckpt"
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)},
               path)
    loaded = CharLM(**torch.load(path, weights_only=False)["hyper_parameters"])
    loaded.load_state_dict(torch.load(path, weights_only=False)["state_dict"])
    assert loaded.model.lm_head.weight.shape[0] == 256
    assert torch.equal(loaded.model.lm_head.weight, module.model.lm_head.weight)
