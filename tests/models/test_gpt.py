import pytest
import torch

from repgeom.models.gpt import GPT, GPTConfig


def _model(causal: bool, norm: str = "pre", seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32, causal=causal, norm=norm
    )
    return GPT(config).eval()


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_causal_outputs_ignore_the_future(norm: str) -> None:
    model = _model(causal=True, norm=norm)
    x = torch.randint(0, 50, (3, 16))
    changed = x.clone()
    changed[:, 9:] = (changed[:, 9:] + 1) % 50
    a, b = model(x), model(changed)
    torch.testing.assert_close(a[:, :9], b[:, :9])
    assert (a[:, 9:] - b[:, 9:]).abs().max() > 1e-3


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_bidirectional_outputs_see_the_future(norm: str) -> None:
    model = _model(causal=False, norm=norm)
    x = torch.randint(0, 50, (3, 16))
    changed = x.clone()
    changed[:, 9:] = (changed[:, 9:] + 1) % 50
    # At initialization the dependence is weak (small attention logits) but far above float error.
    assert (model(x)[:, :9] - model(changed)[:, :9]).abs().max() > 1e-5


def test_parameter_count_is_identical_across_maskings_and_layouts() -> None:
    counts = {
        (causal, norm): sum(p.numel() for p in _model(causal, norm).parameters())
        for causal in (True, False)
        for norm in ("pre", "post")
    }
    assert len(set(counts.values())) == 1
    # Same initialization from the same seed: only the mask differs between the two objectives.
    a, b = _model(True).state_dict(), _model(False).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("causal", [True, False])
def test_capture_matches_the_training_path(causal: bool) -> None:
    model = _model(causal)
    x = torch.randint(0, 50, (2, 16))
    capture = model.capture(x, attention=True)
    assert capture.causal is causal
    assert len(capture.hidden) == 3 and capture.n_layers == 2
    assert capture.hidden[0].shape == (2, 16, 32)
    assert capture.queries[0].shape == capture.keys[0].shape == (2, 2, 16, 16)
    probs = capture.attention[1]
    assert probs.shape == (2, 2, 16, 16)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 2, 16))
    upper = torch.ones(16, 16, dtype=torch.bool).triu(1)
    assert bool(probs[..., upper].abs().max() == 0) is causal
    # The explicit softmax path gives the logits of scaled_dot_product_attention (float32
    # tolerance).
    record = {"hidden": [], "queries": [], "keys": [], "attention": []}
    torch.testing.assert_close(model._run(x, record), model(x), atol=1e-5, rtol=1e-5)
    # The last hidden state is what the final norm and head read.
    logits = model.lm_head(model.transformer.ln(capture.hidden[-1]))
    torch.testing.assert_close(logits, model(x), atol=1e-5, rtol=1e-5)


def test_capture_without_attention_keeps_queries_and_keys() -> None:
    capture = _model(True).capture(torch.randint(0, 50, (1, 8)), attention=False)
    assert capture.attention == [] and len(capture.queries) == 2


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_embd": 30, "n_head": 4}, "divisible"),
        ({"norm": "middle"}, "model.norm"),
        ({"n_layer": 0}, "model.n_layer"),
        ({"dropout": 1.5}, "model.dropout"),
    ],
)
def test_bad_config_fails_with_a_message(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GPTConfig(vocab_size=10, **overrides)


def test_too_long_input_is_refused() -> None:
    with pytest.raises(ValueError, match="block_size"):
        _model(True)(torch.zeros(1, 17, dtype=torch.long))
