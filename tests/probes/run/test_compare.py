"""probe.py's compare (compare.text_a/text_b): pooled and token cosines between two texts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hydra_configs import compose_job

from repgeom.probes.run.runner import probe

# ---------------------------------------------------------------------------------------------
# Compare


def test_compare_identical_texts_hf(tmp_path, tiny_hf_folder) -> None:
    folder = tiny_hf_folder("bert")
    text = "the lazy dog sleeps"
    result = probe(
        compose_job(tmp_path, [f"hf={folder}", f"compare.text_a='{text}'",
                                 f"compare.text_b='{text}'"])
    )  # fmt: skip
    pooled = pd.read_csv(tmp_path / "compare" / "pooled_cosine.csv")
    assert pooled["layer"].tolist() == [0, 1, 2]  # BERT is post-LN: no final norm
    np.testing.assert_allclose(pooled["pooled_cosine"], 1.0, atol=1e-6)  # float32 states
    assert (tmp_path / "compare" / "compare.png").stat().st_size > 10_000
    matrix = pd.read_csv(tmp_path / "compare" / "token_cosine_last_layer.csv", index_col=0)
    assert matrix.shape == (len(text), len(text))  # [CLS]/[SEP] excluded
    np.testing.assert_allclose(np.diag(matrix.to_numpy()), 1.0, atol=1e-5)
    assert result.frame.empty and result.kinds == {folder: "encoder"}


def test_compare_encoder_decoder_writes_one_file_per_stack(tmp_path, tiny_hf_folder) -> None:
    folder = tiny_hf_folder("t5")
    probe(compose_job(tmp_path, [f"hf={folder}", "compare.text_a='the cat sat'",
                                   "compare.text_b='a dog ran.'", "device=cpu"]))
    encoder, decoder = (
        pd.read_csv(tmp_path / "compare" / f"pooled_cosine_step0_{stack}.csv")
        for stack in ("encoder", "decoder")
    )
    # Every probed layer, as in the probe table: T5's stacks end in a final norm.
    assert encoder["layer"].tolist() == [0, 1, 2, 3]
    assert decoder["layer"].tolist() == [0, 1, 2, 3, 4]
    assert encoder["layer_name"].tolist() == ["embedding", "block_1", "block_2", "final_norm"]
    assert set(encoder["model"]) == {f"{folder}:encoder"} and set(decoder["kind"]) == {"decoder"}
    # Layer 0 is the embedding of the same tokens in both stacks (T5 shares one table).
    assert encoder["pooled_cosine"][0] == pytest.approx(decoder["pooled_cosine"][0], abs=1e-6)
    assert encoder["pooled_cosine"][1] != pytest.approx(decoder["pooled_cosine"][1], abs=1e-3)


@pytest.mark.slow  # trains (the trained_run fixture)
def test_compare_different_texts_checkpoint(tmp_path, trained_run) -> None:
    ckpt = trained_run / "checkpoints" / "last.ckpt"
    probe(compose_job(tmp_path, [f"ckpt={ckpt}", "compare.text_a=abc", "compare.text_b='xyz!'"]))
    pooled = pd.read_csv(tmp_path / "compare" / "pooled_cosine.csv")
    # The probe table's layers: embedding, two blocks, our GPT's final norm.
    assert pooled["layer_name"].tolist() == ["embedding", "block_1", "block_2", "final_norm"]
    assert (pooled["pooled_cosine"] < 1 - 1e-4).all()
    matrix = pd.read_csv(tmp_path / "compare" / "token_cosine_last_layer.csv", index_col=0)
    assert matrix.shape == (3, 4)
    assert (tmp_path / "compare" / "compare.png").exists()
