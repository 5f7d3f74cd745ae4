"""Figures of the probe table, for W&B and for the run folder.

Every function takes the tidy table of `repgeom.probes.core.table` and returns a
`matplotlib.figure.Figure`; the caller logs it (``wandb.log({key: wandb.Image(fig)})``) or saves
it. Figures are built with ``Figure()``, not ``pyplot``: no GUI backend is touched, no
global registry keeps them alive, and they render with Agg when saved.

=========================  =================================================================
function                   what it shows
=========================  =================================================================
`layer_profile`            value against layer, one line per probe step (colour bar) or per
                           ``revision``/``model`` (legend): the bell shape of anisotropy
`metric_vs_step`           layer mean against step, its maximum marked: the expansion then
                           compression of intrinsic dimension
`heatmap`                  layer x step
`per_layer_vs_step`        one line per layer against step (attention entropy)
`per_head_vs_step`         one panel per layer, one line per head (Q/K cosine)
`survey_profile`           one line per model against relative depth (0 = embedding, 1 = last
                           block), decoders solid, encoders dashed: a survey across models
`compare_texts`            per-layer pooled cosine of two texts, and the token x token cosines
`id_vs_scale`              ID against scale per layer at the first, peak and last probe
                           (TwoNN by decimation, GRIDE k, the plateau)
`scale_heatmap`            block-mean ID over scale and step
`save_figures`             the standard set of PNGs for every metric in a table
=========================  =================================================================

Figures across runs (side by side, bands over seeds) are in `repgeom.experiments.figures`.
One module per job: `style` (shared pieces), `single_run`, `across_models`, `compare_texts`,
`pairwise`, `scales`, `save`.

Per-head metrics are averaged over heads wherever a figure has no head axis. Layer means leave
out layer 0, the embedding (see `repgeom.probes.core.table`).
"""

from repgeom.probes.report.plots.across_models import FINAL_NORM_GAP, KIND_STYLE, survey_profile
from repgeom.probes.report.plots.compare_texts import compare_texts
from repgeom.probes.report.plots.pairwise import layer_similarity, similarity_to_final
from repgeom.probes.report.plots.save import save_figures
from repgeom.probes.report.plots.scales import id_vs_scale, scale_heatmap
from repgeom.probes.report.plots.single_run import (
    heatmap,
    layer_profile,
    metric_vs_step,
    per_head_vs_step,
    per_layer_vs_step,
)
from repgeom.probes.report.plots.style import (
    DPI,
    group_colours,
    is_id_metric,
    metric_label,
    new_figure,
    step_colorbar,
    step_colours,
)

__all__ = [
    "DPI",
    "FINAL_NORM_GAP",
    "KIND_STYLE",
    "compare_texts",
    "group_colours",
    "heatmap",
    "id_vs_scale",
    "is_id_metric",
    "layer_profile",
    "layer_similarity",
    "metric_label",
    "metric_vs_step",
    "new_figure",
    "per_head_vs_step",
    "per_layer_vs_step",
    "save_figures",
    "scale_heatmap",
    "similarity_to_final",
    "step_colorbar",
    "step_colours",
    "survey_profile",
]
