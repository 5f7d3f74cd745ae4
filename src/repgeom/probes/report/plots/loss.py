"""The loss beside the geometry: the intrinsic dimension and the LM loss of the probe's
windows against the training step, on one step axis (Cheng et al., ICLR 2025, read the ID peak
against the model's performance; Li et al., NeurIPS 2025, RankMe and alpha-ReQ phases)."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from repgeom.probes.core.table import MODEL_METRICS, layer_rows
from repgeom.probes.report.aggregate import layer_means
from repgeom.probes.report.plots.style import DPI, auto_xscale, metric_label

ID_CHOICES = ("twonn", "twonn_llm_microscope", "gride_k16", "mle_dimension")
"""The intrinsic dimension drawn beside the loss: the first of these the table holds."""


def loss_beside_id(frame: pd.DataFrame, *, loss: str = "bpc") -> Figure:
    """Two panels on one step axis: the mean over blocks 1..L of the table's intrinsic
    dimension (`ID_CHOICES`), and `loss` (``bpc`` or ``lm_loss``: the model's rows,
    `MODEL_METRICS`).

    Raises
    ------
    ValueError
        When the table holds no `loss` rows or no intrinsic dimension, or one step only.
    """
    if loss not in MODEL_METRICS:
        raise ValueError(f"loss_beside_id: loss must be one of {', '.join(MODEL_METRICS)}, "
                         f"got {loss!r}")
    model_rows = frame.loc[frame["metric"] == loss]
    model_rows = model_rows.dropna(subset=["value"]).sort_values("step")
    present = set(frame["metric"])
    chosen = next((m for m in ID_CHOICES if m in present), None)
    if model_rows.empty or chosen is None:
        raise ValueError(f"loss_beside_id: the table needs {loss!r} rows and one of "
                         f"{', '.join(ID_CHOICES)}")
    means = layer_means(layer_rows(frame.loc[frame["metric"] == chosen])).dropna(subset=["value"])
    if model_rows["step"].nunique() < 2 or means.empty:
        raise ValueError("loss_beside_id: needs at least two probe steps")
    fig = Figure(figsize=(7.5, 6.0), dpi=DPI)
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.plot(means["step"], means["value"], marker="o", color="tab:blue")
    top.set_ylabel(f"{metric_label(chosen)}\n(mean over blocks)")
    bottom.plot(model_rows["step"], model_rows["value"], marker="o", color="tab:red")
    bottom.set_ylabel(metric_label(loss))
    bottom.set_xlabel("step")
    auto_xscale(bottom, model_rows["step"].to_numpy(), "auto")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.set_title("Intrinsic dimension beside the loss on the same windows")
    fig.tight_layout()
    return fig
