import numpy as np
import pandas as pd
import pytest
from planted_subject import ArraySubject

from repgeom.analyses import distributions as analysis
from repgeom.cli import distributions as command
from repgeom.metrics.distributions import FAMILIES, activation_distribution


def planted(seed=0):
    """Two label groups of 5 texts, each text 50 tokens x 20 dims = 1000 values per layer.

    Layer 1: group "a" logistic, group "b" Student t with 2.5 degrees of freedom.
    Layer 2: group "a" logistic with two side modes of 1% mass at -8 and +8 (sd 0.5),
    group "b" normal.
    """
    rng = np.random.default_rng(seed)
    data = pd.DataFrame({"text": [f"text {i}" for i in range(10)],
                         "kind": ["a"] * 5 + ["b"] * 5, "other": ["x", "y"] * 5})
    table = {}
    for text, kind in zip(data["text"], data["kind"], strict=True):
        if kind == "a":
            first = rng.logistic(size=1000)
            second = rng.logistic(size=1000)
            second[:10] = rng.normal(-8, 0.5, 10)
            second[10:20] = rng.normal(8, 0.5, 10)
        else:
            first = rng.standard_t(2.5, size=1000)
            second = rng.normal(size=1000)
        table[text] = [first.reshape(50, 20), rng.permutation(second).reshape(50, 20)]
    return data, ArraySubject(table, ["block_1", "block_2"])


def test_groups_families_and_modes(tmp_path):
    data, subject = planted()
    t = analysis.run(subject, data, tmp_path, group_by=["kind"], criterion="aic")
    summary = t["summary"].set_index(["group", "layer"])
    assert summary.loc[("a", 0), "best_aic"] == "logistic"
    assert summary.loc[("b", 0), "best_aic"] == "t"
    assert 2 < summary.loc[("b", 0), "t_df"] < 3.2  # planted 2.5; ~5000 values
    assert (summary.loc[("a", 1), "n_modes_left"], summary.loc[("a", 1), "n_modes_right"]) == (1, 1)
    assert summary.loc[("b", 1), ["n_modes_left", "n_modes_right"]].tolist() == [0, 0]
    assert (summary["n_values"] == 5000).all()
    # shares per layer: each family group wins one of the two groups in layer 1
    sh = t["shares"]
    g = sh[(sh["criterion"] == "aic") & (sh["level"] == "group") & (sh["layer"] == 0)]
    assert g.set_index("family")["share"].to_dict() == {
        "normal": 0, "logistic-type": 0.5, "student-t": 0.5, "gennorm/crystalball": 0}
    for _, part in sh.groupby(["layer", "criterion", "level"]):
        assert part["share"].sum() == pytest.approx(1)
    # every mode of group a, layer 2: the main one near 0, the side ones near -8 and +8
    modes = t["modes"]
    m = modes[(modes["group"] == "a") & (modes["layer"] == 1)].set_index("side")
    assert m.loc["left", "location"] == pytest.approx(-8, abs=0.5)
    assert m.loc["right", "distance"] == pytest.approx(8, abs=0.7)
    assert (m["volume"] == m["height"] * m["spread"]).all()
    # fits: 7 families per (group, layer), scipy parameters written out
    assert len(t["fits"]) == 2 * 2 * len(FAMILIES)
    for f in ("fits.csv", "summary.csv", "modes.csv", "shares.csv", "modes_per_layer.csv",
              "layer_block_1.png", "layer_block_2.png", "all_texts_summary.csv",
              "all_texts_modes.csv"):
        assert (tmp_path / f).is_file()


def test_without_groups_everything_is_one_sample():
    data, subject = planted()
    t = analysis.run(subject, data, figures=False)
    assert list(t["summary"]["group"]) == ["all", "all"]
    assert (t["summary"]["n_values"] == 10000).all()


def test_two_label_columns_make_cells():
    data, subject = planted()
    t = analysis.run(subject, data, group_by=["kind", "other"], n_samples=2000)
    assert sorted(set(t["summary"]["group"])) == ["a:x", "a:y", "b:x", "b:y"]


def test_plot_layer_draws_histogram_fit_and_modes():
    x = np.concatenate([np.random.default_rng(0).logistic(size=4900),
                        np.random.default_rng(1).normal(8, 0.5, 100)])
    r = activation_distribution(x)
    fig = analysis.plot_layer(x, r, "planted")
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    labels = ax.get_legend_handles_labels()[1]
    assert any(lab.startswith("best fit") for lab in labels)
    assert "main mode" in labels and "right mode" in labels


@pytest.mark.slow
def test_cli_on_tiny_models(tiny_ckpt, tiny_hf_dir, tmp_path):
    csv = tmp_path / "t.csv"
    pd.DataFrame({"text": ["the cat sat on the mat", "a dog ran", "Is it so?", "no, it is not"],
                  "subject": ["cat", "dog", "cat", "dog"]}).to_csv(csv, index=False)
    t = command.main([f"ckpt={tiny_ckpt}", f"csv={csv}", "group_by=subject",
                       f"out={tmp_path / 'ckpt'}", "n_samples=500", "--no-figures"])
    assert set(t["summary"]["group"]) == {"cat", "dog"}
    assert t["summary"]["layer_name"].nunique() == 4
    t = command.main(["--hf", str(tiny_hf_dir / "model"), "--tokenizer",
                       str(tiny_hf_dir / "tokenizer"), "--csv", str(csv), "--out",
                       str(tmp_path / "hf"), "--n-samples", "500", "--group-by", "subject"])
    assert (tmp_path / "hf" / "layer_block_2.png").is_file()
    # 'the cat sat on the mat' + 'Is it so?' = 31 characters x 32 dims
    assert t["summary"].set_index(["group", "layer"]).loc[("cat", 0), "n_values"] == 31 * 32
