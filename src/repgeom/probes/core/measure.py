"""Turn captured model states into rows of the tidy probe table.

The one place where `repgeom.metrics` is applied to a model: the training callback and
`probe.py` both feed it `Capture`s (from our GPT or from a Hugging Face model) and get the same
rows back. Two probe sets feed it (`repgeom.probes.core.sampling`):

- **states**: a few random positions from each of many windows, so that neighbouring characters
  of one window do not become each other's nearest neighbours. Every per-layer state metric
  (anisotropy, mean cosine, drift, TwoNN, GRIDE) follows Razzhigaev et al. 2023, section 2.2:
  the states are shuffled, cut into batches of at least ``state_batch_size`` (4096), the metric
  is computed per batch, and the table holds the mean over batches with its standard deviation.
- **attention**: whole windows, for the attention and query/key metrics, which need every
  position a query attends to.

Layers follow one convention for every model (`repgeom.models.capture.Capture`): ``embedding``
(0), ``block_<i>`` (the residual stream after block i, 1..L), and where the model has a final
norm its output as its own layer ``final_norm`` (L + 1); the ``layer_name`` column says which.
Captures arrive in micro-batches so memory stays bounded by the probe size: hidden states,
queries and keys are kept (they are small), attention probabilities are reduced batch by batch
and dropped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from repgeom import metrics
from repgeom.metrics._spectrum import shared_spectrum
from repgeom.metrics._validation import check_fraction, check_int
from repgeom.metrics.intrinsic_dimension.gride import check_max_order
from repgeom.models.capture import FINAL_NORM, Capture, layer_names  # noqa: F401 - public here too
from repgeom.probes.core import catalogue, id_entries
from repgeom.probes.core.pairwise.pairs import (  # noqa: F401 - pair_value and pair_rows are read from here
    _mean_std,
    _skip_on_error,
    measure_layer_pairs,
    pair_rows,
    pair_value,
)
from repgeom.probes.core.table import NOISE_COLUMNS

PER_HEAD_METRICS: tuple[str, ...] = tuple(
    o.pattern for m in catalogue.BUILTIN.values() if m.per_head for o in m.outputs
)
"""The metrics `measure` reports once per attention head (rows with head >= 0)."""


TWONN_CONVENTIONS = ("facco", "llm_microscope")
"""`ProbeSettings.twonn_convention`'s values."""


