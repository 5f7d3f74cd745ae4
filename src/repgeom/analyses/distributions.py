"""Activation distributions per layer and label group ("Beyond Gaussian", papers/004).

The post fits distribution families "to the concatenation of the post-residual activations at
each layer for each subject:attribute pair" and reports how often each family fits best, then
finds secondary modes with a KDE. Here, for a model and a labelled CSV:

* the texts are grouped by the label columns ``group_by`` (all texts are one group ``all`` when
  none is given); each group's token states at a layer (special tokens excluded, every
  coordinate a value) are one sample;
* `repgeom.metrics.distributions.activation_distribution` fits the seven families (maximum
  likelihood on a 5000-value subsample), picks the best by log-likelihood and by AIC, and finds
  the modes (full-range KDE on up to 20000 values, see `find_modes`);
* the share of groups each family (and each of the post's family groups: logistic-type,
  Student t, gennorm/crystal ball, normal) wins, per model and layer;
* a figure per layer for all texts together: histogram on a log density axis, the best fit,
  the modes marked.

Command line (``key=value`` or ``--key value``)::

    repgeom-distributions hf=<name or folder> csv=<file> out=<dir> \\
        [group_by=subject,attribute] [criterion=loglik|aic] [n_samples=5000] \\
        [mode_samples=20000] [tokenizer=...] [name=<label>]
    repgeom-distributions ckpt=<file.ckpt> csv=<file> out=<dir>

Writes to ``out``: ``fits.csv`` (model, group, layer, layer_name, family, loglik, aic, params),
``summary.csv`` (per group and layer: kurtosis, best families, modes per side),
``modes.csv`` (every mode: side, location, height, spread, volume, distance),
``shares.csv`` (per layer and criterion: share of groups won by each family and family group),
``modes_per_layer.csv`` (mean modes per side per layer), and for all texts as one sample
``all_texts_summary.csv``, ``all_texts_modes.csv`` and the figures ``layer_<name>.png``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from repgeom.metrics.distributions import (
    _SCIPY,
    FAMILIES,
    FAMILY_GROUPS,
    FIT_SAMPLES,
    MODE_SAMPLES,
    DistributionResult,
    activation_distribution,
)

from .subjects import Subject

__all__ = ["group_values", "fit_groups", "family_shares", "plot_layer", "run"]


def group_values(subject: Subject, data: pd.DataFrame, group_by: Sequence[str] = (),
                 text_col: str = "text") -> dict[str, list[np.ndarray]]:
    """Per group (``"a:b"`` label string, or ``"all"``), per layer, all activation values."""
    keys = (data[list(group_by)].astype(str).agg(":".join, axis=1) if group_by
            else pd.Series("all", index=data.index))
    groups: dict[str, list[list[torch.Tensor]]] = {}
    for text, key in zip(data[text_col].astype(str), keys, strict=True):
        states = subject.states(text)
        layers = groups.setdefault(key, [[] for _ in states])
        for bucket, h in zip(layers, states, strict=True):
            bucket.append(h.reshape(-1))
    return {k: [torch.cat(b).numpy() for b in layers] for k, layers in groups.items()}


def fit_groups(values: dict[str, list[np.ndarray]], layer_names: Sequence[str], *,
               n_samples: int = FIT_SAMPLES, seed: int = 0, **kwargs
               ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict]:
    """Fits, summary and modes of every (group, layer); also the results for plotting."""
    fits, summary, modes, results = [], [], [], {}
    for group, layers in values.items():
        for i, (name, x) in enumerate(zip(layer_names, layers, strict=True)):
            r = activation_distribution(x, n_samples=n_samples, seed=seed, **kwargs)
            results[group, i] = r
            key = {"group": group, "layer": i, "layer_name": name}
            for f in r.log_likelihoods:
                fits.append({**key, "family": f, "loglik": r.log_likelihoods[f],
                             "aic": r.aic[f], "params": " ".join(f"{v:.6g}" for v in r.params[f])})
            summary.append({**key, "n_values": int(x.size), "n_samples": r.n_samples,
                            "kurtosis": r.kurtosis, "best_loglik": r.best_family_loglik,
                            "best_aic": r.best_family_aic,
                            "t_df": r.params["t"][0] if r.params.get("t") else np.nan,
                            "n_modes_left": r.n_modes_left, "n_modes_right": r.n_modes_right})
            for m in r.modes:
                modes.append({**key, **m.__dict__})
    return pd.DataFrame(fits), pd.DataFrame(summary), pd.DataFrame(modes), results


def family_shares(summary: pd.DataFrame) -> pd.DataFrame:
    """Share of groups each family (``level="family"``) and family group (``"group"``) wins,
    per layer and criterion; each (layer, criterion, level) sums to 1."""
    rows = []
    for crit in ("loglik", "aic"):
        for level in ("family", "group"):
            best = summary[f"best_{crit}"]
            if level == "group":
                best = best.map(FAMILY_GROUPS)
            names = FAMILIES if level == "family" else tuple(dict.fromkeys(FAMILY_GROUPS.values()))
            for (layer, name), idx in summary.groupby(["layer", "layer_name"]).groups.items():
                counts = best.loc[idx].value_counts()
                for f in names:
                    rows.append({"layer": layer, "layer_name": name, "criterion": crit,
                                 "level": level, "family": f,
                                 "share": counts.get(f, 0) / len(idx), "n_groups": len(idx)})
    return pd.DataFrame(rows)


def plot_layer(x: np.ndarray, result: DistributionResult, title: str = "", bins: int = 200):
    """Histogram of the values on a log density axis, the best fit's density, the modes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), constrained_layout=True)
    dens, edges, _ = ax.hist(x, bins=bins, density=True, color="0.75", label="activations")
    grid = np.linspace(edges[0], edges[-1], 1000)
    best = result.best_family
    p = result.params[best]
    if p:
        ax.plot(grid, _SCIPY[best].pdf(grid, *p), color="C3", lw=1.2,
                label=f"best fit: {best} ({'AIC' if best == result.best_family_aic else 'LL'})")
    if best != result.best_family_aic and result.params[result.best_family_aic]:
        f = result.best_family_aic
        ax.plot(grid, _SCIPY[f].pdf(grid, *result.params[f]), color="C0", lw=1, ls="--",
                label=f"best by AIC: {f}")
    colors = {"main": "k", "left": "C2", "right": "C1"}
    for side in ("main", "left", "right"):
        ms = [m for m in result.modes if m.side == side]
        if ms:
            ax.scatter([m.location for m in ms], [m.height for m in ms], marker="v", s=30,
                       color=colors[side], zorder=3, label=f"{side} mode" + "s" * (len(ms) > 1))
    ax.set_yscale("log")
    positive = dens[dens > 0]
    ax.set_ylim(bottom=max(positive.min() / 3, 1e-7) if positive.size else 1e-7)
    ax.set_xlabel("activation value")
    ax.set_ylabel("density (log)")
    ax.set_title(f"{title}  kurtosis {result.kurtosis:.1f}, modes L{result.n_modes_left}"
                 f"/R{result.n_modes_right}".strip(), fontsize=9)
    ax.legend(fontsize=7)
    return fig


