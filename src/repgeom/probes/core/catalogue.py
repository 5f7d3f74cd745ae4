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
  dict whose keys become ``<name>_<key>`` rows (the key ``""``: ``<name>`` itself). With
  ``batched=False`` ``fn(X, settings)`` sees the whole layer and returns ``(metric, value,
  std)`` rows itself (the intrinsic dimension does its own batching, so that one neighbour
  search per batch serves TwoNN, GRIDE and the MLE).
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from repgeom import metrics
from repgeom.metrics import alignment
from repgeom.metrics._validation import check_matrix
from repgeom.metrics.linearity import linearity
from repgeom.probes.core.id_entries import (  # noqa: F401 - ID_GUARDED is read from here too
    ID_GUARDED,
    _id_scales,
    _intrinsic_dimension,
)
from repgeom.probes.core.pairwise import null

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
    permute: Callable[..., Any] | None = None
    """Pairwise entries: a prepared set with its rows shuffled, ``permute(prepared, perm)``, for
    the permutation null (`repgeom.probes.core.pairwise.null`); None: the entry has no null."""
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


def _alpha_req(X) -> dict[str, float]:
    """alpha-ReQ and its fit's R^2: rows ``alpha_req`` (the key "" is the entry's own name) and
    ``alpha_req_r2``."""
    result = metrics.alpha_req(X)
    return {"": result.alpha, "r2": result.r2}


def _pca_dimension(X) -> dict[str, float]:
    d90, d99 = metrics.pca_dimension(X, variance=(0.9, 0.99))
    return {"90": float(d90), "99": float(d99)}


@functools.lru_cache(maxsize=64)
def _baseline(d: int, quantile: float) -> float:
    return metrics.isotropic_cosine_baseline(d, quantile=quantile)


def _cosine_baseline(X, settings) -> list[tuple[str, float, float]]:
    """Godey et al.'s baseline: the quantile of one isotropic pair's cosine in d dimensions."""
    return [("cosine_baseline", _baseline(X.shape[1], settings.cosine_baseline_quantile), math.nan)]


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


def _null(name: str) -> tuple[Output, Output]:
    """The rows of a pair's permutation null (`repgeom.probes.core.pairwise.null`)."""
    return (Output(f"{name}_chance", f"{name} under shuffled pairing (chance level)", ()),
            Output(f"{name}_p", f"{name}: permutation p-value", ()))


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
        Metric("alpha_req", "states", _alpha_req,
               (Output("alpha_req", "alpha-ReQ (power-law decay of the spectrum, Agrawal et al.)",
                       ("profile", "vs_step")),
                Output("alpha_req_r2", "alpha-ReQ fit R\u00b2", ()))),
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
               (Output("linear_cka", "Linear CKA (Kornblith et al.)", ()), *_null("linear_cka")),
               training=False, permute=null.permute_rows),
        Metric("linear_cka_unbiased", "pair", metrics.linear_cka_unbiased,
               (Output("linear_cka_unbiased", "Linear CKA, unbiased HSIC (Song et al.)", ()),
                *_null("linear_cka_unbiased")),
               training=False, permute=null.permute_rows),
        Metric("mutual_knn", "pair", alignment._knn_overlap,
               (Output("mutual_knn", "Mutual k-NN overlap (k=10, Huh et al.)", ()),
                *_null("mutual_knn")),
               training=False, prepare=_knn_prepare, permute=null.permute_neighbors),
        Metric("linearity", "pair", linearity,
               (Output("linearity", "Linearity of the map from layer to layer_b (Razzhigaev et "
                                    "al. 2024)", ()),),
               training=False),
    )
}
"""Every built-in metric by name, in the order the table's rows are written."""

MODEL_OUTPUTS = (
    Output("lm_loss", "LM loss on the probe's windows (nats per token)", ("vs_step",),
           wandb=("final",)),
    Output("bpc", "Bits per character on the probe's windows", ("vs_step",), wandb=("final",)),
)
"""The rows of the whole model (`repgeom.probes.core.prediction.lm_loss`, `table.MODEL_METRICS`):
not catalogue entries (every probe of a model with a head writes them), but table metrics with
the same facts."""

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
    return next((o for o in MODEL_OUTPUTS if o.matches(metric)), None)


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
    ) + tuple(o.pattern for o in MODEL_OUTPUTS if kind in o.wandb)


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
