"""The report's claim checks (experiments 1-3): each paper claim tested on the sweep's tables,
per seed and on the mean over seeds (`repgeom.experiments.seeds`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from repgeom.experiments import seeds
from repgeom.experiments.report_runs import MASKINGS
from repgeom.experiments.seeds import Effect, Interval, t_interval
from repgeom.probes.core.table import FINAL_NORM

NEAR_DUPLICATE_FLAG = 0.01
"""A layer is flagged when more than this share of its states have a near-duplicate. At the
probe's calibrated threshold (0.005 of the median neighbour distance), clean manifolds of
dimension 2-10 read under 1%, so a share above it is a property of the states, not of the
estimator."""


@dataclass
class Finding:
    """One claim, the check that tests it, what our runs gave, and the verdict.

    ``seeds_holding`` of ``n_seeds`` runs (or pairs of runs, `unit`) show the effect on their own;
    `agrees` is decided on the mean over seeds with its interval and noise.
    """

    claim: str
    check: str
    observed: str
    agrees: bool
    seeds_holding: int | None = None
    n_seeds: int | None = None
    unit: str = "seeds"
    measured: bool = True
    """False: the tables do not hold what the check needs (the verdict says "not measured")."""

    @property
    def count(self) -> str:
        """``holds in 3 of 3 seeds``, or '' when the finding is not per seed."""
        if self.n_seeds is None:
            return ""
        return f"holds in {self.seeds_holding} of {self.n_seeds} {self.unit}"

    def markdown(self) -> str:
        verdict = ("**not measured**" if not self.measured
                   else "**agrees**" if self.agrees else "**does not agree**")
        count = f"; {self.count}" if self.count else ""
        return (
            f"- *Claim:* {self.claim}\n  *Check:* {self.check}\n"
            f"  *Ours:* {self.observed}{count} → {verdict}"
        )


def fmt_intervals(index: Sequence, intervals: Sequence[Interval], name: str = "block") -> str:
    return "; ".join(f"{name} {int(i)} {ci}" for i, ci in zip(index, intervals, strict=True))


def _count(effects: Sequence[Effect]) -> int:
    """Seeds in which every one of `effects` holds."""
    return int(np.all([e.per_seed_holds for e in effects], axis=0).sum())


def _change_per_block(stacked: pd.DataFrame, first: int, last: int, *, sign: int) -> list[Effect]:
    """Per block, ``sign * (value at last - value at first)`` over seeds, with its batch noise."""
    v_end, s_end = seeds.grid(stacked, step=last)
    v_0, s_0 = seeds.grid(stacked, step=first)
    return [
        seeds.effect(f"block {int(b)}", sign * (v_end.loc[b] - v_0.loc[b]).to_numpy(),
                     seeds.quadrature(s_end.loc[b].to_numpy(), s_0.loc[b].to_numpy()))
        for b in v_end.index
    ]


def _bell_finding(
    stacked: pd.DataFrame, values: pd.DataFrame, stds: pd.DataFrame, last: int
) -> Finding:
    """Bell-shaped decoder profile: an interior peak beyond the noise (blocks only)."""
    bell = seeds.rise_then_fall(values, stds)
    top = int(values.index[bell.peak])
    norm = stacked.loc[(stacked["layer_name"] == FINAL_NORM) & (stacked["step"] == last)]
    last_block = t_interval(values.iloc[-1].to_numpy())
    norm_text = (
        f"; last block (block {int(values.index[-1])}) {last_block}, final-norm output "
        f"{t_interval(norm['value'].to_numpy())} (not a block: left out of the check)"
        if not norm.empty else f"; last block (block {int(values.index[-1])}) {last_block}"
    )
    return Finding(
        "the decoder's anisotropy profile over layers is bell-shaped "
        "(highest in the middle layers)",
        "the mean (over seeds) final causal profile over blocks 1..L peaks at neither the first "
        "nor the last block, and the peak exceeds both by more than the noise (the larger of "
        "the batch std and the 95% interval's half-width); per seed, the same on its own profile",
        f"final causal profile (step {last}, mean [95% interval]) "
        f"{fmt_intervals(values.index, bell.mean)}; peak at block {top}; "
        f"{bell.above_start.format().replace('start', 'first block')}, "
        f"{bell.above_end.format().replace('end', 'last block')}{norm_text}",
        bell.agrees, bell.seeds_holding, bell.n_seeds,
    )


def profile_findings(tables: dict[str, list[pd.DataFrame]], n: dict[str, int]) -> list[Finding]:
    """Bell-shaped decoder, flatter encoder, anisotropy growing (Razzhigaev et al. 2023)."""
    stacked = {m: seeds.per_seed(tables[m], "anisotropy") for m in MASKINGS}
    last = {m: int(s["step"].max()) for m, s in stacked.items()}
    first = {m: int(s["step"].min()) for m, s in stacked.items()}
    final = {m: seeds.grid(stacked[m], step=last[m]) for m in MASKINGS}
    out = []

    values, stds = final["causal"]
    if len(values) < 3:
        out.append(Finding(
            "the decoder's anisotropy profile over layers is bell-shaped "
            "(highest in the middle layers)",
            "a peak strictly inside the profile of blocks 1..L",
            f"the model has {len(values)} blocks: no interior block, the shape cannot be tested",
            False, 0, len(values.columns),
        ))
    else:
        out.append(_bell_finding(stacked["causal"], values, stds, last["causal"]))

    spread, noise = {}, {}
    for m in MASKINGS:
        v, s = final[m]
        hi, lo = v.to_numpy().argmax(axis=0), v.to_numpy().argmin(axis=0)
        cols = np.arange(v.shape[1])
        spread[m] = v.to_numpy()[hi, cols] - v.to_numpy()[lo, cols]
        noise[m] = seeds.quadrature(s.to_numpy()[hi, cols], s.to_numpy()[lo, cols])
    flatter = seeds.difference_effect(
        "spread causal − spread bidirectional", spread["causal"], noise["causal"],
        spread["bidirectional"], noise["bidirectional"],
    )
    out.append(Finding(
        "the encoder's profile is flatter than the decoder's",
        "max − min over blocks of the final profile, per seed; the mean causal spread exceeds "
        "the mean bidirectional spread by more than the noise (Welch 95% interval over the two "
        "groups of seeds); per seed, seed k of each masking compared",
        f"spread causal {t_interval(spread['causal'])}, bidirectional "
        f"{t_interval(spread['bidirectional'])}; {flatter.format()}",
        flatter.holds, flatter.seeds_holding, min(n.values()), "seed pairs",
    ))

    for m in MASKINGS:
        grew = _change_per_block(stacked[m], first[m], last[m], sign=1)
        held = sum(e.holds for e in grew)
        out.append(Finding(
            f"anisotropy grows during training ({m})",
            f"every block's anisotropy is higher at the last probe (step {last[m]}) than at "
            f"step {first[m]}, by more than the noise",
            f"{held} of {len(grew)} blocks grew; increase per block "
            + "; ".join(f"{e.name} {e.interval}" for e in grew),
            held == len(grew), _count(grew), n[m],
        ))
    return out


def _near_duplicates(stacked: pd.DataFrame, step: int) -> pd.DataFrame:
    """Blocks (all seeds) whose near-duplicate share at `step` is above `NEAR_DUPLICATE_FLAG`."""
    rows = stacked.loc[(stacked["step"] == step) & (stacked["layer_name"] != FINAL_NORM)
                       & (stacked["layer"] >= 1)]
    return rows.loc[rows["value"] > NEAR_DUPLICATE_FLAG]


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


def _scale_text(metric: str, batch) -> str:
    at = f"batches of {batch} states" if batch else "the probe's batches"
    return {
        "twonn": f"TwoNN on {at}, the distance to the first two neighbours: the papers' reading",
        "id_plateau": "the widest range of scales over which TwoNN by decimation and GRIDE "
                      "k = 2..64 agree within their batch noise",
        "gride_k16": "the 8th and 16th neighbours",
    }[metric]


def _rise_then_fall_finding(tables, names, m, metric, shares, batch) -> Finding | None:
    """"Rises, then falls" for masking `m` read at the scale of `metric` (`SCALES`)."""
    claim = (f"at {SCALES[metric]} ({_scale_text(metric, batch)}), the mean intrinsic "
             f"dimension ({metric}) rises early in training, then falls ({m})")
    check = ("the mean over seeds of the layer mean (blocks 1..L) peaks strictly inside the "
             "run, and peak − start and peak − end both exceed the noise: their 95% "
             "intervals over seeds exclude 0 and their means beat the batch std (root mean "
             "square of the per-layer stds, combined in quadrature over the two points)")
    if not all(metric in set(t["metric"]) for t in tables[m]):
        if metric != "id_plateau":
            return None
        return Finding(claim, check, "not in these tables: the runs were probed before the scale "
                       "profile existed (catalogue entry `id_scales`, issue 28); rerun `python "
                       "train.py -m experiment=shape_of_learning`, whose preset computes it, and "
                       "`scripts/make_report.sh`", False, measured=False)
    stacked = seeds.per_seed(tables[m], metric)
    gaps = ""
    if stacked["value"].isna().any():  # no plateau, or a guarded layer: say how often
        blocks = stacked.loc[(stacked["layer"] >= 1) & (stacked["layer_name"] != FINAL_NORM)]
        missing = blocks.loc[blocks["value"].isna()]
        gaps = (f"; {len(missing)} of {len(blocks)} (block, step, seed) readings are NaN (no "
                "plateau, or copies above the guard: the table's note says which) and the layer "
                "mean is over the other blocks")
        stacked = stacked.loc[stacked["value"].notna()]
    values, stds = seeds.grid(stacked, layer_mean=True)
    values, stds = values.dropna(), stds.reindex(values.dropna().index)
    if len(values) < 3:
        return Finding(claim, check, f"{len(values)} steps with a finite layer mean in every seed"
                       f"{gaps}: too few for a rise and a fall", False, measured=False)
    rf = seeds.rise_then_fall(values, stds)
    steps = [int(s) for s in values.index]
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
    return Finding(
        claim, check,
        f"start {rf.mean[0]} (step {steps[0]}), peak {rf.mean[rf.peak]} at step "
        f"{steps[rf.peak]}, end {rf.mean[-1]} (step {steps[-1]}); "
        f"{rf.above_start.format()}, {rf.above_end.format()}{gaps}{note}",
        rf.agrees, rf.seeds_holding, rf.n_seeds,
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
        per_run, flagged_runs = [], []
        for m, stacked in shares.items():
            last = int(stacked["step"].max())
            at_last = stacked.loc[(stacked["step"] == last) & (stacked["layer"] >= 1)
                                  & (stacked["layer_name"] != FINAL_NORM)]
            for _, group in at_last.groupby(seeds.SEED):
                per_run.append(float(group["value"].max()))
            for seed, group in stacked.loc[(stacked["layer"] >= 1)
                                           & (stacked["layer_name"] != FINAL_NORM)].groupby(
                                               seeds.SEED):
                worst = group.loc[group["value"].idxmax()]
                if worst["value"] > NEAR_DUPLICATE_FLAG:
                    flagged_runs.append(
                        f"{names[m][int(seed)]}: {worst['value']:.3f} at step "
                        f"{int(worst['step'])}, block {int(worst['layer'])}"
                    )
        largest = t_interval(per_run)
        upper = largest.high if np.isfinite(largest.high) else largest.mean
        held = sum(v <= NEAR_DUPLICATE_FLAG for v in per_run)
        at = f"{threshold}" if threshold is not None else "the probe's default"
        out.append(Finding(
            "TwoNN reads the smallest scale, so a layer full of near-duplicates makes it "
            "meaningless (issue 3); the final curves should be free of them",
            f"per run, the largest near-duplicate share over blocks at the last probe (at the "
            f"probe's calibrated threshold, {at} of the median neighbour distance) is at most "
            f"{NEAR_DUPLICATE_FLAG:.0%}; the upper end of its 95% interval over all runs too",
            f"largest final share per run {largest}; runs with a flagged block at any step: "
            + ("; ".join(flagged_runs) if flagged_runs else "none")
            + " (TwoNN is flagged there; GRIDE at order 16 reads past it)",
            bool(upper <= NEAR_DUPLICATE_FLAG), held, len(per_run), "runs",
        ))
    return out


def attention_findings(tables: dict[str, list[pd.DataFrame]], n: dict[str, int]) -> list[Finding]:
    """Attention entropy falls, early layers sharper, Q̄/K̄ sign (Godey et al. 2024, §5)."""
    out = []
    for m in MASKINGS:
        ent = seeds.per_seed(tables[m], "attention_entropy")
        first, last = int(ent["step"].min()), int(ent["step"].max())
        fell = _change_per_block(ent, first, last, sign=-1)
        v_end, s_end = seeds.grid(ent, step=last)
        held = sum(e.holds for e in fell)
        out.append(Finding(
            f"attention entropy falls during training ({m})",
            f"every block's head-mean entropy is lower at the last probe (step {last}) than at "
            f"step {first}, by more than the noise",
            f"{held} of {len(fell)} blocks fell; drop per block (nats) "
            + "; ".join(f"{e.name} {e.interval}" for e in fell),
            held == len(fell), _count(fell), n[m],
        ))
        b0, bl = v_end.index[0], v_end.index[-1]
        sharper = seeds.effect(
            "last block − first block", (v_end.loc[bl] - v_end.loc[b0]).to_numpy(),
            seeds.quadrature(s_end.loc[bl].to_numpy(), s_end.loc[b0].to_numpy()),
        )
        out.append(Finding(
            f"early layers attend more sharply than late ones ({m})",
            "final entropy of the first block is below that of the last block by more than "
            "the noise",
            f"first block {t_interval(v_end.loc[b0])}, last block {t_interval(v_end.loc[bl])} "
            f"nats; {sharper.format()}",
            sharper.holds, sharper.seeds_holding, n[m],
        ))
        qk_v, qk_s = seeds.grid(seeds.per_seed(tables[m], "qk_cosine"), step=last)
        q0, ql = qk_v.index[0], qk_v.index[-1]
        positive = seeds.effect(f"cos in block {int(q0)}", qk_v.loc[q0].to_numpy(),
                                qk_s.loc[q0].to_numpy())
        negative = seeds.effect(f"−cos in block {int(ql)}", -qk_v.loc[ql].to_numpy(),
                                qk_s.loc[ql].to_numpy())
        out.append(Finding(
            f"mean query and mean key align in early layers and oppose in late layers ({m})",
            "final head-mean cos(Q̄, K̄) is above 0 in the first block and below 0 in the last, "
            "each by more than the noise",
            f"final head-mean cos(Q̄, K̄) per block "
            f"{fmt_intervals(qk_v.index, [t_interval(qk_v.loc[b]) for b in qk_v.index])}",
            positive.holds and negative.holds, _count([positive, negative]), n[m],
        ))
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
        values = values.dropna()  # the steps every seed reads, as the claims above take them
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
