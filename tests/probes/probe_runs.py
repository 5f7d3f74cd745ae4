"""What the end-to-end probe tests share: small settings and the check that a table holds every
metric on every layer (core/test_targets.py, run/test_runner.py, report/test_survey.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from repgeom.probes.core.measure import PER_HEAD_METRICS

# The training probe's metrics on a tiny model (max_order=16) plus the distribution fits that
# probe.py adds by default.
STATE_METRICS = {
    "anisotropy",
    "mean_cosine",
    "cosine_baseline",
    "drift_norm",
    "drift_ratio",
    "twonn",
    "twonn_mle",
    "duplicates",
    "near_duplicate_share",
    "gride_k2",
    "gride_k8",
    "kurtosis",
    "n_modes",
    "loglik_normal",
}
HEAD_METRICS = set(PER_HEAD_METRICS)
LAYER_QK_METRICS = {"qk_cosine_concat"}
"""Read from queries and keys like the head metrics, but one row per block (head -1)."""
# Small and fast: a few hundred states, GRIDE up to order 8, few distribution samples.
SMALL = [
    "n_states=192",
    "settings.max_order=8",
    "settings.state_batch_size=192",
    "settings.distribution_samples=500",
    "device=cpu",
    "plot_metrics=[anisotropy,twonn]",  # each figure costs ~0.4 s on a shared CPU
]


def assert_every_metric_every_layer(
    frame: pd.DataFrame, n_layers: int, n_heads: int, *, final_norm: bool = True
) -> None:
    """Every state metric on the embedding, every block and (pre-LN models) the final norm."""
    names = ["embedding", *(f"block_{i}" for i in range(1, n_layers + 1))]
    names += ["final_norm"] if final_norm else []
    for metric in STATE_METRICS:
        rows = frame.loc[frame["metric"] == metric].sort_values("layer")
        assert rows["layer"].tolist() == list(range(len(names))), metric
        assert rows["layer_name"].tolist() == names, metric
    for metric in HEAD_METRICS:
        rows = frame[frame["metric"] == metric]
        assert len(rows) == n_layers * n_heads, metric
        assert set(rows["layer"]) == set(range(1, n_layers + 1)), metric
    for metric in LAYER_QK_METRICS:
        rows = frame.loc[frame["metric"] == metric].sort_values("layer")
        assert rows["layer"].tolist() == list(range(1, n_layers + 1)), metric
        assert (rows["head"] == -1).all(), metric
    finite = frame[frame["metric"].isin(STATE_METRICS | HEAD_METRICS | LAYER_QK_METRICS)]
    # A layer whose states are mostly copies (a tiny random model's embedding) has its
    # intrinsic dimensions NaN, with the reason in `note` (ProbeSettings.max_copy_share).
    guarded = finite["note"].str.startswith("copies: ") if "note" in finite else False
    assert np.isfinite(finite.loc[~guarded, "value"]).all()
    assert finite.loc[guarded, "metric"].isin(["twonn", "twonn_mle", "gride_k2", "gride_k8"]).all()
