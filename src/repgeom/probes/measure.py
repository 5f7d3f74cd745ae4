"""Turn captured model states into rows of the tidy probe table.

The one place where `repgeom.metrics` is applied to a model: the training callback and
`probe.py` both feed it `Capture`s (from our GPT or from a Hugging Face model) and get the same
rows back. Captures arrive in micro-batches so memory stays bounded by the probe size: hidden
states, queries and keys are kept (they are small), attention probabilities are reduced batch by
batch and dropped.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from repgeom import metrics
from repgeom.models.capture import Capture

PER_HEAD_METRICS: tuple[str, ...] = (
    "attention_entropy",
    "attention_entropy_norm",
    "attention_max",
    "attention_median",
    "attention_min",
    "qk_cosine",
    "qk_dot",
    "score_mean",
    "score_std",
    "score_max_abs",
)
"""The metrics `measure` reports once per attention head (rows with head >= 0)."""


@dataclass
class ProbeSettings:
    """What to compute, and the estimator options (see `repgeom.metrics` for each)."""

    attention: bool = True
    intrinsic_dimension: bool = True
    distributions: bool = False
    discard_fraction: float = 0.1
    twonn_batch_size: int = 4096
    max_order: int = 64
    near_duplicate_threshold: float = 0.1
    cosine_baseline_quantile: float = 0.95
    distribution_samples: int = 5000
    seed: int = 0


@dataclass
class ProbeOutput:
    """Rows of the tidy table (without `step`) and one warning per skipped metric and layer."""

    rows: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def add(
        self, layer: int, metric: str, value: float, *, head: int = -1, std: float = math.nan
    ) -> None:
        self.rows.append(
            {
                "layer": layer,
                "head": head,
                "metric": metric,
                "value": float(value),
                "std": float(std),
            }
        )


@functools.lru_cache(maxsize=64)
def _cosine_baseline(n: int, d: int, quantile: float, seed: int) -> float:
    """Chance level of the mean cosine; depends only on (n, d), so it is computed once."""
    return metrics.isotropic_cosine_baseline(n, d, quantile=quantile, seed=seed)


class _AttentionSums:
    """Row-weighted running means of `AttentionResult` fields over micro-batches."""

    FIELDS = {
        "attention_entropy": "entropy",
        "attention_entropy_norm": "normalized_entropy",
        "attention_max": "max_prob",
        "attention_median": "median_prob",
        "attention_min": "min_prob",
    }

    def __init__(self) -> None:
        self.sums: dict[str, np.ndarray] = {}
        self.rows = 0

    def add(self, result: metrics.AttentionResult) -> None:
        for name, attr in self.FIELDS.items():
            value = np.asarray(getattr(result, attr), dtype=np.float64) * result.n_rows
            self.sums[name] = self.sums.get(name, 0.0) + value
        self.rows += result.n_rows

    def means(self) -> dict[str, np.ndarray]:
        return {name: total / self.rows for name, total in self.sums.items()}


def _flatten(hidden: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """(B, T, C) states -> (N, C) float32 rows at the valid positions."""
    states = hidden if valid is None else hidden[valid.to(hidden.device)]
    return states.reshape(-1, hidden.size(-1)).float()


def measure(captures: Iterable[Capture], settings: ProbeSettings) -> ProbeOutput:
    """Every metric for every layer (and head) of the states in `captures`.

    Layer 0 is the state after the embedding, layer i the state after block i; attention and
    Q/K metrics belong to the block that computes them (layers 1..L). A metric that cannot be
    computed for a layer (too few points, NaN/Inf states, unreadable attention) is skipped with
    one warning naming the metric and layer; every other metric is still returned.
    """
    out = ProbeOutput()
    hidden: list[list[torch.Tensor]] = []
    queries: list[list[torch.Tensor]] = []
    keys: list[list[torch.Tensor]] = []
    valids: list[torch.Tensor] = []
    attention: list[_AttentionSums] = []
    causal = True
    for capture in captures:
        causal = capture.causal
        if not hidden:
            hidden = [[] for _ in capture.hidden]
            queries = [[] for _ in capture.queries]
            keys = [[] for _ in capture.keys]
            attention = [_AttentionSums() for _ in capture.attention]
        valid = capture.valid
        if valid is None:
            B, T = capture.hidden[0].shape[:2]
            valid = torch.ones(B, T, dtype=torch.bool)
        valids.append(valid.cpu())
        for layer, states in enumerate(capture.hidden):
            hidden[layer].append(_flatten(states, valid))
        for layer, (q, k) in enumerate(zip(capture.queries, capture.keys, strict=True)):
            queries[layer].append(q)
            keys[layer].append(k)
        for layer, probs in enumerate(capture.attention):
            with _skip_on_error(out, "attention_entropy", layer + 1):
                result = metrics.attention_entropy(
                    probs, causal=causal, valid=valid.to(probs.device)
                )
                attention[layer].add(result)
    if not hidden:
        raise ValueError("measure() got no captures: the probe set is empty")

    for layer, parts in enumerate(hidden):
        _measure_states(out, layer, torch.cat(parts), settings)
    if settings.attention and not attention:
        out.warnings.append("attention probabilities were not captured; attention metrics skipped")
    for index, sums in enumerate(attention):
        if sums.rows:
            for name, values in sums.means().items():
                for head, value in enumerate(values):
                    out.add(index + 1, name, value, head=head)
    valid_all = torch.cat(valids)
    for index, (q_parts, k_parts) in enumerate(zip(queries, keys, strict=True)):
        with _skip_on_error(out, "qk_alignment", index + 1):
            _measure_qk(out, index + 1, torch.cat(q_parts), torch.cat(k_parts), causal, valid_all)
    return out


@contextmanager
def _skip_on_error(out: ProbeOutput, metric: str, layer: int) -> Iterator[None]:
    """On a ValueError from a metric (its inputs are unusable), record a warning and carry on."""
    try:
        yield
    except ValueError as error:
        out.warnings.append(f"probe: {metric} skipped at layer {layer}: {error}")


def _measure_states(out: ProbeOutput, layer: int, X: torch.Tensor, settings: ProbeSettings) -> None:
    n, d = X.shape
    with _skip_on_error(out, "anisotropy", layer):
        out.add(layer, "anisotropy", metrics.anisotropy(X))
    with _skip_on_error(out, "mean_cosine", layer):
        out.add(layer, "mean_cosine", metrics.mean_cosine_similarity(X))
        baseline = _cosine_baseline(n, d, settings.cosine_baseline_quantile, settings.seed)
        out.add(layer, "cosine_baseline", baseline)
    with _skip_on_error(out, "drift", layer):
        result = metrics.drift(X)
        out.add(layer, "drift_norm", result.norm)
        out.add(layer, "drift_ratio", result.ratio)
    if settings.intrinsic_dimension:
        with _skip_on_error(out, "intrinsic_dimension", layer):
            _measure_id(out, layer, X, settings)
    if settings.distributions:
        with _skip_on_error(out, "activation_distribution", layer):
            _measure_distribution(out, layer, X, settings)


def _measure_id(out: ProbeOutput, layer: int, X: torch.Tensor, settings: ProbeSettings) -> None:
    max_order = settings.max_order
    batch = min(settings.twonn_batch_size, X.shape[0])
    result = metrics.intrinsic_dimension(
        X,
        discard_fraction=settings.discard_fraction,
        batch_size=batch,
        max_order=max_order,
        near_duplicate_threshold=settings.near_duplicate_threshold,
        seed=settings.seed,
    )
    twonn = result.twonn
    out.add(layer, "twonn", twonn.dimension, std=twonn.dimension_std)
    out.add(layer, "twonn_mle", twonn.mle, std=twonn.mle_std)
    out.add(layer, "duplicates", twonn.n_duplicates)
    for order, dim, std in zip(
        result.gride.orders, result.gride.dimension, result.gride.dimension_std, strict=True
    ):
        out.add(layer, f"gride_k{order}", dim, std=std)
    out.add(layer, "near_duplicate_share", result.near_duplicate_share)


def _measure_distribution(
    out: ProbeOutput, layer: int, X: torch.Tensor, settings: ProbeSettings
) -> None:
    result = metrics.activation_distribution(
        X, n_samples=settings.distribution_samples, seed=settings.seed
    )
    out.add(layer, "kurtosis", result.kurtosis)
    out.add(layer, "n_modes", 1 + result.n_secondary_modes)
    for family, loglik in result.log_likelihoods.items():
        out.add(layer, f"loglik_{family}", loglik / result.n_samples)
        # AIC per sample, 2k - 2 log L over n: t and gennorm nest the normal law and always win
        # on log-likelihood alone, so the report also names the family AIC prefers.
        n_params = len(result.params[family])
        out.add(layer, f"aic_{family}", (2 * n_params - 2 * loglik) / result.n_samples)


def _measure_qk(
    out: ProbeOutput,
    layer: int,
    Q: torch.Tensor,
    K: torch.Tensor,
    causal: bool,
    valid: torch.Tensor,
) -> None:
    result = metrics.qk_alignment(Q, K, causal=causal, valid=valid.to(Q.device))
    for name in ("cosine", "dot", "score_mean", "score_std", "score_max_abs"):
        metric = f"qk_{name}" if name in ("cosine", "dot") else name
        for head, value in enumerate(np.asarray(getattr(result, name))):
            out.add(layer, metric, value, head=head)
