import numpy as np
import pandas as pd
import pytest
from planted_subject import ArraySubject

from repgeom.analyses import distinctiveness as analysis
from repgeom.analyses.example_data import ATTRIBUTES, SUBJECTS, make_examples
from repgeom.cli import distinctiveness as command
from repgeom.metrics.distinctiveness import distinctiveness


def planted_subject(data, strengths_by_layer, subject_strength=1.5, d=48, seed=0):
    """Each text: 3 token states = subject direction x 1.5 + attribute direction x its strength
    (the planted fixed vector) + a common offset + token noise 0.2; orthonormal directions."""
    rng = np.random.default_rng(seed)
    subj, attr = list(SUBJECTS), list(ATTRIBUTES)
    basis = np.linalg.qr(rng.normal(size=(d, len(subj) + len(attr) + 1)))[0].T
    table = {}
    for text, s, a in zip(data["text"], data["subject"], data["attribute"], strict=True):
        layers = []
        for strengths in strengths_by_layer:
            base = (subject_strength * basis[subj.index(s)]
                    + strengths[a] * basis[len(subj) + attr.index(a)] + 2.0 * basis[-1])
            layers.append(base + 0.2 * rng.normal(size=(3, d)))
        table[text] = layers
    return ArraySubject(table, [f"block_{i + 1}" for i in range(len(strengths_by_layer))])


def test_planted_attribute_gives_sign_and_order(tmp_path):
    data = make_examples()
    weak = dict.fromkeys(ATTRIBUTES, 0.5)
    ramp = dict(zip(ATTRIBUTES, [0.5, 1.0, 1.5, 2.5, 3.5], strict=True))
    subject = planted_subject(data, [weak, ramp])
    scores = analysis.run(subject, data, tmp_path, pca_variance=0.9)
    raw = scores[scores["space"] == "raw"]
    # layer 1: every attribute weaker than the subject (0.5 < 1.5): all cells positive
    assert (raw[raw["layer"] == 0]["score"] > 0).all()
    # layer 2: the column order follows the planted strengths, strongest most negative
    col = raw[raw["layer"] == 1].groupby("attribute")["score"].mean()
    assert list(col.sort_values(ascending=False).index) == list(ATTRIBUTES)
    assert col["neutral"] > 0 > col["question"]
    # the same order after PCA to 90%
    pca = scores[(scores["space"] == "pca90") & (scores["layer"] == 1)]
    col_pca = pca.groupby("attribute")["score"].mean()
    assert list(col_pca.sort_values(ascending=False).index) == list(ATTRIBUTES)
    # files: tidy table, the per-subject and per-attribute means, figures
    for f in ("distinctiveness.csv", "by_subject.csv", "by_attribute.csv",
              "heatmaps_raw.png", "heatmaps_pca90.png", "means.png"):
        assert (tmp_path / f).is_file()
    by_attr = pd.read_csv(tmp_path / "by_attribute.csv").set_index(["space", "attribute"])
    assert by_attr.loc[("raw", "question"), "1"] == pytest.approx(col["question"])


def test_scores_are_the_metric_on_pooled_states():
    data = make_examples().iloc[::4]  # 2 sentences per cell
    subject = planted_subject(data, [dict.fromkeys(ATTRIBUTES, 1.0)])
    scores = analysis.run(subject, data, pca_variance=None)
    pooled = np.stack([subject.states(t)[0].numpy().mean(0) for t in data["text"]])
    expected = distinctiveness(pooled, data["subject"], data["attribute"])
    got = scores.pivot(index="subject", columns="attribute", values="score")
    pd.testing.assert_frame_equal(got.loc[expected.index, expected.columns], expected,
                                  check_names=False, atol=1e-6)


@pytest.mark.slow
def test_cli_on_tiny_models(tiny_ckpt, tiny_hf_dir, tmp_path):
    data = make_examples()
    small = data[data["subject"].isin(["cats", "ocean"])
                 & data["attribute"].isin(["neutral", "question"])].groupby(
        ["subject", "attribute"]).head(2)
    csv = tmp_path / "small.csv"
    small.to_csv(csv, index=False)
    s = command.main([f"ckpt={tiny_ckpt}", f"csv={csv}", f"out={tmp_path / 'ckpt'}",
                       "pooling=last"])
    assert set(s["layer_name"]) == {"embedding", "block_1", "block_2", "final_norm"}
    assert len(s) == 4 * 2 * 2 * 2  # layers x spaces x subjects x attributes
    s = command.main([f"hf={tiny_hf_dir / 'model_and_tokenizer'}", f"csv={csv}",
                       f"out={tmp_path / 'hf'}", "pca=0"])
    assert set(s["space"]) == {"raw"} and s["score"].abs().max() <= 2


def test_missing_column(tmp_path):
    data = make_examples().drop(columns="attribute")
    with pytest.raises(ValueError, match="no column 'attribute'"):
        analysis.run(planted_subject(make_examples(), [dict.fromkeys(ATTRIBUTES, 1.0)]), data)