@dataclass
class ProbeSettings:
    """What to compute, and the estimator options (see `repgeom.metrics` for each).

    Checked on creation, so an out-of-range option fails before any model is run, with the
    option's name and range.
    """

    attention: bool = True
    intrinsic_dimension: bool = True
    distributions: bool = False
    discard_fraction: float = 0.1
    state_batch_size: int = 4096
    max_order: int = 64
    near_duplicate_threshold: float = 0.005
    cosine_baseline_quantile: float = 0.95
    distribution_samples: int = metrics.distributions.FIT_SAMPLES
    seed: int = 0
    noise_splits: int = 8
    """Noise batches per estimator batch for the intrinsic-dimension rows' standard error
    (``se``, ``se_df``: `repgeom.probes.core.id_noise`); 0 or 1: off."""
    per_token: bool = False
    """Keep each probed state's surprisal, local ID (the MLE on its 20 neighbours of the shared
    search), position and token (`repgeom.probes.core.prediction.tokens`:
    ``probes/tokens/step_<n>.parquet``
    and the Spearman table ``token_id_surprisal.csv``)."""
    max_copy_share: float = 0.5
    """Above this share of a layer's states that are copies or near-copies (exact duplicates
    plus the near-duplicate share's points, of all states), every intrinsic-dimension reading of
    the layer (TwoNN, its MLE, the authors' convention, GRIDE, the MLE, decimation, the plateau)
    is NaN, with the reason in the table's ``note`` column: the estimators read the jitter
    inside the clumps there (the char embedding at step 0 reads 192 under the authors' fit)."""
    null_permutations: int = 0
    """Shuffles of the permutation null of the pairwise entries
    (`repgeom.probes.core.pairwise.null`:
    rows ``<metric>_chance`` and ``<metric>_p`` beside linear CKA and mutual k-NN); 0: off.
    Each shuffle computes every pair's CKA again in full (mutual k-NN reuses its neighbour
    search): about ``null_permutations`` times the pairs' own cost (see `null`)."""
    twonn_convention: str = "facco"
    """``facco``: TwoNN as Facco et al. 2017, DADApy and scikit-dimension fit it (row ``twonn``);
    ``llm_microscope``: as the Shape of Learning authors' code does
    (`repgeom.metrics.intrinsic_dimension.twonn_authors`, row ``twonn_llm_microscope``), so a table
    never mixes the
    two under one name."""
    metrics: tuple[str, ...] = ("default",)
    """Catalogue names (`repgeom.probes.core.catalogue.resolve`): built-ins, ``default`` (the cheap
    set), ``all``, or dotted paths of the user's own ``f(X) -> float | dict``. The switches
    `attention`, `intrinsic_dimension` and `distributions` gate those entries (checkpoints
    written before the catalogue carry them)."""

    def __post_init__(self) -> None:
        for name in ("discard_fraction", "near_duplicate_threshold", "cosine_baseline_quantile"):
            setattr(self, name, check_fraction(getattr(self, name), f"probe setting {name}",
                                               include_low=False))
        self.max_copy_share = check_fraction(self.max_copy_share, "probe setting max_copy_share",
                                             include_high=True)
        for name, minimum in (("state_batch_size", 3), ("distribution_samples", 10),
                              ("seed", None), ("noise_splits", 0), ("null_permutations", 0)):
            check_int(getattr(self, name), f"probe setting {name}", minimum=minimum)
        if isinstance(self.metrics, str):
            raise ValueError(
                f"probe setting metrics must be a list of names, got the string {self.metrics!r}"
            )
        self.metrics = tuple(str(m) for m in self.metrics)
        catalogue.check_names(self.metrics)
        if self.twonn_convention not in TWONN_CONVENTIONS:
            raise ValueError(
                f"probe setting twonn_convention must be one of {', '.join(TWONN_CONVENTIONS)}, "
                f"got {self.twonn_convention!r}"
            )
        check_max_order(self.max_order, "probe setting max_order")


@dataclass
class ProbeOutput:
    """Rows of the tidy table (without `step`) and one warning per skipped metric and layer."""

    rows: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    layer_names: list[str] = field(default_factory=list)
    states: list[torch.Tensor] = field(default_factory=list, repr=False)
    """Each layer's states, (N, D) float32, kept when pairwise metrics are wanted (`measure`
    with ``keep_states``), for similarity across steps and runs."""
    settings: ProbeSettings | None = None
    tokens: Any = None
    """The step's per-token surprisals (`repgeom.probes.core.prediction.lm_loss.TokenLoss`), or
    None."""
    local_ids: list = field(default_factory=list, repr=False)
    """Per layer, each state's local ID (or None), where ``settings.per_token`` asks."""
    token_states: Any = None
    """`repgeom.probes.core.prediction.tokens.TokenStates` of the step, where
    ``settings.per_token`` asks."""
    texts: str = "real"
    """The probe set's texts (``real``, ``shuffled``: `repgeom.probes.core.sampling.ProbeSet`),
    set by the targets; the table's ``texts`` column (`repgeom.probes.report.sink.write_step`)."""
    forward_seconds: float = 0.0
    """Seconds in the model's forward passes (the rest of a probe is the metrics), set by the
    targets (`repgeom.probes.core.targets`)."""

    def add(
        self,
        layer: int,
        metric: str,
        value: float,
        std: float = math.nan,
        *,
        head: int = -1,
        layer_b: int | None = None,
        note: str = "",
        **noise: float,
    ) -> None:
        """One row; `noise`: its noise columns (`repgeom.probes.core.table.NOISE_COLUMNS`)."""
        row = {
            "layer": layer,
            "layer_name": self.layer_names[layer] if layer < len(self.layer_names) else "",
            "head": head,
            "metric": metric,
            "value": float(value),
            "std": float(std),
        }
        if layer_b is not None:  # a pairwise value: the second layer (table.PAIR_COLUMNS)
            row["layer_b"] = layer_b
        if note:  # why the value is NaN (table.NOTE); rows without one get "" in the table
            row["note"] = note
        unknown = set(noise) - set(NOISE_COLUMNS)
        if unknown:
            raise ValueError(f"noise columns: unknown {sorted(unknown)}; one of {NOISE_COLUMNS}")
        row.update(noise)
        self.rows.append(row)

    def extend(self, other: ProbeOutput) -> None:
        self.rows.extend(other.rows)
        self.warnings.extend(other.warnings)
        self.states.extend(other.states)


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


