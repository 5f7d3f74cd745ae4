"""The metric catalogue: every metric the probe can compute, each declared once.

An entry (`Metric`) says what the metric reads, the function that computes it, and the facts
every consumer needs about the table rows it writes (`Output`: pretty label, which figures draw
it, whether the console shows it). The measurement (`measure`), the table, the W&B keys
(``probe/<metric>/layer_<ii>``), the figures (`plots.save_figures`) and the console summary all
read these entries, so a new built-in metric is its function in `repgeom.metrics`, its entry
below and its test.

What an entry reads:

- ``"states"``: one layer's states, (N, D). With ``batched=True`` (the default) ``fn(X)`` is
  called on each shuffled batch of ``state_batch_size`` states (Razzhigaev et al. 2023,
  section 2.2) and the table holds the mean over batches with its std; it returns a float, or a
  dict whose keys become ``<name>_<key>`` rows. With ``batched=False`` ``fn(X, settings)`` sees
  the whole layer and returns ``(metric, value, std)`` rows itself (the intrinsic dimension does
  its own batching, so that one neighbour search per batch serves TwoNN, GRIDE and the MLE).
- ``"attention"``, ``"qk"``: one block's attention probabilities or queries and keys, on whole
  windows (`measure.measure_attention`). Per head (``per_head=True``): ``fn(Q, K, causal=,
  valid=)`` returns a result with one value per head for each output (`qk_alignment`). Per
  layer: ``fn(Q, K, valid=)`` returns one float, the row of the entry's own name (head -1).
- ``"pair"``: two paired state sets, ``fn(X, Y) -> float`` (CKA, mutual k-NN): between every
  pair of layers at a probe step, between a step and the final one, between two runs.

Users plug in their own metric by configuration: ``probe.metrics=[default,mypkg.mod.my_metric]``
(train.py) or ``metrics=[all,mypkg.mod.my_metric]`` (probe.py), where ``my_metric(X) -> float |
dict[str, float]`` takes a layer's states as an (N, D) float tensor; see `resolve`.
"""

from __future__ import annotations

import functools
import importlib
import math
import re
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from repgeom import metrics
from repgeom.metrics import alignment
from repgeom.metrics._validation import check_matrix
from repgeom.metrics.linearity import linearity
from repgeom.probes.core import id_noise

Reads = Literal["states", "attention", "qk", "pair"]
FIGURES = ("profile", "vs_step", "per_layer", "per_head")
"""Figure kinds an output may ask for in `plots.save_figures`; every metric also gets a
layer x step heatmap when there are several steps, and a profile when there is one."""


@dataclass(frozen=True)
class Output:
    """One metric name in the table (or a family, as a regular expression) and its facts."""

    pattern: str
    label: str
    figures: tuple[str, ...] = ("profile",)
    console: bool = False
    """Shown in probe.py's console table."""
    wandb: tuple[str, ...] = ()
    """W&B extras (`wandb_charts`): "profile" (a layer-profile chart), "layer_step" (a layer x
    step map), "peak" (each layer's peak in the run summary), "final" (the final profile)."""
    member: str = ""
    r"""For a family (a pattern such as ``gride_k(\d+)``): the member that console and W&B show."""
    intrinsic_dimension: bool = False

    def matches(self, metric: str) -> bool:
        return re.fullmatch(self.pattern, metric) is not None


@dataclass(frozen=True)
class Metric:
    """A catalogue entry: what a metric reads, how it is computed, the rows it writes."""

    name: str
    reads: Reads
    fn: Callable[..., Any]
    outputs: tuple[Output, ...] = ()
    batched: bool = True
    per_head: bool = False
    training: bool = True
    """In the ``default`` set of the training probe (cheap); ``all`` (probe.py) has every one."""
    prepare: Callable[..., Any] | None = None
    """Pairwise entries: a per-set step (a neighbour search) computed once per layer and batch;
    ``fn`` then takes two prepared sets. None: ``fn(X, Y)`` on the states."""
    switch: str | None = None
    """A boolean of `ProbeSettings` that also gates this entry (kept: checkpoints carry it)."""
    user: bool = False

    def __post_init__(self) -> None:
        if self.reads not in ("states", "attention", "qk", "pair"):
            raise ValueError(f"metric {self.name}: reads must be states/attention/qk/pair")
        if not self.outputs:  # one row name, the entry's own, or <name>_<key> for a dict
            label = self.name.replace("_", " ").capitalize()
            object.__setattr__(
                self, "outputs", (Output(rf"{re.escape(self.name)}(_\w+)?", label),)
            )


