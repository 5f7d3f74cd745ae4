"""probe.py's query/key rows for the families read at the product (OLMo 1-3, Qwen2/3, Gemma
1-3, Phi-3, SmolLM3, Falcon): every one gets them, with no unknown-family warning, and a
Q̄/K̄ alignment planted behind OLMo-2's QK-norm is read back (`repgeom.models.hf.qk`)."""

from __future__ import annotations

import warnings

import pandas as pd
import pytest
import torch
from cli_runs import run_probe_py
from hydra_configs import compose_probe
from tiny_hf_models import build_tiny_hf

from repgeom.probes.core import table
from repgeom.probes.run.job import probe_job
from repgeom.probes.run.runner import probe

NEW_FAMILIES = ["olmo", "olmo2", "olmo3", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text",
                "phi3", "smollm3", "falcon"]  # fmt: skip
SLIDING = {"olmo3", "gemma2", "gemma3_text"}
"""Of NEW_FAMILIES, those whose tiny models have sliding-window layers (window 4)."""
QK_ONLY = ["n_states=60", "metrics=[qk_alignment,qk_cosine_concat,attention]",
           "settings.intrinsic_dimension=false", "settings.distributions=false",
           "plot_metrics=[]", "device=cpu", "window=32"]  # fmt: skip


def qk_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["metric"].isin(["qk_cosine", "qk_cosine_concat", "attention_entropy"])]


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_new_family_gets_query_key_rows(tmp_path, tiny_hf_folder, text_file, family):
    folder = tiny_hf_folder(family)
    cfg = compose_probe(tmp_path, [f"hf={folder}", f"text_file={text_file}", *QK_ONLY])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("error", message=".*no query/key hooks.*")
        result = probe(probe_job(cfg))
    # window=32 over the tiny models' sliding window of 4: attention metrics there count keys
    # the model never sees, which the probe says (not in silence).
    slid = [str(w.message) for w in caught if "sliding window" in str(w.message)]
    if family in SLIDING:
        assert slid and "window=32 is longer than" in slid[0], family
        assert "(config.sliding_window=4)" in slid[0] and "give window<=4" in slid[0]
    else:
        assert not slid, family
    rows = qk_rows(result.frame)
    for metric, per_layer in (("qk_cosine", 4), ("attention_entropy", 4), ("qk_cosine_concat", 1)):
        one = rows[rows["metric"] == metric]
        assert sorted(one["layer"].tolist()) == sorted([1, 2] * per_layer), (family, metric)
        assert one["value"].notna().all(), (family, metric)


@pytest.mark.slow
def test_probe_py_writes_query_key_rows_for_a_saved_olmo2(tmp_path, tiny_hf_folder, text_file):
    """`python probe.py hf=<folder saved with save_pretrained>`, as a user runs it."""
    folder = tiny_hf_folder("olmo2")
    out = tmp_path / "run"
    done = run_probe_py([f"hf={folder}", f"text_file={text_file}", *QK_ONLY,
                         f"hydra.run.dir={out}"], COLUMNS="160")
    assert "no query/key hooks" not in done.stdout + done.stderr
    rows = qk_rows(table.read_table(out))
    assert set(rows["metric"]) == {"qk_cosine", "qk_cosine_concat", "attention_entropy"}
    assert set(rows["layer"]) == {1, 2}


@torch.no_grad()
def test_planted_alignment_behind_qk_norm_is_read_back(tmp_path, text_file):
    """OLMo-2 normalises queries and keys after the projection (``q_norm``, ``k_norm``) and
    before rotary. In block 1, every token's projections get one positive coordinate (a
    constant embedding coordinate, copied by q_proj and k_proj) in the slowest-turning rotary
    pair of each head, and the norm weights keep only that coordinate: key head 0 with weight
    +1, key head 1 with weight -1. So Q̄ and K̄ point the same way for query heads 0, 1 (which
    read key head 0) and opposite ways for heads 2, 3: cosine +1 and -1 up to the rotation of
    that pair (under 0.05 rad over 32 positions). A reader of the projections, before the norm,
    would find +1 in every head."""
    from transformers import AutoModel

    folder = tmp_path / "olmo2"
    build_tiny_hf("olmo2", folder)
    model = AutoModel.from_pretrained(folder)
    attn, H, D = model.layers[0].self_attn, 4, 8
    Hkv = model.config.num_key_value_heads
    d = D // 2 - 1  # the first half of the slowest rotary pair (d, d + D/2)
    model.embed_tokens.weight[:, 0] = 3.0
    q_norm = torch.zeros(H * D)
    k_norm = torch.zeros(Hkv * D)
    for h in range(H):
        attn.q_proj.weight[h * D + d] = 0.0
        attn.q_proj.weight[h * D + d, 0] = 1.0
        q_norm[h * D + d] = 1.0
    for h in range(Hkv):
        attn.k_proj.weight[h * D + d] = 0.0
        attn.k_proj.weight[h * D + d, 0] = 1.0
        k_norm[h * D + d] = 1.0 if h == 0 else -1.0
    attn.q_norm.weight.copy_(q_norm)
    attn.k_norm.weight.copy_(k_norm)
    model.save_pretrained(folder)
    cfg = compose_probe(tmp_path / "run", [f"hf={folder}", f"text_file={text_file}", *QK_ONLY])
    frame = probe(probe_job(cfg)).frame
    cosine = frame[(frame["metric"] == "qk_cosine")].set_index(["layer", "head"])["value"]
    assert [round(cosine[1, h], 2) for h in range(H)] == [1.0, 1.0, -1.0, -1.0]
    assert all(abs(cosine[2, h]) < 0.99 for h in range(H))  # block 2 was not planted