def measure(
    state_captures: Iterable[Capture],
    attention_captures: Iterable[Capture],
    settings: ProbeSettings,
    *,
    keep_states: bool = False,
) -> ProbeOutput:
    """Every selected catalogue metric for every layer (and head): states from one probe set,
    attention from another.

    Parameters
    ----------
    state_captures : iterable of Capture
        Micro-batches of the state probe set; each capture's ``valid`` marks the sampled
        positions. Only ``hidden`` and ``final_norm`` are read.
    attention_captures : iterable of Capture
        Micro-batches of whole windows for the attention and query/key metrics (empty when
        ``settings.attention`` is False and no Q/K is wanted).
    settings : ProbeSettings
        ``settings.metrics`` selects the catalogue entries (`repgeom.probes.core.catalogue`).
    keep_states : bool
        Keep each layer's states in ``ProbeOutput.states`` (for similarity across steps/runs).

    Returns
    -------
    ProbeOutput
        A metric that cannot be computed for a layer (too few points, NaN/Inf states,
        unreadable attention) is skipped with one warning naming the metric and layer; every
        other metric is still returned.
    """
    selection = catalogue.select(settings)
    out = measure_states(state_captures, settings, selection, keep_states=keep_states)
    out.extend(
        measure_attention(attention_captures, settings, selection, layer_names=out.layer_names)
    )
    out.settings = settings
    return out


def measure_states(
    captures: Iterable[Capture],
    settings: ProbeSettings,
    selection: catalogue.Selection | None = None,
    *,
    keep_states: bool = False,
) -> ProbeOutput:
    """The per-layer state metrics (mean and std over shuffled batches) of the valid positions,
    and the pairwise ones between every two layers."""
    selection = catalogue.select(settings) if selection is None else selection
    hidden: list[list[torch.Tensor]] = []
    final: list[torch.Tensor] = []
    for capture in captures:
        if not hidden:
            hidden = [[] for _ in capture.hidden]
        valid = capture.valid
        for layer, states in enumerate(capture.hidden):
            hidden[layer].append(_flatten(states, valid))
        if capture.final_norm is not None:
            final.append(_flatten(capture.final_norm, valid))
    if not hidden:
        raise ValueError("measure() got no captures: the probe set is empty")
    if final:
        hidden.append(final)
    out = ProbeOutput(layer_names=layer_names(len(hidden) - 1 - bool(final), bool(final)))
    states = [torch.cat(parts) for parts in hidden]
    split = metrics.batch_indices(states[0].shape[0], settings.state_batch_size, settings.seed)
    for layer, X in enumerate(states):
        _measure_states(out, layer, X, split, settings, selection.states)
        if settings.per_token:
            out.local_ids.append(id_entries.local_ids(X))
    if selection.pairs:
        measure_layer_pairs(out, states, split, selection.pairs, settings)
    if keep_states:
        out.states = states
    return out


