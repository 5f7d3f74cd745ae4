"""Queries and keys of one head across training, in one 2-D SVD projection (Godey et al. 2024).

Section 5 of papers/003 ("Queries and keys: training dynamics") takes the queries ``Q_s`` and
keys ``K_s`` of one layer and head at every checkpoint ``s`` on the same inputs (128 Wikitext
samples through the MultiBERT checkpoints) and "compute[s] a SVD of the union of Q_s and K_s
for all steps s, so that the projection makes sense for both distributions across steps":
one basis for the whole trajectory. Figure 11 draws the projected distributions, Figure 12 the
projected means ``Q̄_s`` and ``K̄_s`` (over all tokens), one arrow per checkpoint; "the first
dimension of the SVD seems to describe this common drift". Appendix C (Figures 19-22) fits the
SVD on ``K_s`` or on ``Q_s`` alone instead, to show that the union does not create the
separation: ``basis=key`` / ``basis=query`` here.

The protocol on our runs:

* **inputs**: the whole windows the training probe's query/key metrics read (the first
  ``attention_windows`` windows of its probe set, rebuilt from the checkpoint as ``probe.py``
  does), the same for every checkpoint; ``windows=`` takes another count;
* **states**: per head, queries and keys as they enter ``softmax(Q K^T / sqrt(D))``
  (`repgeom.models.capture.Capture`), at every position; ``layer`` counts blocks from 1 as in
  the probe table, ``head`` from 0;
* **basis**: the SVD of the stacked, *uncentred* rows of every step (the paper's "SVD", not a
  PCA: the origin stays at the origin, so a drift of the means away from it shows). It is
  computed from the Gram matrix ``X^T X`` summed over steps, whose eigenvectors are the right
  singular vectors of ``X``; every token is used, where the paper sampled 20% of them only to
  save memory (its footnote 1). Each component's sign puts its largest entry positive
  (scikit-learn's ``svd_flip`` convention), so the figure does not flip between runs;
* **drawn**: `points` tokens per step (the same positions at every step, queries and keys),
  and the means over all tokens.

Command line (``key=value`` or ``--key value``)::

    repgeom-qk-projection run=<train.py run folder> out=<dir> \\
        [layer=1,2] [head=0] [basis=union|query|key] [windows=16] [points=256] [device=auto]

A run folder holds ``last.ckpt`` and ``best.ckpt`` only unless training kept more:
``python train.py callbacks=trajectory callbacks.checkpoint_every.every_n_train_steps=1000``
(``conf/callbacks/trajectory.yaml``) keeps one every 1000 steps. The forward passes run on the
GPU when there is one; the SVD is a D x D eigenproblem per head either way.
Writes ``qk_projection.csv`` (step, layer, head, kind = query|key, token,
component_1, component_2: the drawn tokens), ``qk_projection_means.csv`` (the same columns for
the means, plus ``cosine``: the cosine of ``Q̄_s`` and ``K̄_s`` in the full head dimension, the
probe's ``qk_cosine``, Figure 13), ``qk_projection_basis.csv`` (layer, head, component,
singular_value, energy: its share of the squared norm) and one figure per head,
``qk_projection_layer<ll>_head<hh>.png``. ``python probe.py run=<run> qk_projection=true``
writes the same into ``<probe output>/qk_projection/`` (`write`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from repgeom.analyses.qk_trajectory import DEFAULT_POINTS, QKTrajectory, qk_trajectory

__all__ = [
    "BASES",
    "QKProjection",
    "QKTrajectory",
    "common_svd",
    "svd_basis",
    "qk_trajectory",
    "project",
    "plot_projection",
    "write",
]

BASES = ("union", "query", "key")
"""What the SVD is fitted on: the union of queries and keys (Figs. 11-12), keys or queries
alone (appendix C, Figs. 19-22)."""
N_COMPONENTS = 2


def svd_basis(gram: np.ndarray, n_components: int = N_COMPONENTS) -> tuple[np.ndarray, np.ndarray]:
    """The first right singular vectors and singular values of ``X`` from ``gram = X^T X``.

    Parameters
    ----------
    gram : ndarray, shape (D, D)
        Symmetric positive semi-definite (the sum of ``x x^T`` over the rows of ``X``).
    n_components : int
        How many components, at most D.

    Returns
    -------
    basis : ndarray, shape (D, n_components), float64
        Orthonormal columns, by decreasing singular value; each column's largest-magnitude
        entry is positive.
    singular_values : ndarray, shape (n_components,)

    Examples
    --------
    >>> basis, s = svd_basis(np.diag([1.0, 9.0, 4.0]), 2)
    >>> basis.T.round(6).tolist(), s.tolist()
    ([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], [3.0, 2.0])
    """
    gram = np.asarray(gram, dtype=np.float64)
    if gram.ndim != 2 or gram.shape[0] != gram.shape[1]:
        raise ValueError(f"gram must be a square (D, D) matrix, got shape {gram.shape}")
    if not 1 <= n_components <= gram.shape[0]:
        raise ValueError(
            f"n_components must be between 1 and D={gram.shape[0]}, got {n_components}"
        )
    eigenvalues, vectors = np.linalg.eigh((gram + gram.T) / 2)  # ascending
    order = np.argsort(eigenvalues)[::-1][:n_components]
    basis = vectors[:, order]
    largest = np.abs(basis).argmax(axis=0)
    basis = basis * np.sign(basis[largest, np.arange(n_components)])
    return basis, np.sqrt(np.clip(eigenvalues[order], 0.0, None))


@dataclass
class QKProjection:
    """Queries and keys of several steps in one basis (one layer and head).

    basis : (D, k) orthonormal columns; singular_values : (k,); energy : (k,) share of the
    squared norm of the fitted rows on each component; queries, keys : one (N_s, k) array per
    step; query_means, key_means : (n_steps, k), the projected means over all rows.
    """

    basis: np.ndarray
    singular_values: np.ndarray
    energy: np.ndarray
    queries: list[np.ndarray]
    keys: list[np.ndarray]
    query_means: np.ndarray
    key_means: np.ndarray


def common_svd(
    queries: Sequence[np.ndarray | torch.Tensor],
    keys: Sequence[np.ndarray | torch.Tensor],
    *,
    basis: str = "union",
    n_components: int = N_COMPONENTS,
) -> QKProjection:
    """Project the queries and keys of every step with one SVD basis (papers/003 Figs. 11-12).

    Parameters
    ----------
    queries, keys : sequences of arrays, shape (N_s, D), one per step
        The rows of step ``s`` (tokens); queries and keys of a step have the same shape.
    basis : {"union", "query", "key"}, keyword-only
        Fit the SVD on every step's queries and keys together (section 5), or on one kind only
        (appendix C).
    n_components : int, keyword-only

    Returns
    -------
    QKProjection

    Examples
    --------
    >>> P = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    >>> shift = np.array([0.0, 3.0])
    >>> out = common_svd([P + shift], [P - shift])
    >>> out.query_means.round(6).tolist(), out.key_means.round(6).tolist()
    ([[3.0, 0.0]], [[-3.0, 0.0]])
    """
    if len(queries) != len(keys) or not queries:
        raise ValueError(
            f"queries and keys need one array per step each, got {len(queries)} and {len(keys)}"
        )
    qs = [_rows(q, f"queries[{i}]") for i, q in enumerate(queries)]
    ks = [_rows(k, f"keys[{i}]") for i, k in enumerate(keys)]
    width = {x.shape[1] for x in qs + ks}
    if len(width) != 1:
        raise ValueError(f"every query and key must have the same width D, got {sorted(width)}")
    gram_q = sum(q.T @ q for q in qs)
    gram_k = sum(k.T @ k for k in ks)
    means_q = np.stack([q.mean(axis=0) for q in qs])
    means_k = np.stack([k.mean(axis=0) for k in ks])
    return _project(gram_q, gram_k, qs, ks, means_q, means_k, basis, n_components)


def _project(gram_q, gram_k, qs, ks, means_q, means_k, basis: str, n_components: int
             ) -> QKProjection:
    if basis not in BASES:
        raise ValueError(f"basis must be one of {BASES}, got {basis!r}")
    gram = {"union": gram_q + gram_k, "query": gram_q, "key": gram_k}[basis]
    V, singular_values = svd_basis(gram, n_components)
    total = float(np.trace(gram))
    energy = singular_values**2 / total if total > 0 else np.full(n_components, np.nan)
    return QKProjection(V, singular_values, energy, [q @ V for q in qs], [k @ V for k in ks],
                        means_q @ V, means_k @ V)


def _rows(x, name: str) -> np.ndarray:
    array = np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] < 1:
        raise ValueError(f"{name} must be a non-empty (N, D) array, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} contains NaN or Inf; a diverged checkpoint?")
    return array


def project(trajectory: QKTrajectory, *, basis: str = "union"
            ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The tables of `qk_trajectory` projected with one SVD per head (`common_svd`'s basis).

    Returns
    -------
    points : step, layer, head, kind (query|key), token, component_1, component_2
    means : step, layer, head, kind, component_1, component_2, cosine (full-dimension
        cosine of the mean query and mean key of that step)
    basis : layer, head, component, singular_value, energy
    """
    points, means, bases = [], [], []
    steps = np.asarray(trajectory.steps)
    for (layer, head), s in trajectory.heads.items():
        mq, mk = np.stack(s.means_q), np.stack(s.means_k)
        proj = _project(s.gram_q, s.gram_k, s.queries, s.keys, mq, mk, basis, N_COMPONENTS)
        cosine = (mq * mk).sum(1) / (np.linalg.norm(mq, axis=1) * np.linalg.norm(mk, axis=1))
        for kind, rows, centre in (("query", proj.queries, proj.query_means),
                                   ("key", proj.keys, proj.key_means)):
            for i, step in enumerate(steps):
                points.append(pd.DataFrame({
                    "step": step, "layer": layer, "head": head, "kind": kind,
                    "token": trajectory.tokens,
                    "component_1": rows[i][:, 0], "component_2": rows[i][:, 1]}))
            means.append(pd.DataFrame({
                "step": steps, "layer": layer, "head": head, "kind": kind,
                "component_1": centre[:, 0], "component_2": centre[:, 1], "cosine": cosine}))
        bases.append(pd.DataFrame({
            "layer": layer, "head": head, "component": np.arange(1, N_COMPONENTS + 1),
            "singular_value": proj.singular_values, "energy": proj.energy}))
    return pd.concat(points, ignore_index=True), pd.concat(means, ignore_index=True), \
        pd.concat(bases, ignore_index=True)


