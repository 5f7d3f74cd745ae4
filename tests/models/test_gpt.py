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


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("causal", [True, False])
def test_capture_positions_equals_whole_windows_at_the_positions(causal: bool, norm: str) -> None:
    model = _model(causal, norm)
    g = torch.Generator().manual_seed(3)
    windows = torch.randint(0, 50, (7, 16), generator=g)
    positions = torch.rand(7, 16, generator=g) < 0.2
    positions[2] = False  # a window with nothing to read
    positions[4, 15] = True  # one that needs every position
    positions[5, :3] = True  # windows with different numbers of marked positions
    seen: list[tuple[int, ...]] = []  # what the model is run on
    hook = model.transformer.wte.register_forward_hook(
        lambda module, args, out: seen.append(tuple(args[0].shape)))
    got = model.capture_positions(windows, positions, batch_size=3)
    hook.remove()
    whole = model.capture(windows, attention=False)
    n = int(positions.sum())
    final = norm == "pre"
    assert [h.shape for h in got.hidden] == [(1, n, 32)] * 3
    assert (got.final_norm is not None) == final
    for ours, reference in zip([*got.hidden, got.final_norm][: 3 + final],
                               [*whole.hidden, whole.final_norm][: 3 + final], strict=True):
        # another batch shape: float32 rounding of the same sums, a few ulps of values ~1
        torch.testing.assert_close(ours[0], reference[positions], rtol=1e-5, atol=1e-6)
    last = torch.where(positions, torch.arange(16), -1).amax(dim=1) + 1
    if causal:  # windows by length (2 at 0 is skipped), each batch cut at its longest
        lengths = sorted(int(n) for n in last if n > 0)
        assert seen == [(len(lengths[i:i + 3]), lengths[i:i + 3][-1]) for i in range(0, 6, 3)]
    else:  # every window whole, but the one with no marked position
        assert all(shape[1] == 16 for shape in seen) and sum(s[0] for s in seen) == 6


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("causal", [True, False])
def test_last_block_at_some_rows_equals_the_whole_block(causal: bool, norm: str) -> None:
    """`Block.forward_at` (keys and values from every position, the rest at a few rows) gives
    the whole block's output at those rows; so do the states of `_states_at` on either path
    (the last block at the rows when they are at most half the window, else whole)."""
    model = _model(causal, norm)
    if norm == "post":  # and without biases
        model = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32,
                              causal=causal, norm=norm, bias=False)).eval()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 16, 32, generator=g)
    at = torch.tensor([[0, 3, 9], [15, 15, 2], [7, 8, 0], [1, 14, 5]])
    block = model.transformer.h[-1]
    with torch.no_grad():
        whole = block(x)
        rows = block.forward_at(x, at)
        expected = whole.gather(1, at[..., None].expand(-1, -1, 32))
        torch.testing.assert_close(rows, expected, rtol=1e-5, atol=1e-6)
        idx = torch.randint(0, 50, (4, 16), generator=g)
        reference = model.capture(idx, attention=False)
        wanted = [*reference.hidden] + ([reference.final_norm] if norm == "pre" else [])
        for positions in (at, torch.arange(16).repeat(4, 1)):  # rows only, then whole
            got = model._states_at(idx, positions)
            index = positions[..., None].expand(-1, -1, 32)
            for ours, states in zip(got, wanted, strict=True):
                torch.testing.assert_close(ours, states.gather(1, index), rtol=1e-5, atol=1e-6)


def test_capture_positions_checks_its_inputs() -> None:
    model = _model(True)
    windows = torch.randint(0, 50, (2, 16))
    with pytest.raises(ValueError, match="positions must have the windows' shape"):
        model.capture_positions(windows, torch.ones(2, 8, dtype=torch.bool), batch_size=2)
    with pytest.raises(ValueError, match="marks no position"):
        model.capture_positions(windows, torch.zeros(2, 16, dtype=torch.bool), batch_size=2)