# ---------------------------------------------------------------------------------------------
# The built-in entries' functions (thin adapters of `repgeom.metrics`)


def _drift(X) -> dict[str, float]:
    result = metrics.drift(X)
    return {"norm": result.norm, "ratio": result.ratio}


def _pca_dimension(X) -> dict[str, float]:
    d90, d99 = metrics.pca_dimension(X, variance=(0.9, 0.99))
    return {"90": float(d90), "99": float(d99)}


@functools.lru_cache(maxsize=64)
def _baseline(d: int, quantile: float) -> float:
    return metrics.isotropic_cosine_baseline(d, quantile=quantile)


def _cosine_baseline(X, settings) -> list[tuple[str, float, float]]:
    """Godey et al.'s baseline: the quantile of one isotropic pair's cosine in d dimensions."""
    return [("cosine_baseline", _baseline(X.shape[1], settings.cosine_baseline_quantile), math.nan)]


ID_GUARDED = re.compile(r"twonn|twonn_mle|twonn_llm_microscope|gride_k\d+|mle_dimension|"
                        r"twonn_dec\d+|id_plateau(_lo|_hi)?")
"""The intrinsic-dimension readings that `ProbeSettings.max_copy_share` sets to NaN."""


def _copy_share(result, n: int) -> float:
    """Share of the ``n`` states that are exact copies (merged before the search) or have a
    near-copy (`metrics.near_duplicate_share`, a share of the distinct points)."""
    twonn = result.twonn
    return (twonn.n_duplicates + result.near_duplicate_share * twonn.n_points) / n


def _guard(rows: list[tuple], share: float, limit: float) -> list[tuple]:
    """Every ID reading of `rows` NaN with its reason where the copy share exceeds `limit`."""
    if not share > limit:
        return rows
    note = (f"copies: {share:.0%} of the states are copies or near-copies "
            f"(max_copy_share {limit:.0%}); the estimators would read the jitter inside clumps")
    return [(row[0], math.nan, math.nan, note) if ID_GUARDED.fullmatch(row[0]) else row
            for row in rows]


_LAST_SEARCH: list = []
"""(weak reference to the states, options, result) of the last `_id_search`:
``intrinsic_dimension`` runs before
``id_scales`` on the same layer's tensor (catalogue order), which then reuses its neighbour
search (and so reads GRIDE's scales from the very search of the ``gride_k`` rows) instead of
repeating it. The reference is weak, so the states are not kept alive by it."""


def _id_search(X, settings, *, reuse: bool = False):
    options = (settings.discard_fraction, min(settings.state_batch_size, X.shape[0]),
               settings.max_order, settings.near_duplicate_threshold, settings.seed)
    if reuse and _LAST_SEARCH and _LAST_SEARCH[0]() is X and _LAST_SEARCH[1] == options:
        result = _LAST_SEARCH[2]
    else:
        discard_fraction, batch_size, max_order, threshold, seed = options
        result = metrics.intrinsic_dimension(
            X, discard_fraction=discard_fraction, batch_size=batch_size, max_order=max_order,
            near_duplicate_threshold=threshold, seed=seed,
        )
    _LAST_SEARCH[:] = [] if reuse else [weakref.ref(X), options, result]
    return result