def run(subject: Subject, data: pd.DataFrame, out: str | Path | None = None, *,
        group_by: Sequence[str] = (), text_col: str = "text", n_samples: int = FIT_SAMPLES,
        seed: int = 0, criterion: str = "loglik", mode_samples: int = MODE_SAMPLES,
        figures: bool = True) -> dict[str, pd.DataFrame]:
    """The analysis on one model; returns (and with ``out`` writes) the tables listed above."""
    for col in (text_col, *group_by):
        if col not in data.columns:
            raise ValueError(f"the data has no column {col!r} (columns: {list(data.columns)})")
    values = group_values(subject, data, group_by, text_col)
    fits, summary, modes, _ = fit_groups(values, subject.layer_names, n_samples=n_samples,
                                         seed=seed, criterion=criterion,
                                         mode_samples=mode_samples)
    shares = family_shares(summary)
    per_layer = (summary.groupby(["layer", "layer_name"])[["n_modes_left", "n_modes_right",
                                                          "kurtosis"]].mean().reset_index())
    tables = {"fits": fits, "summary": summary, "modes": modes, "shares": shares,
              "modes_per_layer": per_layer}
    for t in tables.values():
        t.insert(0, "model", subject.name)
    if out is not None:
        import matplotlib.pyplot as plt

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        for name, t in tables.items():
            t.to_csv(out / f"{name}.csv", index=False)
        if figures:
            everything = (values if not group_by else
                          {"all": [np.concatenate(v) for v in zip(*values.values(),
                                                                   strict=True)]})
            _, all_summary, all_modes, results = fit_groups(
                {"all": everything["all"]}, subject.layer_names, n_samples=n_samples, seed=seed,
                criterion=criterion, mode_samples=mode_samples)
            for t in (all_summary, all_modes):
                t.insert(0, "model", subject.name)
            all_summary.to_csv(out / "all_texts_summary.csv", index=False)
            all_modes.to_csv(out / "all_texts_modes.csv", index=False)
            for i, name in enumerate(subject.layer_names):
                fig = plot_layer(everything["all"][i], results["all", i],
                                 f"{Path(subject.name).name} {name}")
                fig.savefig(out / f"layer_{name}.png", dpi=80)
                plt.close(fig)
    return tables
