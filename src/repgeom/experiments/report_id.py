"""The report's intrinsic-dimension checks (experiment 2): "rises, then falls" at each scale, the
near-duplicate check, and the sentence on which scale the papers read.

"Rises, then falls" is a compound claim about a peak chosen on the data: per seed, the layer
mean's peak − start and peak − end, each paired over the blocks read at both steps in every seed
(`report_findings.paired`), tested by `statistics.peak_test` (intersection-union at each
interior step, the peak's choice among them corrected by Bonferroni).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from repgeom.experiments import seeds
from repgeom.experiments import statistics as st
from repgeom.experiments.report_findings import (
    Finding,
    cube,
    effect_text,
    nan_text,
    paired,
    present,
)
from repgeom.experiments.report_runs import MASKINGS
from repgeom.experiments.seeds import t_interval
from repgeom.probes.core.table import FINAL_NORM

NEAR_DUPLICATE_FLAG = 0.01
"""A layer is flagged when more than this share of its states have a near-duplicate. At the
probe's calibrated threshold (0.005 of the median neighbour distance), clean manifolds of
dimension 2-10 read under 1%, so a share above it is a property of the states, not of the
estimator."""


SCALES = {
    "twonn": "the smallest scale",
    "id_plateau": "the plateau",
    "gride_k16": "GRIDE k16",
}
"""The scales at which every intrinsic-dimension claim is read (issue 28), in the report's order:
TwoNN on the probe's batches reads the distance to the first two neighbours among a batch's
states; the plateau (`repgeom.metrics.id_plateau`, rows of the ``id_scales`` entry) the widest
range of scales over which TwoNN by decimation and GRIDE k = 2..64 agree within the noise; GRIDE
k16 the 8th and 16th neighbours."""


def _near_duplicates(stacked: pd.DataFrame, step: int) -> pd.DataFrame:
    """Blocks (all seeds) whose near-duplicate share at `step` is above `NEAR_DUPLICATE_FLAG`."""
    rows = stacked.loc[(stacked["step"] == step) & (stacked["layer_name"] != FINAL_NORM)
                       & (stacked["layer"] >= 1)]
    return rows.loc[rows["value"] > NEAR_DUPLICATE_FLAG]


def _scale_text(metric: str, batch) -> str:
    at = f"batches of {batch} states" if batch else "the probe's batches"
    return {
        "twonn": f"TwoNN on {at}, the distance to the first two neighbours: the papers' reading",
        "id_plateau": "the widest range of scales over which TwoNN by decimation and GRIDE "
                      "k = 2..64 agree within their batch noise",
        "gride_k16": "the 8th and 16th neighbours",
    }[metric]


def _layer_mean(values: np.ndarray, step: int) -> np.ndarray:
    """Per seed, the mean over the blocks read at `step` in every seed (NaN when none)."""
    read = present(values, step)
    return values[:, step, read].mean(axis=1) if read.any() else np.full(len(values), np.nan)


def _batch_noise(stds: np.ndarray, values: np.ndarray, a: int, b: int) -> float:
    """Information only: root mean square over seeds of the batch std of a paired contrast
    (each point's std the root mean square of its blocks' stds, the two in quadrature)."""
    both = present(values, a) & present(values, b)
    if not both.any() or np.isnan(stds[:, [a, b]][:, :, both]).all():
        return 0.0
    per_point = np.sqrt(np.nanmean(stds[:, [a, b]][:, :, both] ** 2, axis=2))  # (seed, 2)
    return float(np.sqrt(np.nanmean((per_point**2).sum(axis=1))))


def _rise_then_fall_finding(tables, names, m, metric, shares, batch) -> Finding | None:
    """"Rises, then falls" for masking `m` read at the scale of `metric` (`SCALES`)."""
    claim = (f"at {SCALES[metric]} ({_scale_text(metric, batch)}), the mean intrinsic "
             f"dimension ({metric}) rises early in training, then falls ({m})")
    check = ("per seed, the layer mean (blocks 1..L) at a peak step minus that at the first "
             "probe, and minus that at the last, each paired over the blocks read at both steps "
             "in every seed; both above 0: intersection-union test (Berger 1982) of one-sided t "
             "tests over seeds at the interior step most above both ends, its choice corrected by "
             "Bonferroni over the candidate steps; an end not read in every "
             "seed is not measured, never moved")
    n = len(tables[m])
    if not all(metric in set(t["metric"]) for t in tables[m]):
        if metric != "id_plateau":
            return None
        return Finding(claim, check, "not in these tables: the runs were probed before the scale "
                       "profile existed (catalogue entry `id_scales`, issue 28); rerun `python "
                       "train.py -m experiment=shape_of_learning`, whose preset computes it, and "
                       "`scripts/make_report.sh`", measured=False, n_seeds=n)
    stacked = seeds.per_seed(tables[m], metric)
    steps, _, values = cube(stacked)
    _, _, stds = cube(stacked, "std")
    nans = nan_text(values)
    last = len(steps) - 1
    for index, end in ((0, "first"), (last, "last")):
        if not present(values, index).any():
            lacking = int((~np.isfinite(values[:, index, :]).any(axis=1)).sum())
            return Finding(claim, check, f"no block is read in every seed at the {end} probe "
                           f"(step {steps[index]}; {lacking} of {n} seeds read no block there), so "
                           f"the {'start' if index == 0 else 'end'} is not measured and is not "
                           f"moved to a later step; {nans}", measured=False, n_seeds=n)
    candidates, rise, fall = [], [], []
    for j in range(1, last):
        up, k_up = paired(values, 0, j)
        down, k_down = paired(values, last, j)
        if k_up and k_down:
            candidates.append(j)
            rise.append(up)
            fall.append(down)
    if not candidates:
        return Finding(claim, check, f"no interior step shares a block read in every seed with "
                       f"both ends; {nans}", measured=False, n_seeds=n)
    top = st.peak_test(np.column_stack(rise), np.column_stack(fall))
    peak = candidates[top.peak]
    mean = {i: t_interval(_layer_mean(values, i)) for i in (0, peak, last)}
    note = ""
    if metric == "twonn" and m in shares:
        flagged = _near_duplicates(shares[m], steps[0])
        if not flagged.empty:
            worst = flagged.loc[flagged["value"].idxmax()]
            note = (
                f". TwoNN at step {steps[0]} reads layers the report flags as "
                f"near-duplicates: {len(flagged)} (block, seed) pairs above "
                f"{NEAR_DUPLICATE_FLAG:.0%}, up to {worst['value']:.3f} "
                f"(block {int(worst['layer'])}, {names[m][int(worst['seed'])]}), so its "
                "start is not a dimension"
            )
    noise = {"start": _batch_noise(stds, values, 0, peak), "end": _batch_noise(stds, values,
                                                                                last, peak)}
    info = {k: f"batch noise {v:.3f}, information only" if v > 0 else "" for k, v in noise.items()}
    return Finding(
        claim, check,
        f"start {mean[0]} (step {steps[0]}), peak {mean[peak]} at step {steps[peak]}, end "
        f"{mean[last]} (step {steps[last]}), layer means over the blocks every seed reads; "
        "uncorrected intervals at the chosen step: "
        f"{effect_text('peak − start', top.start, top.p_start, info['start'])}, "
        f"{effect_text('peak − end', top.end, top.p_end, info['end'])}; {top.detail}; "
        f"{len(candidates)} candidate steps; {nans}{note}",
        top.p, int(((top.start > 0) & (top.end > 0)).sum()), n,
    )


def _near_duplicate_finding(shares: dict[str, pd.DataFrame], names, threshold) -> Finding:
    per_run, flagged_runs, nans = [], [], []
    for m, stacked in shares.items():
        steps, _, values = cube(stacked)
        nans.append(f"{m} {nan_text(values, [len(steps) - 1])}")
        blocks = stacked.loc[(stacked["layer"] >= 1) & (stacked["layer_name"] != FINAL_NORM)]
        last = int(stacked["step"].max())
        for _, group in blocks.loc[blocks["step"] == last].groupby(seeds.SEED):
            per_run.append(float(group["value"].max()))
        for seed, group in blocks.groupby(seeds.SEED):
            worst = group.loc[group["value"].idxmax()]
            if worst["value"] > NEAR_DUPLICATE_FLAG:
                flagged_runs.append(f"{names[m][int(seed)]}: {worst['value']:.3f} at step "
                                    f"{int(worst['step'])}, block {int(worst['layer'])}")
    below = NEAR_DUPLICATE_FLAG - np.asarray(per_run)
    at = f"{threshold}" if threshold is not None else "the probe's default"
    return Finding(
        "TwoNN reads the smallest scale, so a layer full of near-duplicates makes it "
        "meaningless (issue 3); the final curves should be free of them",
        f"per run, the largest near-duplicate share over blocks at the last probe (at the "
        f"probe's calibrated threshold, {at} of the median neighbour distance) is below "
        f"{NEAR_DUPLICATE_FLAG:.0%}: one-sided exact sign test over all runs (the shares sit on "
        "their bound, 0, where a t test's normal model fails)",
        f"largest final share per run {t_interval(per_run)}; runs with a flagged block at any "
        "step: " + ("; ".join(flagged_runs) if flagged_runs else "none")
        + " (TwoNN is flagged there; GRIDE at order 16 reads past it); " + "; ".join(nans),
        st.sign_test(below), int((below > 0).sum()), len(per_run), "runs",
    )


def id_findings(
    tables: dict[str, list[pd.DataFrame]], names: dict[str, list[str]], threshold: float | None,
    batch: int | None = None,
) -> list[Finding]:
    """The intrinsic dimension rises, then falls, read at each scale (`SCALES`) per masking; and
    where TwoNN reads near-duplicates."""
    out = []
    shares = {
        m: seeds.per_seed(tables[m], "near_duplicate_share")
        for m in MASKINGS if all("near_duplicate_share" in set(t["metric"]) for t in tables[m])
    }
    for m in MASKINGS:
        for metric in SCALES:
            finding = _rise_then_fall_finding(tables, names, m, metric, shares, batch)
            if finding is not None:
                out.append(finding)
    if shares:
        out.append(_near_duplicate_finding(shares, names, threshold))
    return out


def scale_lines(tables: dict[str, list[pd.DataFrame]], batch: int | None = None) -> list[str]:
    """Two sentences on which scale the papers' TwoNN reads and what that means for comparing,
    with the decoder's block-mean readings at the first and last probe (mean over seeds)."""
    at = f"batches of {batch} states" if batch else "batches of at least 4096 states"
    readings, spans = [], []
    for metric in SCALES:
        if not all(metric in set(t["metric"]) for t in tables["causal"]):
            continue
        stacked = seeds.per_seed(tables["causal"], metric)
        values, _ = seeds.grid(stacked.loc[stacked["value"].notna()], layer_mean=True)
        values = values.dropna()  # the steps every seed reads
        if len(values):
            first, last = int(values.index[0]), int(values.index[-1])
            readings.append((SCALES[metric].removeprefix("the "), first, last,
                             values.loc[first].mean(), values.loc[last].mean()))
            spans.append((first, last))
    common = spans[0] if spans and len(set(spans)) == 1 else None

    def reading(name: str, first: int, last: int, start: float, end: float) -> str:
        steps = "" if common else f" (steps {first} → {last})"
        return f"{name} {start:.1f} → {end:.1f}{steps}"

    ours = ""
    if readings:
        span = f" from step {common[0]} to step {common[1]}" if common else ""
        ours = (f" (here, the decoder's block mean{span}, over the steps every seed reads: "
                + ", ".join(reading(*r) for r in readings) + ")")
    return [
        f"**Which scale the papers read.** Razzhigaev et al. (2023, §2.2) fit TwoNN (Facco et al. "
        f"2017) on shuffled {at}, so their intrinsic dimension is our smallest-scale reading "
        "(`twonn`): the geometry at the distance of each state's first two neighbours in a "
        "batch, not the plateau where Facco et al. read a dimension. A number of ours compared "
        "with theirs must therefore be the smallest-scale one, and a claim that holds there but "
        "not at the plateau or at GRIDE k16 is a statement about the nearest-neighbour scale, "
        f"not about the dimension of the states' manifold{ours}.",
    ]