def _intrinsic_dimension(X, settings) -> list[tuple]:
    """TwoNN, GRIDE and the Levina-Bickel MLE from one exact neighbour search per batch; NaN
    with a note where copies exceed ``settings.max_copy_share`` (`_guard`)."""
    result = _id_search(X, settings)
    twonn = result.twonn
    spread = 1.0 if twonn.n_batches > 1 else math.nan  # one batch has no spread to report
    if settings.twonn_convention == "llm_microscope":  # the authors' fit, on the same batches
        batch = min(settings.state_batch_size, X.shape[0])
        dims = [metrics.twonn_authors(X[index.to(X.device)]).dimension
                for index in metrics.batch_indices(X.shape[0], batch, settings.seed)]
        rows = [("twonn_llm_microscope", float(np.mean(dims)), float(np.std(dims)) * spread)]
    else:
        rows = [("twonn", twonn.dimension, twonn.dimension_std * spread),
                ("twonn_mle", twonn.mle, twonn.mle_std * spread)]
    rows.append(("duplicates", twonn.n_duplicates, math.nan))
    gride = result.gride
    for order, dim, std in zip(gride.orders, gride.dimension, gride.dimension_std, strict=True):
        rows.append((f"gride_k{order}", dim, std * spread))
    rows.append(("near_duplicate_share", result.near_duplicate_share, math.nan))
    mle = result.mle
    rows.append(("mle_dimension", mle.dimension, mle.dimension_std * spread))
    share = _copy_share(result, X.shape[0])
    rows.append(("copy_share", share, math.nan))
    noise = (id_noise.standard_errors(X, settings, twonn.n_batches)
             if not share > settings.max_copy_share else {})
    return id_noise.attach(_guard(rows, share, settings.max_copy_share), noise, twonn.n_batches)


def _id_scales(X, settings) -> list[tuple]:
    """The scale profile (Facco et al. 2017; Denti et al. 2022): TwoNN by decimation of the
    whole layer and GRIDE at orders 2..max_order, each with its length scale, and the plateau
    over both (`metrics.id_plateau`).

    Rows: ``twonn_dec<j>`` (TwoNN on subsets of round(N / 2**j) states, mean over the subsets;
    std: DADApy's error of that mean, NaN for j = 0), ``twonn_dec<j>_scale`` (its mean distance
    to the first two neighbours), ``gride_k<k>_scale`` (GRIDE's mean distance of the k/2-th and
    k-th neighbours; its ID is the ``gride_k<k>`` row: the same batches and search), and
    ``id_plateau`` (std: root mean square of its points' noise), ``id_plateau_lo``,
    ``id_plateau_hi`` (its range of scales); NaN with the reason in ``note`` where there is no
    plateau or where copies exceed ``settings.max_copy_share``.
    """
    result = _id_search(X, settings, reuse=True)
    decimation = metrics.twonn_decimation(X, discard_fraction=settings.discard_fraction,
                                          seed=settings.seed)
    gride = result.gride
    spread = 1.0 if gride.n_batches > 1 else math.nan
    err = np.where(decimation.n_subsets > 1, decimation.dimension_err, math.nan)
    rows: list[tuple] = []
    for j, (dim, std, scale) in enumerate(zip(decimation.dimension, err, decimation.scale,
                                              strict=True)):
        rows += [(f"twonn_dec{j}", dim, std), (f"twonn_dec{j}_scale", scale, math.nan)]
    for order, scale in zip(gride.orders, gride.scale, strict=True):
        rows.append((f"gride_k{order}_scale", scale, math.nan))
    noise = np.concatenate([err, gride.dimension_std * spread])
    plateau = metrics.id_plateau(np.concatenate([decimation.scale, gride.scale]),
                                 np.concatenate([decimation.dimension, gride.dimension]), noise)
    if plateau.n_points:
        on = np.zeros(len(noise), dtype=bool)  # the points on the plateau, for its noise
        scales = np.concatenate([decimation.scale, gride.scale])
        on[(scales >= plateau.low) & (scales <= plateau.high)] = True
        known = noise[on & np.isfinite(noise)]
        std = float(np.sqrt(np.mean(known**2))) if known.size else math.nan
        rows += [("id_plateau", plateau.dimension, std), ("id_plateau_lo", plateau.low, math.nan),
                 ("id_plateau_hi", plateau.high, math.nan)]
    else:
        rows += [(name, math.nan, math.nan, plateau.reason)
                 for name in ("id_plateau", "id_plateau_lo", "id_plateau_hi")]
    return _guard(rows, _copy_share(result, X.shape[0]), settings.max_copy_share)


