import numpy as np
import pandas as pd
import pytest
from planted_subject import ArraySubject

from repgeom.analyses.similarity import offdiag_stats, pair_similarity, token_self_similarity
from repgeom.cli import similarity as similarity_command


def known_subject():
    # layer 0: three orthogonal tokens (mean 0, min 0); layer 1: one direction (1, 1);
    # layer 2: (1,0), (0,1), (-1,0): cosines 0, -1, 0 -> mean -1/3, min -1
    s = 1 / np.sqrt(2)
    table = {
        "abc": [np.eye(3), np.ones((3, 3)), np.array([[1.0, 0, 0], [0, 1, 0], [-1, 0, 0]])],
        # pooled x vs y: layer 0 (1,0,0) vs (0,2,0) -> 0; layer 1 parallel -> 1; layer 2 below
        "x": [np.array([[1.0, 0, 0]]), np.array([[1.0, 1, 0]]), np.array([[s, s, 0]])],
        "y": [np.array([[0, 1.0, 0], [0, 3, 0]]), np.array([[2.0, 2, 0]]),
              np.array([[1.0, 0, 0], [0, 0, 1]])],
    }
    return ArraySubject(table, ["embedding", "block_1", "block_2"])


def test_known_token_cosines():
    layers = token_self_similarity(known_subject(), "abc")
    assert [x.layer_name for x in layers] == ["embedding", "block_1", "block_2"]
    assert [x.mean_offdiag for x in layers] == pytest.approx([0, 1, -1 / 3])
    assert [x.min_offdiag for x in layers] == pytest.approx([0, 1, -1])
    np.testing.assert_allclose(layers[2].matrix, [[1, 0, -1], [0, 1, 0], [-1, 0, 1]], atol=1e-7)


def test_known_pair_cosines():
    # layer 2: x = (s, s, 0), y pooled = (0.5, 0, 0.5): cos = 0.5 s / (1 x s) = 0.5
    t = pair_similarity(known_subject(), [("x", "y")])
    assert list(t["cosine"]) == pytest.approx([0.0, 1.0, 0.5])
    assert list(t["layer_name"]) == ["embedding", "block_1", "block_2"]


def test_offdiag_stats():
    assert offdiag_stats(np.array([[1.0, 0.2], [0.4, 1]])) == pytest.approx((0.3, 0.2))
    assert all(np.isnan(offdiag_stats(np.ones((1, 1)))))


@pytest.mark.slow
def test_cli_on_tiny_models(tiny_ckpt, tiny_hf_dir, tmp_path):
    pairs = tmp_path / "pairs.csv"
    pd.DataFrame({"text_a": ["abcdef", "the cat"], "text_b": ["Cooking mushrooms.", "a dog"]}
                 ).to_csv(pairs, index=False)
    out = tmp_path / "ckpt"
    t = similarity_command.main([f"ckpt={tiny_ckpt}", "text=the cat sat", f"pairs={pairs}",
                         f"out={out}"])
    self_sim = pd.read_csv(out / "self_similarity.csv")
    assert list(self_sim["n_tokens"]) == [11] * 4 and (out / "self_similarity.png").is_file()
    assert self_sim["mean_offdiag"].between(-1, 1).all()
    assert len(t["pair_similarity"]) == 2 * 4
    # the HF model through --flags, a folder without tokenizer plus tokenizer=
    t = similarity_command.main(["--hf", str(tiny_hf_dir / "model"), "--tokenizer",
                         str(tiny_hf_dir / "tokenizer"), "--text", "the cat",
                         "--out", str(tmp_path / "hf")])
    assert list(t["self_similarity"]["n_tokens"]) == [7] * 3