def measure_attention(
    captures: Iterable[Capture],
    settings: ProbeSettings,
    selection: catalogue.Selection | None = None,
    *,
    layer_names: list[str],
) -> ProbeOutput:
    """Per-head attention entropy and query/key alignment (per head, and per layer with the heads
    concatenated) of every block, on whole windows."""
    selection = catalogue.select(settings) if selection is None else selection
    out = ProbeOutput(layer_names=layer_names)
    queries: list[list[torch.Tensor]] = []
    keys: list[list[torch.Tensor]] = []
    valids: list[torch.Tensor] = []
    attention: list[_AttentionSums] = []
    causal = True
    seen = False
    for capture in captures:
        causal = capture.causal
        if not seen:
            queries = [[] for _ in capture.queries]
            keys = [[] for _ in capture.keys]
            attention = [_AttentionSums() for _ in capture.attention]
            seen = True
        valid = capture.valid
        if valid is None:
            B, T = capture.hidden[0].shape[:2]
            valid = torch.ones(B, T, dtype=torch.bool)
        valids.append(valid.cpu())
        if selection.qk:
            for layer, (q, k) in enumerate(zip(capture.queries, capture.keys, strict=True)):
                queries[layer].append(q)
                keys[layer].append(k)
        if selection.attention is not None:
            for layer, probs in enumerate(capture.attention):
                with _skip_on_error(out, "attention_entropy", layer + 1):
                    result = selection.attention.fn(
                        probs, causal=causal, valid=valid.to(probs.device)
                    )
                    attention[layer].add(result)
    if not seen:
        return out
    if selection.attention is not None and not attention:
        out.warnings.append("attention probabilities were not captured; attention metrics skipped")
    for index, sums in enumerate(attention):
        if sums.rows:
            for name, values in sums.means().items():
                for head, value in enumerate(values):
                    out.add(index + 1, name, value, head=head)
    if not selection.qk:
        return out
    valid_all = torch.cat(valids)
    for index, (q_parts, k_parts) in enumerate(zip(queries, keys, strict=True)):
        Q, K = torch.cat(q_parts), torch.cat(k_parts)
        for entry in selection.qk:
            with _skip_on_error(out, entry.name, index + 1):
                _measure_qk(out, index + 1, entry, Q, K, causal, valid_all)
    return out


def _flatten(hidden: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """(B, T, C) states -> (N, C) float32 rows at the valid positions."""
    states = hidden if valid is None else hidden[valid.to(hidden.device)]
    return states.reshape(-1, hidden.size(-1)).float()


def _measure_states(
    out: ProbeOutput,
    layer: int,
    X: torch.Tensor,
    split: list[torch.Tensor],
    settings: ProbeSettings,
    entries: list[catalogue.Metric],
) -> None:
    batches = [X[index.to(X.device)] for index in split]
    with shared_spectrum():  # one centring and eigendecomposition per batch for every metric
        for entry in entries:
            with _skip_on_error(out, entry.name, layer):
                rows = per_batch(entry, batches) if entry.batched else entry.fn(X, settings)
                # a 4th item: the row's note; a 5th: its noise columns (`id_noise`)
                for name, value, std, *more in rows:
                    note, noise = (more[0] if more else ""), (more[1] if more[1:] else {})
                    out.add(layer, name, value, std, note=note, **noise)


def per_batch(entry: catalogue.Metric, batches: list[torch.Tensor]) -> list[tuple]:
    """``(metric, mean, std)`` over batches of ``entry.fn(batch)`` (a float or a dict of them;
    a dict's key ``""`` is the row of the entry's own name)."""
    values = [entry.fn(batch) for batch in batches]
    if all(isinstance(v, dict) for v in values):
        return [  # the key "": the entry's own name
            (f"{entry.name}_{key}" if key else entry.name,
             *_mean_std([float(v[key]) for v in values]))
            for key in values[0]
        ]
    try:
        return [(entry.name, *_mean_std([float(v) for v in values]))]
    except (TypeError, RuntimeError):
        raise ValueError(
            f"{entry.name} returned {type(values[0]).__name__}; a state metric returns a float "
            "or a dict of floats"
        ) from None


def _measure_qk(
    out: ProbeOutput,
    layer: int,
    entry: catalogue.Metric,
    Q: torch.Tensor,
    K: torch.Tensor,
    causal: bool,
    valid: torch.Tensor,
) -> None:
    if not entry.per_head:  # one value per layer (heads concatenated)
        out.add(layer, entry.name, entry.fn(Q, K, valid=valid.to(Q.device)))
        return
    result = entry.fn(Q, K, causal=causal, valid=valid.to(Q.device))
    for name in ("cosine", "dot", "score_mean", "score_std", "score_max_abs"):
        metric = f"qk_{name}" if name in ("cosine", "dot") else name
        for head, value in enumerate(np.asarray(getattr(result, name))):
            out.add(layer, metric, value, head=head)