def _distributions(X, settings) -> list[tuple[str, float, float]]:
    result = metrics.activation_distribution(
        X, n_samples=settings.distribution_samples, seed=settings.seed
    )
    rows = [("kurtosis", result.kurtosis, math.nan), ("n_modes", 1 + result.n_secondary_modes,
                                                        math.nan)]
    for family, loglik in result.log_likelihoods.items():
        rows.append((f"loglik_{family}", loglik / result.n_samples, math.nan))
        # AIC per sample, 2k - 2 log L over n: t and gennorm nest the normal law and always win
        # on log-likelihood alone, so the report also names the family AIC prefers.
        n_params = len(result.params[family])
        rows.append((f"aic_{family}", (2 * n_params - 2 * loglik) / result.n_samples, math.nan))
    return rows


def _knn_prepare(X):
    """One neighbour search per layer and batch serves every pair it is part of."""
    if X.shape[0] <= 10:
        raise ValueError(f"mutual_knn needs more than k = 10 rows, got {X.shape[0]}")
    return alignment._cosine_neighbors(check_matrix(X, "X"), 10)


def _id(pattern: str, label: str, **facts) -> Output:
    return Output(pattern, label, intrinsic_dimension=True, **facts)


_ATTENTION_OUTPUTS = (
    Output("attention_entropy", "Attention entropy (nats)", ("per_layer",), wandb=("profile",)),
    Output("attention_entropy_norm", "Normalised attention entropy", ("per_layer",), True),
    Output("attention_max", "Max attention weight", ()),
    Output("attention_median", "Median attention weight", ()),
    Output("attention_min", "Min attention weight", ()),
)
_QK_OUTPUTS = (
    Output("qk_cosine", "Q\u0304/K\u0304 cosine", ("per_head",), True, wandb=("profile",)),
    Output("qk_dot", "Q\u0304\u00b7K\u0304", ()),
    Output("score_mean", "Attention score mean", ()),
    Output("score_std", "Attention score std", ()),
    Output("score_max_abs", "Attention score max |s|", ()),
)
_QK_CONCAT_OUTPUTS = (
    Output("qk_cosine_concat", "Q\u0304/K\u0304 cosine, heads concatenated",
           ("profile", "vs_step"), True, wandb=("profile",)),
)

