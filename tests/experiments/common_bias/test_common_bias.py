"""Experiment 4 (fresh block under a common bias): known answers, the table, N*, the entry point."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra_configs import CONF_DIR, ROOT
from matplotlib.figure import Figure

from repgeom.experiments.common_bias import (
    COLUMNS,
    common_bias_sweep,
    drift_fixed_point,
    plot_common_bias,
    render_markdown,
    run,
    summarize,
)
from repgeom.metrics import isotropic_mean_cosine_chance
from repgeom.models.gpt import GPTConfig

D, H, L = 32, 2, 2
T, B = 16, 2
TOKEN_STD = 0.02
TOKEN_NORM = TOKEN_STD * math.sqrt(D)  # typical norm of an input token without bias, ~0.11
NORMS = [0.0, 0.01, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 1000.0, 10000.0]


def config(norm: str = "pre", causal: bool = True) -> GPTConfig:
    return GPTConfig(vocab_size=8, n_layer=L, n_head=H, n_embd=D, norm=norm, causal=causal)


@pytest.fixture(scope="module")
def pre() -> pd.DataFrame:
    return common_bias_sweep(config("pre"), norms=NORMS, n_tokens=T, n_sequences=B, seed=0)


@pytest.fixture(scope="module")
def post() -> pd.DataFrame:
    return common_bias_sweep(
        config("post", causal=False), norms=NORMS, n_tokens=T, n_sequences=B, seed=0
    )


def per_norm(frame: pd.DataFrame, layer: int) -> pd.DataFrame:
    return frame[frame.layer == layer].groupby("norm").mean(numeric_only=True)


# --- the table ---------------------------------------------------------------------------


def test_table_has_every_column_and_one_row_per_norm_layer_head(pre: pd.DataFrame) -> None:
    assert list(pre.columns) == COLUMNS
    assert len(pre) == len(NORMS) * L * H
    assert sorted(pre.norm.unique()) == NORMS
    assert set(pre.layer) == {0, L - 1} and set(pre["head"]) == set(range(H))
    assert (pre.groupby(["norm", "layer"]).size() == H).all()
    assert not pre.isna().any().any()
    assert (pre.n_blocks == pre.layer + 1).all()


def test_norms_are_sorted_and_layers_selectable() -> None:
    t = common_bias_sweep(config(), norms=[10.0, 0.0, 1.0], n_tokens=4, n_sequences=1, layers=[1])
    assert t.norm.tolist() == [0.0, 0.0, 1.0, 1.0, 10.0, 10.0]  # H heads per norm
    assert set(t.layer) == {1}


def test_norm_position_overrides_the_config() -> None:
    t = common_bias_sweep(config("pre"), norms=[0.0], n_tokens=4, n_sequences=1,
                          norm_position="post")
    assert set(t.norm_position) == {"post"}


# --- known answers -----------------------------------------------------------------------


def test_unbiased_input_is_isotropic(pre: pd.DataFrame) -> None:
    cos0 = per_norm(pre, 0).loc[0.0, "cos_in"]
    # Isotropic Gaussian tokens: the mean cosine is 0 with std sqrt(2 / (d n (n-1))); the
    # 99.9% quantile of its absolute value bounds it for all but 1 in 1000 seeds (seed fixed).
    bound = isotropic_mean_cosine_chance(B * T, D, quantile=0.999)
    assert abs(cos0) <= bound
    assert per_norm(pre, 0).loc[0.0, "cos_baseline"] == pytest.approx(
        isotropic_mean_cosine_chance(B * T, D)
    )


def test_input_cosine_follows_the_bias_to_token_ratio(pre: pd.DataFrame) -> None:
    cos = per_norm(pre, 0)["cos_in"]
    # x_i = z_i + N u: x_i.x_j ~ N^2 and |x_i|^2 ~ N^2 + token_std^2 d, so the mean cosine is
    # N^2 / (N^2 + token_std^2 d) up to O(1/sqrt(d)) fluctuations of |z_i|^2 (0.25 at d = 32).
    for N in (0.1, 0.3, 1.0):
        expected = N**2 / (N**2 + TOKEN_NORM**2)
        assert cos[N] == pytest.approx(expected, abs=0.1)
    assert cos[10000.0] > 1 - 1e-9  # the bias swamps the tokens
    assert np.all(np.diff(cos.loc[0.1:].to_numpy()) > 0)  # monotone once the bias dominates


def test_input_drift_norm_is_the_bias_norm(pre: pd.DataFrame) -> None:
    drift_in = per_norm(pre, 0)["drift_in"]
    # ||mean_i z_i + N u||: the sample mean of n tokens has norm ~ token_std sqrt(d / n); five of
    # those bound the deviation from N.
    noise = TOKEN_STD * math.sqrt(D / (B * T))
    for N in NORMS:
        assert abs(drift_in[N] - N) <= 5 * noise


def test_post_ln_output_norm_is_sqrt_d_and_n_star_near_sqrt_d(post: pd.DataFrame) -> None:
    out = per_norm(post, L - 1)
    # LayerNorm with gain 1 and bias 0 (fresh) maps every token to norm sqrt(d) (eps = 1e-5
    # shrinks it by a relative ~eps / var, far below the tolerance).
    np.testing.assert_allclose(out["norm_out"], math.sqrt(D), rtol=1e-3)
    s = summarize(post)
    for stage in ("one_block", "all_blocks"):
        n_star = s["stages"][stage]["n_star"]
        # Once the bias dominates every output token is ~ the same vector of norm sqrt(d), so the
        # output drift norm is sqrt(d) and the gain sqrt(d) / N: N* = sqrt(d), to within the
        # sqrt(cos_out) < 1 factor and the log-log interpolation (5%).
        assert n_star == pytest.approx(math.sqrt(D), rel=0.05)
        assert s["stages"][stage]["n_star_stable"] is True
        assert min(n for n in NORMS if n > 0) < n_star < max(NORMS)


def test_post_ln_first_block_attention_sharpens_with_the_bias(post: pd.DataFrame) -> None:
    first = per_norm(post, 0)
    # Unnormalised input: q and k both carry W b, so score differences across keys grow like N.
    ratio = first.loc[10000.0, "score_std"] / first.loc[1000.0, "score_std"]
    assert ratio == pytest.approx(10.0, rel=0.1)
    assert first.loc[10000.0, "prob_max"] > 2 * first.loc[0.0, "prob_max"]
    assert first.loc[10000.0, "prob_min"] < 0.5 * first.loc[0.0, "prob_min"]
    assert first.loc[10000.0, "normalized_entropy"] < first.loc[0.0, "normalized_entropy"]
    assert summarize(post)["stages"]["one_block"]["attention_sharpens"] is True


def test_pre_ln_attention_flattens_with_the_bias(pre: pd.DataFrame) -> None:
    first = per_norm(pre, 0)
    # ln_1 removes the common bias before attention: LN(z + N u) -> LN(u) + O(token_norm / N),
    # so the score spread falls like 1/N and rows tend to uniform.
    ratio = first.loc[1000.0, "score_std"] / first.loc[10000.0, "score_std"]
    assert ratio == pytest.approx(10.0, rel=0.1)
    assert first.loc[10000.0, "normalized_entropy"] > 1 - 1e-6


def test_sweep_is_deterministic_in_the_seed_and_leaves_the_global_rng() -> None:
    kw = dict(norms=[0.0, 1.0, 100.0], n_tokens=8, n_sequences=2)
    state = torch.get_rng_state()
    a = common_bias_sweep(config(), seed=3, **kw)
    assert torch.equal(torch.get_rng_state(), state)
    b = common_bias_sweep(config(), seed=3, **kw)
    pd.testing.assert_frame_equal(a, b)
    c = common_bias_sweep(config(), seed=4, **kw)
    assert not np.allclose(a.score_std, c.score_std)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(norms=[]), "norms"),
        (dict(norms=[-1.0, 1.0]), "norms"),
        (dict(norms=[1.0, 1.0]), "norms"),
        (dict(norms=[float("nan")]), "norms"),
        (dict(norms=[1.0], n_tokens=1), "n_tokens"),
        (dict(norms=[1.0], n_sequences=0), "n_sequences"),
        (dict(norms=[1.0], seed=1.5), "seed"),
        (dict(norms=[1.0], norm_position="middle"), "norm_position"),
        (dict(norms=[1.0], token_std=0.0), "token_std"),
        (dict(norms=[1.0], layers=[L]), "layers"),
    ],
)
def test_bad_arguments_raise_naming_them(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        common_bias_sweep(config(), **kwargs)


# --- the fixed point ---------------------------------------------------------------------


def test_fixed_point_interpolates_in_log_log() -> None:
    # log g goes from log 2 to log 0.5 between N = 10 and 100: it is 0 half way in log N.
    fp = drift_fixed_point([0.0, 1.0, 10.0, 100.0], [9.0, 4.0, 2.0, 0.5])
    assert fp.value == pytest.approx(math.sqrt(10 * 100))
    assert fp.stable is True and fp.reason is None
    # g = c / N is a straight line in log-log: exact N* = c.
    norms = [1.0, 3.0, 10.0, 30.0]
    assert drift_fixed_point(norms, [7.0 / n for n in norms]).value == pytest.approx(7.0)
    # g = 1 exactly at a swept norm; growing gain above it -> unstable
    fp = drift_fixed_point([1.0, 10.0, 100.0], [0.5, 1.0, 2.0])
    assert fp.value == 10.0 and fp.stable is False


def test_no_bracket_gives_none_with_a_reason() -> None:
    fp = drift_fixed_point([0.0, 1.0, 10.0], [50.0, 5.0, 1.5])
    assert fp.value is None and "amplifies" in fp.reason
    fp = drift_fixed_point([1.0, 10.0], [0.5, 0.1])
    assert fp.value is None and "shrinks" in fp.reason
    fp = drift_fixed_point([0.0, 1.0], [3.0, 2.0])
    assert fp.value is None and "two swept norms" in fp.reason


def test_marginal_crossing_is_not_a_fixed_point() -> None:
    # A pre-LN block adds a small vector c: g = |N u + c| / N -> 1, crossing 1 when c.u < 0 but
    # never by more than |c| / N. Such a crossing is listed, not reported as N*.
    fp = drift_fixed_point([0.1, 1.0, 10.0, 100.0], [3.0, 1.2, 0.998, 0.9998])
    assert fp.value is None and "marginally" in fp.reason
    assert len(fp.crossings) == 1 and 1.0 < fp.crossings[0] < 10.0
    assert fp.transparent_from == 10.0


def test_truncated_post_ln_sweep_reports_none(post: pd.DataFrame) -> None:
    s = summarize(post[post.norm <= 1.0])  # sqrt(32) = 5.7 is outside [0.01, 1]
    stage = s["stages"]["one_block"]
    assert stage["n_star"] is None and "amplifies" in stage["n_star_reason"]


def test_pre_ln_has_no_clear_fixed_point(pre: pd.DataFrame) -> None:
    # The residual stream passes the bias on: for N >> token norm the gain is 1 within 1%.
    for stage in summarize(pre)["stages"].values():
        assert stage["n_star"] is None and stage["n_star_reason"]
        assert stage["transparent_from"] is not None and stage["transparent_from"] <= 100.0


# --- figure, entry point, report ---------------------------------------------------------


def test_figure_has_four_labelled_panels(post: pd.DataFrame) -> None:
    fig = plot_common_bias(post)
    assert isinstance(fig, Figure)
    axes = fig.get_axes()
    assert len(axes) == 4
    for ax in axes:
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
        assert ax.get_legend() is not None


def compose_common_bias(overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("common_bias", overrides=overrides)


TINY = ["model.n_layer=2", "model.n_head=2", "model.n_embd=32", "n_tokens=8", "n_sequences=2",
        "norms=[0,0.1,1,10,100]"]


def check_run_folder(folder: Path, n_rows: int) -> dict:
    frame = pd.read_csv(folder / "common_bias.csv")
    assert list(frame.columns) == COLUMNS and len(frame) == n_rows
    assert (folder / "common_bias.png").stat().st_size > 10_000
    summary = json.loads((folder / "summary.json").read_text())
    assert set(summary["stages"]) == {"one_block", "all_blocks"}
    for stage in summary["stages"].values():
        assert (stage["n_star"] is None) == (stage["n_star_reason"] is not None)
    return summary


def test_run_writes_its_three_files(tmp_path: Path) -> None:
    cfg = compose_common_bias([*TINY, "model=bert_small", "masking=bidirectional",
                               f"output_dir={tmp_path}"])
    result = run(cfg)
    summary = check_run_folder(tmp_path, 5 * 2 * 2)
    assert summary == json.loads(json.dumps(result.summary))
    assert summary["norm_position"] == "post" and summary["causal"] is False
    assert summary["settings"]["command"] is None  # composed, not started from a command line
    page = render_markdown([summary])
    assert "bert_small" in page and f"{summary['stages']['one_block']['n_star']:.3g}" in page


@pytest.mark.slow
def test_command_line_writes_its_three_files(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "repgeom.cli.common_bias", *TINY,
         f"hydra.run.dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = check_run_folder(tmp_path, 5 * 2 * 2)
    assert summary["settings"]["command"].startswith("repgeom-common-bias ")
    assert "n_tokens=8" in summary["settings"]["command"]