# ---------------------------------------------------------------------------------------------
# The figure


def plot_projection(points: pd.DataFrame, means: pd.DataFrame, *, title: str = ""):
    """One head: left, the drawn queries (dots) and keys (crosses) of every step (Fig. 11);
    right, the mean query and mean key of each step joined by arrows (Fig. 12). Colour = step,
    by checkpoint order as in the probe figures (`repgeom.probes.report.plots`); + marks the
    origin."""
    from repgeom.probes.report.plots import new_figure, step_colorbar, step_colours

    steps = sorted(means["step"].unique().tolist())
    colours, _ = step_colours(steps)
    fig = new_figure(10.5, 4.4)
    left, right, cax = fig.subplots(1, 3, width_ratios=[1, 1, 0.05])
    style = {"query": dict(marker="o", s=6, alpha=0.5, linewidths=0),
             "key": dict(marker="x", s=8, alpha=0.5, linewidths=0.7)}
    for colour, step in zip(colours, steps, strict=True):
        for kind, kw in style.items():
            rows = points[(points["step"] == step) & (points["kind"] == kind)]
            left.scatter(rows["component_1"], rows["component_2"], color=colour, **kw)
    for kind, marker in (("query", "o"), ("key", "X")):
        path = means[means["kind"] == kind].sort_values("step")
        xy = path[["component_1", "component_2"]].to_numpy()
        for i in range(1, len(xy)):
            right.annotate("", xy=xy[i], xytext=xy[i - 1],
                           arrowprops=dict(arrowstyle="->", color=colours[i], lw=1.4))
        right.scatter(xy[:, 0], xy[:, 1], c=colours, marker=marker, s=40, edgecolors="black",
                      linewidths=0.4, label=f"mean {kind}", zorder=3)
    for ax, what in ((left, "queries (o) and keys (x)"), (right, "mean query and mean key")):
        ax.scatter([0], [0], marker="+", color="black", s=60, zorder=4)
        ax.set_xlabel("SVD component 1")
        ax.set_ylabel("SVD component 2")
        ax.set_title(what, fontsize=9)
    right.legend(fontsize=8, loc="best")
    step_colorbar(fig, cax, steps)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