BUILTIN: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("anisotropy", "states", metrics.anisotropy,
               (Output("anisotropy", "Anisotropy", ("profile", "vs_step"), True,
                       wandb=("profile", "layer_step", "final")),)),
        Metric("mean_cosine", "states", metrics.mean_cosine_similarity,
               (Output("mean_cosine", "Mean cosine similarity", ("profile",), True,
                       wandb=("profile",)),)),
        Metric("cosine_baseline", "states", _cosine_baseline,
               (Output("cosine_baseline",
                       "Cosine baseline (95th pct. of an isotropic pair, Godey et al.)", ()),),
               batched=False),
        Metric("drift", "states", _drift,
               (Output("drift_norm", "Drift norm", ()),
                Output("drift_ratio", "Drift ratio", (), True))),
        Metric("intrinsic_dimension", "states", _intrinsic_dimension,
               (_id("twonn", "Intrinsic dimension (TwoNN)", figures=("profile", "vs_step"),
                    console=True, wandb=("profile", "layer_step", "peak")),
                # Only where settings.twonn_convention=llm_microscope: no dashboard panels of
                # its own (the dashboard plots what every run logs); phases and peaks follow it.
                _id("twonn_llm_microscope", "Intrinsic dimension (TwoNN, llm-microscope fit)",
                    figures=("profile", "vs_step"), console=True, wandb=("peak",)),
                _id("twonn_mle", "Intrinsic dimension (TwoNN MLE)"),
                _id(r"gride_k(?P<k>\d+)", "Intrinsic dimension (GRIDE, k={k})",
                    console=True, member="gride_k16", wandb=("profile", "layer_step", "peak")),
                _id("mle_dimension", "Intrinsic dimension (Levina-Bickel MLE, k=20)"),
                Output("duplicates", "Duplicates", ()),
                Output("near_duplicate_share", "Near-duplicate share", ()),
                Output("copy_share", "Share of states that are copies or near-copies", ())),
               batched=False, switch="intrinsic_dimension"),
        # Off in training (on in probe.py's `all` and experiment=shape_of_learning): the
        # decimation of the whole layer costs 2-3 s per layer of 8192 x 128 states on the
        # shared 2-core box, more than the entry above (whose search it reuses).
        Metric("id_scales", "states", _id_scales,
               (_id(r"twonn_dec(?P<j>\d+)", "Intrinsic dimension (TwoNN on N/2^{j} states)",
                    figures=()),
                Output(r"twonn_dec(?P<j>\d+)_scale",
                       "Mean neighbour distance of TwoNN on N/2^{j} states", ()),
                Output(r"gride_k(?P<k>\d+)_scale",
                       "Mean neighbour distance of GRIDE, k={k}", ()),
                _id("id_plateau", "Intrinsic dimension (plateau over scales)",
                    figures=("profile", "vs_step"), console=True, wandb=("peak",)),
                Output(r"id_plateau_(?P<end>lo|hi)", "Plateau's {end} end (mean neighbour "
                                                     "distance)", ())),
               batched=False, switch="intrinsic_dimension", training=False),
        Metric("effective_rank", "states", metrics.effective_rank,
               (Output("effective_rank", "Effective rank (Roy & Vetterli)"),)),
        Metric("rankme", "states", metrics.rankme, (Output("rankme", "RankMe (Garrido et al.)"),)),
        Metric("isoscore", "states", metrics.isoscore,
               (Output("isoscore", "IsoScore (Rudman et al.)"),)),
        Metric("pca_dimension", "states", _pca_dimension,
               (Output(r"pca_dimension_(?P<k>\d+)", "PCA dimension ({k}% of the variance)"),)),
        Metric("attention", "attention", metrics.attention_entropy, _ATTENTION_OUTPUTS,
               per_head=True, switch="attention"),
        Metric("qk_alignment", "qk", metrics.qk_alignment, _QK_OUTPUTS, per_head=True),
        Metric("qk_cosine_concat", "qk", metrics.qk_cosine_concat, _QK_CONCAT_OUTPUTS),
        Metric("distributions", "states", _distributions,
               (Output("kurtosis", "Excess kurtosis", (), True),
                Output("n_modes", "Number of modes", ()),
                Output(r"(loglik|aic)_\w+", "{0}", ())),
               batched=False, switch="distributions"),
        Metric("linear_cka", "pair", metrics.linear_cka,
               (Output("linear_cka", "Linear CKA (Kornblith et al.)", ()),), training=False),
        Metric("mutual_knn", "pair", alignment._knn_overlap,
               (Output("mutual_knn", "Mutual k-NN overlap (k=10, Huh et al.)", ()),),
               training=False, prepare=_knn_prepare),
        Metric("linearity", "pair", linearity,
               (Output("linearity", "Linearity of the map from layer to layer_b (Razzhigaev et "
                                    "al. 2024)", ()),),
               training=False),
    )
}
"""Every built-in metric by name, in the order the table's rows are written."""

_USER: dict[str, Metric] = {}


def user_metric(path: str) -> Metric:
    """The entry of a user's function named by its dotted import path, e.g. ``mypkg.mod.fn``.

    The function takes one layer's states, an (N, D) float32 tensor, and returns a float or a
    dict of floats; it is applied to every batch of ``state_batch_size`` states like the
    built-in state metrics (mean and std over batches). Its table name is the function's name
    (``<name>_<key>`` for each key of a dict).
    """
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ValueError(
            f"metrics: {path!r} is neither a built-in metric ({', '.join(BUILTIN)}) nor a dotted "
            "import path such as mypkg.mymodule.my_metric"
        )
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"metrics: cannot import {path!r}: {error}") from None
    if not callable(fn):
        raise ValueError(f"metrics: {path!r} is not a function")
    if attr in BUILTIN or any(o.matches(attr) for m in BUILTIN.values() for o in m.outputs):
        raise ValueError(f"metrics: {path!r} is named like a built-in metric; rename it")
    metric = Metric(attr, "states", fn, user=True)
    _USER[attr] = metric
    return metric


