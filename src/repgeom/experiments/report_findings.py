"""The report's claim checks (experiments 1-3): each paper claim reduced to one number per seed
and tested over seeds (`repgeom.experiments.statistics`), then corrected by Holm within its
family (`adjust`): one family per experiment, the claims of one paper's experiment, so that the
chance of any false "agrees" among an experiment's verdicts is at most `statistics.ALPHA`.

Layout of a check: the metric's readings as a (seed, step, block) cube of blocks 1..L (`cube`);
a contrast between two steps is paired, per seed, over the blocks read at both steps in every seed
(`paired`), so that a block missing at one end never changes the mean it is compared with; an end
(anchor) no block is read at in every seed makes the verdict "not measured": it is never moved.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from repgeom.experiments import seeds
from repgeom.experiments import statistics as st
from repgeom.experiments.report_runs import MASKINGS
from repgeom.experiments.seeds import Interval, t_interval
from repgeom.probes.core.table import FINAL_NORM

VERDICTS = ("agrees", "not shown", "not testable", "not measured")
"""The labels a verdict reads: adjusted p ≤ `statistics.ALPHA`; a larger one; fewer than
`statistics.MIN_SEEDS` seeds (or no test); an end (anchor) of the check not read."""


@dataclass
class Finding:
    """One claim, the check that tests it, what our runs gave, and the verdict.

    `p` is the check's p (one-sided, corrected for a data-chosen peak); `adjusted` its
    Holm-adjusted p within its `family` (`adjust`). ``seeds_holding`` of ``n_seeds`` runs
    (or pairs of runs, `unit`) show the effect's sign on their own: information, not the verdict.
    """

    claim: str
    check: str
    observed: str
    p: float = math.nan
    seeds_holding: int | None = None
    n_seeds: int | None = None
    unit: str = "seeds"
    measured: bool = True
    """False: the tables do not hold what the check needs (the verdict says "not measured")."""
    adjusted: float = math.nan
    family: str = ""
    """The family Holm ran over (``experiment 2``), set by `adjust`."""
    family_size: int = 0
    """How many tested checks that family holds."""

    @property
    def testable(self) -> bool:
        """Measured, with at least `statistics.MIN_SEEDS` seeds and a p."""
        return bool(self.measured and self.n_seeds is not None
                    and self.n_seeds >= st.MIN_SEEDS and np.isfinite(self.p))

    @property
    def verdict(self) -> str:
        """One of `VERDICTS`."""
        if not self.measured:
            return "not measured"
        if not self.testable:
            return "not testable"
        return "agrees" if self.adjusted <= st.ALPHA else "not shown"

    @property
    def agrees(self) -> bool:
        return self.verdict == "agrees"

    @property
    def count(self) -> str:
        """``the sign holds in 3 of 3 seeds``, or '' when the finding is not per seed."""
        if self.n_seeds is None or self.seeds_holding is None:
            return ""
        return f"the sign holds in {self.seeds_holding} of {self.n_seeds} {self.unit}"

    def markdown(self) -> str:
        count = f"; {self.count}" if self.count else ""
        if self.verdict == "not measured":
            stat = ""
        elif self.testable:
            stat = (f"; p = {st.fmt_p(self.p)}, adjusted p = {st.fmt_p(self.adjusted)} (Holm "
                    f"over {self.family_text})")
        elif self.n_seeds is not None and self.n_seeds >= st.MIN_SEEDS:
            stat = "; p = n/a (no test: see above)"
        else:
            n = "no seeds" if self.n_seeds is None else f"{self.n_seeds} {self.unit}"
            stat = f"; p = n/a ({n}: at least {st.MIN_SEEDS} are needed for a test)"
        if self.family and not self.testable:
            stat += f"; family: {self.family}, not counted by its Holm correction"
        return (
            f"- *Claim:* {self.claim}\n  *Check:* {self.check}\n"
            f"  *Ours:* {self.observed}{count}{stat} → **{self.verdict}**"
        )

    @property
    def family_text(self) -> str:
        """``the 5 tested checks of experiment 2``."""
        size = f"the {self.family_size} tested check{'s' if self.family_size != 1 else ''}"
        return f"{size} of {self.family}" if self.family else size


def adjust(findings: Sequence[Finding], family: str) -> None:
    """Holm (1979) over the testable findings of one `family`: sets each one's `adjusted` p,
    `family` and `family_size` in place."""
    ps = [f.p if f.testable else math.nan for f in findings]
    size = sum(f.testable for f in findings)
    for finding, adjusted in zip(findings, st.holm(ps), strict=True):
        finding.adjusted = float(adjusted)
        finding.family, finding.family_size = family, size


def fmt_intervals(index: Sequence, intervals: Sequence[Interval], name: str = "block") -> str:
    return "; ".join(f"{name} {int(i)} {ci}" for i, ci in zip(index, intervals, strict=True))


def effect_text(name: str, values: np.ndarray, p: float | None = None, extra: str = "") -> str:
    """``peak − end = 1.2 [0.9, 1.4] (one-sided p = 0.003)``: mean [95% interval] over seeds."""
    p_text = "" if p is None else f"one-sided p = {st.fmt_p(p)}"
    inside = "; ".join(t for t in (p_text, extra) if t)
    return f"{name} = {t_interval(values)}" + (f" ({inside})" if inside else "")


# ---------------------------------------------------------------------------------------------
# Readings as (seed, step, block) cubes


def cube(stacked: pd.DataFrame, column: str = "value") -> tuple[list[int], list[int], np.ndarray]:
    """Steps, blocks (1..L, never the final norm) and the (seed, step, block) array of `column`
    from `seeds.per_seed`; a reading not in the table is NaN."""
    rows = stacked.loc[(stacked["layer"] >= 1) & (stacked["layer_name"] != FINAL_NORM)]
    steps = sorted(int(s) for s in stacked["step"].unique())
    blocks = sorted(int(b) for b in rows["layer"].unique())
    out = np.full((int(stacked[seeds.SEED].max()) + 1, len(steps), len(blocks)), np.nan)
    at_step = {s: i for i, s in enumerate(steps)}
    at_block = {b: i for i, b in enumerate(blocks)}
    out[rows[seeds.SEED].to_numpy(), rows["step"].map(at_step).to_numpy(),
        rows["layer"].map(at_block).to_numpy()] = rows[column].to_numpy(dtype=float)
    return steps, blocks, out


def present(values: np.ndarray, step: int) -> np.ndarray:
    """Per block: read (finite) at step index `step` in every seed."""
    return np.isfinite(values[:, step, :]).all(axis=0)


def paired(values: np.ndarray, a: int, b: int) -> tuple[np.ndarray, int]:
    """Per seed, the mean over the blocks read at steps `a` and `b` in every seed of
    ``v(b) − v(a)``, and how many blocks that is (NaN per seed when none)."""
    both = present(values, a) & present(values, b)
    if not both.any():
        return np.full(values.shape[0], np.nan), 0
    return (values[:, b, both] - values[:, a, both]).mean(axis=1), int(both.sum())


def nan_text(values: np.ndarray, steps: Sequence[int] | None = None) -> str:
    """``NaN readings: 3 of 48 (block, step, seed) (6.2%)`` over the given step indices."""
    part = values if steps is None else values[:, list(steps), :]
    share = np.isnan(part).mean() if part.size else 0.0
    return (f"NaN readings: {int(np.isnan(part).sum())} of {part.size} (block, step, seed) "
            f"({share:.1%})")


# ---------------------------------------------------------------------------------------------
# Experiment 1: anisotropy profiles


def _bell_finding(stacked: pd.DataFrame, last: int, n: int) -> Finding:
    """Bell-shaped decoder profile: an interior block above the first and the last (blocks only)."""
    claim = ("the decoder's anisotropy profile over layers is bell-shaped "
             "(highest in the middle layers)")
    steps, blocks, values = cube(stacked)
    profile = values[:, steps.index(last), :]  # (seed, block)
    if len(blocks) < 3:
        return Finding(claim, "a peak strictly inside the profile of blocks 1..L",
                       f"the model has {len(blocks)} blocks: no interior block, the shape cannot "
                       "be tested", math.nan, 0, n)
    check = ("final causal profile over blocks 1..L: peak − first block > 0 and peak − last block "
             "> 0 per seed; intersection-union test (Berger 1982) of the two one-sided t tests "
             "over seeds at the interior block most above both ends, its choice corrected by "
             "Bonferroni over the interior blocks")
    nans = nan_text(values, [steps.index(last)])
    if not (np.isfinite(profile[:, 0]).all() and np.isfinite(profile[:, -1]).all()):
        return Finding(claim, check, f"the first or last block is not read in every seed at "
                       f"step {last} ({nans})", measured=False, n_seeds=n)
    inner = [j for j in range(1, len(blocks) - 1) if np.isfinite(profile[:, j]).all()]
    top = st.peak_test(profile[:, inner] - profile[:, [0]], profile[:, inner] - profile[:, [-1]])
    peak = inner[top.peak]
    means = [t_interval(profile[:, j]) for j in range(len(blocks))]
    norm = stacked.loc[(stacked["layer_name"] == FINAL_NORM) & (stacked["step"] == last)]
    norm_text = (f", final-norm output {t_interval(norm['value'].to_numpy())} (not a block: left "
                 "out of the check)" if not norm.empty else "")
    return Finding(
        claim, check,
        f"final causal profile (step {last}, mean [95% interval]) "
        f"{fmt_intervals(blocks, means)}; peak at block {blocks[peak]} (the interior block "
        f"most above both ends; the mean profile's largest is block "
        f"{blocks[int(np.argmax([c.mean for c in means]))]}); uncorrected intervals at the "
        "chosen block: "
        f"{effect_text('peak − first block', top.start, top.p_start)}, "
        f"{effect_text('peak − last block', top.end, top.p_end)}; {top.detail}; last block "
        f"(block {blocks[-1]}) {means[-1]}{norm_text}; {nans}",
        top.p, int(((top.start > 0) & (top.end > 0)).sum()), n,
    )


def _per_block_change(stacked: pd.DataFrame, sign: int, claim: str, what: str, unit: str,
                      n: int) -> Finding:
    """Every block moves the claimed way (`sign`) from the first to the last probe: one paired t
    test over seeds per block, joined by the intersection-union test."""
    steps, blocks, values = cube(stacked)
    first, last = steps[0], steps[-1]
    check = (f"every block's {what} is {'higher' if sign > 0 else 'lower'} at the last probe "
             f"(step {last}) than at step {first}: per block, a one-sided t test over seeds of "
             "the per-seed change; intersection-union test (Berger 1982) over the blocks")
    nans = nan_text(values, [0, len(steps) - 1])
    read = present(values, 0) & present(values, len(steps) - 1)
    if not read.all():
        missing = [b for b, ok in zip(blocks, read, strict=True) if not ok]
        return Finding(claim, check, f"blocks {missing} are not read at step {first} or {last} "
                       f"in every seed ({nans}); the ends are never moved", measured=False,
                       n_seeds=n)
    change = sign * (values[:, -1, :] - values[:, 0, :])  # (seed, block)
    ps = [st.t_test(change[:, j]) for j in range(len(blocks))]
    grew = sum(float(np.mean(change[:, j])) > 0 for j in range(len(blocks)))
    return Finding(
        claim, check,
        f"{grew} of {len(blocks)} blocks {'grew' if sign > 0 else 'fell'} on average; "
        f"{'increase' if sign > 0 else 'drop'} per block{unit} "
        + "; ".join(effect_text(f"block {b}", change[:, j], ps[j]).replace(" = ", " ", 1)
                    for j, b in enumerate(blocks)) + f"; {nans}",
        st.iut(ps), int((change > 0).all(axis=1).sum()), n,
    )


def profile_findings(tables: dict[str, list[pd.DataFrame]], n: dict[str, int]) -> list[Finding]:
    """Bell-shaped decoder, flatter encoder, anisotropy growing (Razzhigaev et al. 2023)."""
    stacked = {m: seeds.per_seed(tables[m], "anisotropy") for m in MASKINGS}
    last = {m: int(s["step"].max()) for m, s in stacked.items()}
    out = [_bell_finding(stacked["causal"], last["causal"], n["causal"])]

    spread, nans = {}, []
    for m in MASKINGS:
        steps, _, values = cube(stacked[m])
        profile = values[:, steps.index(last[m]), :]
        spread[m] = np.nanmax(profile, axis=1) - np.nanmin(profile, axis=1)
        nans.append(f"{m} {nan_text(values, [steps.index(last[m])])}")
    k = min(n.values())
    out.append(Finding(
        "the encoder's profile is flatter than the decoder's",
        "max − min over blocks of the final profile, per seed; the causal spreads exceed the "
        "bidirectional ones: one-sided Welch t test over the two groups of seeds; the sign per "
        "pair compares seed k of each masking",
        f"spread causal {t_interval(spread['causal'])}, bidirectional "
        f"{t_interval(spread['bidirectional'])}; spread causal − spread bidirectional = "
        f"{seeds.welch_interval(spread['causal'], spread['bidirectional'])}; " + "; ".join(nans),
        st.welch_test(spread["causal"], spread["bidirectional"]),
        int((spread["causal"][:k] > spread["bidirectional"][:k]).sum()), k, "seed pairs",
    ))
    for m in MASKINGS:
        out.append(_per_block_change(stacked[m], 1, f"anisotropy grows during training ({m})",
                                     "anisotropy", "", n[m]))
    return out


# ---------------------------------------------------------------------------------------------
# Experiment 3: attention


def attention_findings(tables: dict[str, list[pd.DataFrame]], n: dict[str, int]) -> list[Finding]:
    """Attention entropy falls, early layers sharper, Q̄/K̄ sign (Godey et al. 2024, §5)."""
    out = []
    for m in MASKINGS:
        ent = seeds.per_seed(tables[m], "attention_entropy")
        out.append(_per_block_change(ent, -1, f"attention entropy falls during training ({m})",
                                     "head-mean entropy", " (nats)", n[m]))
        steps, blocks, values = cube(ent)
        final = values[:, -1, :]
        sharper = final[:, -1] - final[:, 0]
        p = st.t_test(sharper)
        out.append(Finding(
            f"early layers attend more sharply than late ones ({m})",
            f"final entropy (step {steps[-1]}) of the first block is below that of the last "
            "block: one-sided t test over seeds of the per-seed difference",
            f"first block {t_interval(final[:, 0])}, last block {t_interval(final[:, -1])} "
            f"nats; {effect_text('last block − first block', sharper)}; "
            f"{nan_text(values, [len(steps) - 1])}",
            p, int((sharper > 0).sum()), n[m],
        ))
        qk_steps, qk_blocks, qk = cube(seeds.per_seed(tables[m], "qk_cosine"))
        qk_final = qk[:, -1, :]
        per_block = [t_interval(qk_final[:, j]) for j in range(len(qk_blocks))]
        align, oppose = qk_final[:, 0], -qk_final[:, -1]
        ps = [st.t_test(align), st.t_test(oppose)]
        out.append(Finding(
            f"mean query and mean key align in early layers and oppose in late layers ({m})",
            "final head-mean cos(Q̄, K̄) is above 0 in the first block and below 0 in the last: "
            "intersection-union test (Berger 1982) of the two one-sided t tests over seeds",
            f"final head-mean cos(Q̄, K̄) per block "
            f"{fmt_intervals(qk_blocks, per_block)}"
            f"; {effect_text(f'cos in block {qk_blocks[0]}', align, ps[0])}, "
            f"{effect_text(f'−cos in block {qk_blocks[-1]}', oppose, ps[1])}; "
            f"{nan_text(qk, [len(qk_steps) - 1])}",
            st.iut(ps), int(((align > 0) & (oppose > 0)).sum()), n[m],
        ))
    return out
