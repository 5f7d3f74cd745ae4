"""`save_figures`: the standard set of PNGs for every metric of one run's table.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from repgeom.probes.core import catalogue
from repgeom.probes.core.table import MODEL_METRICS
from repgeom.probes.report.aggregate import is_pairwise
from repgeom.probes.report.plots.loss import loss_beside_id
from repgeom.probes.report.plots.pairwise import pair_jobs
from repgeom.probes.report.plots.scales import SCALE_ROWS, has_scales, id_vs_scale, scale_heatmap
from repgeom.probes.report.plots.single_run import (
    heatmap,
    layer_profile,
    metric_vs_step,
    per_head_vs_step,
    per_layer_vs_step,
)
from repgeom.probes.report.plots.style import (
    DPI,
)


def save_figures(
    frame: pd.DataFrame,
    out_dir: str | os.PathLike,
    *,
    metrics: Iterable[str] | None = None,
    dpi: int = DPI,
) -> list[Path]:
    """Write the standard figures of every metric in `frame` as PNGs; return their paths.

    For each metric present (or each of `metrics` that is present):

    - ``profile_<metric>.png``: `layer_profile` (one line per ``revision`` when the table has
      several, else per step), for the metrics whose catalogue entry asks for it
      (`repgeom.probes.core.catalogue`: anisotropy, mean cosine, the intrinsic dimensions, the
      standard and the user's state metrics);
    - ``vs_step_<metric>.png``: `metric_vs_step`, where the entry asks (twonn, anisotropy);
    - ``heatmap_<metric>.png``: `heatmap`, for every metric;
    - ``loss_beside_id.png`` (`loss.loss_beside_id`): the mean intrinsic dimension and the
      bits per character of the probe's windows against the step, where the table has both;
    - ``per_layer_<metric>.png``: `per_layer_vs_step`, where asked (attention entropies), and
      for revisions of one model (``hf_revisions``) also for every ``vs_step`` metric: one
      line per layer against the revision's step;
    - ``per_head_<metric>.png``: `per_head_vs_step`, where asked (qk_cosine);
    - ``similarity_<metric>.png``: `layer_similarity`, a layer x layer map of each pairwise
      metric (CKA, mutual k-NN) at the last step, and ``vs_final_<metric>.png``:
      `similarity_to_final`, each layer's similarity to itself at the final step;
    - ``id_vs_scale.png`` (`scales.id_vs_scale`: ID against scale per layer at the first, peak
      and last steps) and, with several steps, ``id_scale_heatmap.png`` (`scales.scale_heatmap`)
      wherever the table holds the scale profile (``id_scales``), whatever `metrics` lists
      (unless it is empty); its rows (``twonn_dec<j>``, ``*_scale``, ``id_plateau_lo/hi``) get
      no figure of their own.

    Figures over steps need at least two probe steps; with a single step every metric gets its
    profile instead. Absent metrics are skipped, and a figure that cannot be drawn (a metric with
    no finite value) is skipped with a warning naming it. Tables with several models or runs:
    call once per run.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    present = list(dict.fromkeys(frame["metric"]))
    wanted = present if metrics is None else [m for m in metrics if m in set(present)]
    several_steps = frame["step"].nunique() > 1
    by = (
        "revision"
        if "revision" in frame.columns and frame["revision"].nunique() > 1
        else "step"
    )
    # Split once: every figure then filters a few hundred rows instead of the whole table.
    by_metric = {m: rows for m, rows in frame.groupby("metric", sort=False) if m in wanted}
    jobs: list[tuple[str, Callable[[], Figure]]] = []
    if has_scales(frame) and (metrics is None or list(metrics)):
        jobs.append(("id_vs_scale", partial(id_vs_scale, frame)))
        if several_steps:
            jobs.append(("id_scale_heatmap", partial(scale_heatmap, frame)))
    for metric in wanted:
        if SCALE_ROWS.fullmatch(metric):
            continue
        rows = by_metric[metric]
        if is_pairwise(rows):
            jobs += pair_jobs(rows, metric)
            continue
        if metric in MODEL_METRICS:  # the model's own rows (the LM loss): no layer profile
            if several_steps and metric == "bpc":  # beside the ID, on one step axis
                jobs.append(("loss_beside_id", partial(loss_beside_id, frame)))
            continue
        kinds = catalogue.figures(metric)
        # With one probe step (one checkpoint) the profile is the only figure: draw it for all.
        if "profile" in kinds or not several_steps:
            jobs.append((f"profile_{metric}", partial(layer_profile, rows, metric, by=by)))
        if several_steps and "vs_step" in kinds:
            jobs.append((f"vs_step_{metric}", partial(metric_vs_step, rows, metric)))
        if several_steps:
            jobs.append((f"heatmap_{metric}", partial(heatmap, rows, metric)))
        # Revisions of one model: the layer mean hides the layers, so they get a line each too.
        if several_steps and ("per_layer" in kinds or (by == "revision" and "vs_step" in kinds)):
            jobs.append((f"per_layer_{metric}", partial(per_layer_vs_step, rows, metric)))
        if several_steps and "per_head" in kinds:
            jobs.append((f"per_head_{metric}", partial(per_head_vs_step, rows, metric)))
    paths = []
    for name, make in jobs:
        try:
            fig = make()
        except ValueError as err:  # e.g. a metric with no finite value: skip it, keep the rest
            warnings.warn(f"save_figures: skipped {name}.png: {err}", stacklevel=2)
            continue
        path = out_dir / f"{name}.png"
        # No fig.clear(): a pyplot-free Figure is collected once unreferenced (clearing it
        # re-initialised every axes: 10% of the set's time).
        fig.savefig(path, dpi=dpi, facecolor="white")
        paths.append(path)
    return paths