def resolve(names: Iterable[str]) -> list[Metric]:
    """Catalogue entries of a ``metrics`` list, in catalogue order, then the user's.

    Each name is a built-in (`BUILTIN`), ``default`` (the training probe's cheap set: every
    built-in with ``training=True``), ``all`` (every built-in), or a dotted import path of a user
    function (`user_metric`).
    """
    chosen: dict[str, Metric] = {}
    users: dict[str, Metric] = {}
    for name in names:
        name = str(name)
        if name == "all":
            chosen.update(BUILTIN)
        elif name == "default":
            chosen.update({k: m for k, m in BUILTIN.items() if m.training})
        elif name in BUILTIN:
            chosen[name] = BUILTIN[name]
        else:
            metric = user_metric(name)
            users[metric.name] = metric
    return [m for m in BUILTIN.values() if m.name in chosen] + list(users.values())


def check_names(names: Sequence[str]) -> None:
    """Raise ValueError on a ``metrics`` entry that is neither built in nor importable."""
    resolve(names)


# ---------------------------------------------------------------------------------------------
# Facts of a table metric, for the table's readers (figures, console, W&B)


def output_of(metric: str) -> Output | None:
    """The `Output` that writes table metric `metric` (None: unknown, e.g. an unloaded user's)."""
    for entry in (*BUILTIN.values(), *_USER.values()):
        for output in entry.outputs:
            if output.matches(metric):
                return output
    return None


def entry_of(metric: str) -> Metric | None:
    """The catalogue entry that writes table metric `metric`."""
    for entry in (*BUILTIN.values(), *_USER.values()):
        if any(o.matches(metric) for o in entry.outputs):
            return entry
    return None


def label(metric: str) -> str:
    """The pretty name of table metric `metric` (the name de-underscored when unknown)."""
    output = output_of(metric)
    if output is None:
        return metric.replace("_", " ").capitalize()
    match = re.fullmatch(output.pattern, metric)
    return output.label.format(metric.replace("_", " ").capitalize(), **match.groupdict())


def figures(metric: str) -> tuple[str, ...]:
    """The figure kinds of `metric`; an unknown (user) metric gets its layer profile."""
    output = output_of(metric)
    return ("profile",) if output is None else output.figures


def is_intrinsic_dimension(metric: str) -> bool:
    output = output_of(metric)
    return output is not None and output.intrinsic_dimension


def per_head(metric: str) -> bool:
    entry = entry_of(metric)
    return entry is not None and entry.per_head


def console_metrics() -> list[str]:
    """Table metrics of the console's per-layer table, in catalogue order."""
    names = []
    for entry in BUILTIN.values():
        names += [o.member or o.pattern for o in entry.outputs if o.console]
    return names + list(_USER)


def wandb_metrics(kind: str) -> tuple[str, ...]:
    """Table metrics with W&B extra `kind` ("profile", "layer_step", "peak", "final")."""
    return tuple(
        o.member or o.pattern for m in BUILTIN.values() for o in m.outputs if kind in o.wandb
    )


PAIR_NAMES = tuple(m.name for m in BUILTIN.values() if m.reads == "pair")


@dataclass
class Selection:
    """The entries one probe computes, split by what they read."""

    states: list[Metric] = field(default_factory=list)
    attention: Metric | None = None
    qk: list[Metric] = field(default_factory=list)
    pairs: list[Metric] = field(default_factory=list)


def select(settings) -> Selection:
    """The entries of ``settings.metrics`` that ``settings``' switches leave on."""
    out = Selection()
    for entry in resolve(settings.metrics):
        if entry.switch is not None and not getattr(settings, entry.switch):
            continue
        if entry.reads == "states":
            out.states.append(entry)
        elif entry.reads == "attention":
            out.attention = entry
        elif entry.reads == "qk":
            out.qk.append(entry)
        else:
            out.pairs.append(entry)
    return out
