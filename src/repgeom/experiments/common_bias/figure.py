"""The figure of experiment 4: cosine, drift gain and attention against the bias norm.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from repgeom.experiments.common_bias.summary import STAGES, per_norm, stage_layers, summarize


def _xaxis(ax: Axes, norms: np.ndarray) -> None:
    positive = norms[norms > 0]
    if norms.min() == 0 and positive.size:  # symlog shows N = 0 and is log above linthresh
        ax.set_xscale("symlog", linthresh=float(positive.min()), linscale=0.5)
        ax.set_xlim(0, float(norms.max()) * 1.5)
    else:
        ax.set_xscale("log")
    ax.set_xlabel("norm N of the common bias")
    ax.grid(True, which="major", alpha=0.3)


_PROB_FLOOR = 1e-8


def plot_common_bias(frame: pd.DataFrame, summary: dict | None = None) -> Figure:
    """Four panels against the bias norm N, for one block and through all blocks.

    (a) mean cosine of inputs and outputs, with the isotropic 95% chance level; (b) drift gain
    ``D_out / D_in`` (solid) and mean token norm ratio (dashed), N* marked; (c) spread (std) of
    the pre-softmax scores, mean over heads with the range over heads shaded; (d) mean max,
    median and min of the softmax rows, mean over heads.
    """
    summary = summary if summary is not None else summarize(frame)
    stages = stage_layers(frame)
    colours = {"one_block": "tab:blue", "all_blocks": "tab:orange"}
    fig = Figure(figsize=(12, 9), dpi=110, layout="constrained")
    axes = fig.subplots(2, 2)
    ax_cos, ax_gain, ax_score, ax_prob = axes.ravel()
    norms = np.sort(frame["norm"].unique())
    labels = {}
    for stage, layer in stages.items():
        n_blocks = layer + 1
        labels[stage] = f"{STAGES[stage]} ({n_blocks} block{'s' if n_blocks > 1 else ''})"
    any_stage = next(iter(stages.values()))
    per0 = per_norm(frame, any_stage)

    ax_cos.plot(per0["norm"], per0["cos_in"], "k-o", ms=3, label="input X(N)")
    for stage, layer in stages.items():
        per = per_norm(frame, layer)
        ax_cos.plot(per["norm"], per["cos_out"], "-o", ms=3, color=colours[stage],
                    label=f"output, {labels[stage]}")
    ax_cos.axhline(summary["cos_baseline"], color="grey", ls=":",
                   label="isotropic chance level (95%)")
    ax_cos.set_ylabel("mean pairwise cosine similarity")
    ax_cos.set_title("(a) cosine similarity of inputs and outputs")

    ax_gain.axhline(1.0, color="grey", ls=":", lw=1)
    for k, (stage, layer) in enumerate(stages.items()):
        per = per_norm(frame, layer)
        c = colours[stage]
        ax_gain.plot(per["norm"], per["drift_gain"], "-o", ms=3, color=c,
                     label=f"drift gain ||mean out|| / ||mean in||, {labels[stage]}")
        ax_gain.plot(per["norm"], per["norm_ratio"], "--", color=c,
                     label=f"mean token norm out / in, {labels[stage]}")
        n_star = summary["stages"].get(stage, {}).get("n_star")
        if n_star is not None:
            ax_gain.axvline(n_star, color=c, ls="-.", lw=1)
            ax_gain.annotate(f"N* = {n_star:.3g} ({STAGES[stage]})", (n_star, 1.0),
                             xytext=(4, 8 + 14 * k),
                             textcoords="offset points", color=c, fontsize=9)
    ax_gain.set_yscale("log")
    ax_gain.set_ylabel("output / input")
    ax_gain.set_title("(b) drift gain and token norm ratio (N*: drift gain = 1)")

    for stage, layer in stages.items():
        sub = frame[frame["layer"] == layer].groupby("norm")["score_std"]
        ax_score.plot(sub.mean().index, sub.mean().values, "-o", ms=3, color=colours[stage],
                      label=f"{labels[stage]}: mean over heads")
        ax_score.fill_between(sub.min().index, sub.min().values, sub.max().values,
                              color=colours[stage], alpha=0.2, lw=0)
    ax_score.set_yscale("log")
    ax_score.set_ylabel("std of pre-softmax scores q.k/sqrt(d_head)")
    ax_score.set_title("(c) score spread of the block producing the output")

    styles = {"prob_max": ("-", "max"), "prob_median": ("--", "median"), "prob_min": (":", "min")}
    for stage, layer in stages.items():
        per = per_norm(frame, layer)
        for col, (ls, name) in styles.items():
            ax_prob.plot(per["norm"], per[col], ls, color=colours[stage], lw=1.6,
                         label=f"row {name}, {labels[stage]}")
    ax_prob.set_yscale("log")
    lowest = float(frame[list(styles)].min().min())
    if lowest < _PROB_FLOOR:  # rows can collapse to 1e-30 and below; keep the rest readable
        ax_prob.set_ylim(bottom=_PROB_FLOOR)
    ax_prob.set_ylabel(
        "softmax probability (mean over rows and heads)"
        + (f"\nlower values clipped at {_PROB_FLOOR:g}" if lowest < _PROB_FLOOR else "")
    )
    ax_prob.set_title("(d) max / median / min of softmax rows")

    for ax in axes.ravel():
        _xaxis(ax, norms)
        ax.legend(fontsize=8, loc="best")
    mask = "causal" if summary["causal"] else "bidirectional"
    fig.suptitle(
        f"Fresh {summary['model']} blocks ({summary['norm_position']}-LN, {mask}, "
        f"d={summary['n_embd']}, {summary['n_head']} heads) fed isotropic tokens + a common "
        "bias of norm N",
        fontsize=12,
    )
    return fig
