import numpy as np
import pandas as pd
import pytest

from repgeom.probes.report.console import print_drift_cosine
from repgeom.probes.report.drift_cosine import CSV_NAME, drift_cosine_correlation, save_drift_cosine


def table(drift, cosine, step=0, **extra):
    """Probe-table rows of blocks 1..L, plus rows that must be ignored: the embedding and the
    final norm with wild values, a per-head row, another metric."""
    rows = []
    L = len(drift)
    for i in range(1, L + 1):
        rows.append(dict(step=step, layer=i, layer_name=f"block_{i}", head=-1,
                         metric="drift_norm", value=drift[i - 1], std=np.nan, **extra))
        rows.append(dict(step=step, layer=i, layer_name=f"block_{i}", head=-1,
                         metric="mean_cosine", value=cosine[i - 1], std=np.nan, **extra))
        rows.append(dict(step=step, layer=i, layer_name=f"block_{i}", head=0,
                         metric="mean_cosine", value=-99.0, std=np.nan, **extra))
        rows.append(dict(step=step, layer=i, layer_name=f"block_{i}", head=-1,
                         metric="anisotropy", value=0.5, std=np.nan, **extra))
    for layer, name in ((0, "embedding"), (L + 1, "final_norm")):
        for metric, v in (("drift_norm", 1000.0), ("mean_cosine", -1000.0)):
            rows.append(dict(step=step, layer=layer, layer_name=name, head=-1, metric=metric,
                             value=v, std=np.nan, **extra))
    return pd.DataFrame(rows)


def test_planted_correlations():
    # step 0: cosine exactly linear and decreasing in drift -> both -1
    # step 1: ranks (1..5) vs (2, 1, 4, 3, 5): rho = 1 - 6 * 4 / (5 * 24) = 0.8
    # step 2: cosine = exp(drift): monotone -> Spearman 1, Pearson < 1 (scipy's value)
    d = np.arange(1.0, 6.0)
    t = pd.concat([table(d, 3 - 0.5 * d, step=0),
                   table(d, np.array([2.0, 1, 4, 3, 5]), step=1),
                   table(d, np.exp(d), step=2)])
    r = drift_cosine_correlation(t).set_index("step")
    assert list(r["n_layers"]) == [5, 5, 5]
    assert r.loc[0, "spearman_rho"] == pytest.approx(-1)
    assert r.loc[0, "pearson_r"] == pytest.approx(-1)
    assert r.loc[1, "spearman_rho"] == pytest.approx(0.8)
    assert r.loc[1, "pearson_r"] == pytest.approx(0.8)  # ranks are the values here
    assert r.loc[2, "spearman_rho"] == pytest.approx(1.0)
    x, y = d, np.exp(d)
    expected = ((x - x.mean()) @ (y - y.mean())) / np.sqrt(((x - x.mean()) ** 2).sum()
                                                           * ((y - y.mean()) ** 2).sum())
    assert r.loc[2, "pearson_r"] == pytest.approx(expected, rel=1e-12)
    assert r.loc[0, "spearman_p"] < 0.05 and r.loc[1, "spearman_p"] > 0.05


def test_spearman_p_is_exact_for_few_layers():
    """Against a brute force over all orderings with scipy's own rho; and the case the t
    approximation gets wrong: 4 monotone layers, scipy p = 0, exact p = 2/24."""
    import itertools

    from scipy import stats

    from repgeom.probes.report.drift_cosine import spearman_p

    rng = np.random.default_rng(0)
    for n in (3, 5, 7):
        x, y = rng.normal(size=n), rng.normal(size=n)
        y[1] = y[0]  # a tie
        observed = abs(stats.spearmanr(x, y).statistic)
        brute = np.mean([abs(stats.spearmanr(x[list(o)], y).statistic) >= observed - 1e-12
                         for o in itertools.permutations(range(n))])
        assert spearman_p(x, y) == pytest.approx(brute, abs=1e-12)
    four = np.arange(4.0)
    assert stats.spearmanr(four, four).pvalue < 0.05
    assert spearman_p(four, four) == pytest.approx(2 / 24)
    many = rng.normal(size=12)
    assert spearman_p(many, many**3) == stats.spearmanr(many, many**3).pvalue


def test_groups_by_model_and_handles_too_few_layers():
    t = pd.concat([table([1.0, 2, 3], [1.0, 2, 3], model="a"),
                   table([1.0, 2, 3], [3.0, 2, 1], model="b"),
                   table([1.0, 2], [1.0, 2], model="c")])
    r = drift_cosine_correlation(t).set_index("model")
    assert r.loc["a", "spearman_rho"] == pytest.approx(1)
    assert r.loc["b", "spearman_rho"] == pytest.approx(-1)
    assert r.loc["c", "n_layers"] == 2 and np.isnan(r.loc["c", "spearman_rho"])


def test_embedding_on_request():
    t = table([1.0, 2, 3], [1.0, 2, 3])
    r = drift_cosine_correlation(t, include_embedding=True)
    assert r["n_layers"].item() == 4  # the embedding's (1000, -1000) now counts
    assert r["pearson_r"].item() < 0


def test_missing_columns():
    with pytest.raises(ValueError, match="lacks column"):
        drift_cosine_correlation(pd.DataFrame({"step": [0], "metric": ["x"]}))


def test_saved_next_to_the_table_and_printed(tmp_path, capsys):
    # Monotone (Spearman 1) at step 0, a planted exact anti-correlation at step 5.
    d = np.arange(1.0, 6.0)
    t = pd.concat([table(d, d**3, step=0, model="m"), table(d, 2 - d, step=5, model="m")])
    result = save_drift_cosine(t, tmp_path)
    written = pd.read_csv(tmp_path / CSV_NAME)
    assert written["step"].tolist() == [0, 5]
    assert written["spearman_rho"].tolist() == pytest.approx([1.0, -1.0])
    assert written["pearson_r"].tolist() == pytest.approx([np.corrcoef(d, d**3)[0, 1], -1.0])
    pd.testing.assert_frame_equal(written, result, check_dtype=False)
    print_drift_cosine(result)
    out = capsys.readouterr().out
    assert "Godey 2024" in out
    cells = [[c.strip() for c in line.split("\u2502")[1:-1]]
             for line in out.splitlines() if line.startswith("\u2502")]
    # step, blocks, Spearman rho, p, Pearson r, p; Pearson of (d, d^3) is 0.9431
    assert [row[:3] + row[4:5] for row in cells] == [["0", "5", "1", "0.9431"],
                                                       ["5", "5", "-1", "-1"]]


def test_not_written_without_drift(tmp_path):
    t = table([1.0, 2, 3], [1.0, 2, 3])
    assert save_drift_cosine(t[t["metric"] != "drift_norm"], tmp_path).empty
    assert not (tmp_path / CSV_NAME).exists()