# ---------------------------------------------------------------------------------------------
# Command line


def int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in str(text).split(",") if v.strip() != ""]
    except ValueError:
        raise ValueError(
            f"{text!r} is not a comma-separated list of integers, e.g. 1,2"
        ) from None


def write(
    run_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    basis: str = "union",
    windows: int | None = None,
    points: int | None = DEFAULT_POINTS,
    seed: int = 0,
    device: str | torch.device | None = "auto",
) -> tuple[dict[str, pd.DataFrame], list[Path]]:
    """`qk_trajectory` and `project` of a run, written to `out` (the three CSVs and a figure per
    head, as the module docstring lists); returns the tables and the figures' paths. The
    command line and ``probe.py run=<run> qk_projection=true`` both end here."""
    if basis not in BASES:
        raise ValueError(f"basis must be one of {BASES}, got {basis!r}")
    trajectory = qk_trajectory(run_dir, layers=layers, heads=heads, windows=windows,
                               points=points, seed=seed, device=device)
    tables = dict(zip(("points", "means", "basis"), project(trajectory, basis=basis),
                      strict=True))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in tables.items():
        frame.to_csv(out / ("qk_projection.csv" if name == "points"
                            else f"qk_projection_{name}.csv"), index=False)
    means = tables["means"]
    figures = []
    for (layer, head), rows in tables["points"].groupby(["layer", "head"]):
        fig = plot_projection(
            rows, means[(means["layer"] == layer) & (means["head"] == head)],
            title=f"{Path(run_dir).name}: block {layer}, head {head}, SVD of {basis}",
        )
        path = out / f"qk_projection_layer{layer:02d}_head{head:02d}.png"
        fig.savefig(path, facecolor="white")
        fig.clear()
        figures.append(path)
    print(f"qk_projection: {len(trajectory.steps)} checkpoints (steps {trajectory.steps}), "
          f"{len(trajectory.heads)} heads: {out}")
    return tables, figures
