"""The shuffled-text control of the report: the intrinsic-dimension peak over layers on real text
against the same windows with their tokens shuffled (Cheng et al. 2025, ICLR, "Emergence of a
high-dimensional abstraction phase in language transformers", §4.1: the ID profile over layers
has a peak in the middle layers on real text, much reduced on shuffled text).

The folder holds, for each trained run (``<masking>-seed<k>``), two probe runs of its last
checkpoint, one per text, made with the same protocol (``probe.py``, the checkpoint's own probe
set; ``texts=`` the only difference)::

    <folder>/<masking>-seed<k>/real/probes/probes.parquet
    <folder>/<masking>-seed<k>/shuffled/probes/probes.parquet

The check, per masking, with the seed as the unit, tests a contrast declared before the data:
each probe run's interior-peak height over blocks 1..L (never the final norm's output; a block
NaN on one text is left out on both, as the report pairs its other readings) is the mean TwoNN of
the interior blocks minus the mean of the first and the last block, a linear contrast that chooses
no block; per seed, real minus shuffled; one-sided Student t test over seeds
(`repgeom.experiments.statistics.t_test`); Holm over this section's checks (one per masking, the
control's own family). The claim is about a peak in the middle layers, so a masking none of whose
probe runs (either text) has its largest block inside the profile reads **not testable**: no run
has the phase the claim compares. The gate looks at both texts alike, so under the null (the two
texts' profiles exchangeable within a seed) it leaves the contrast's distribution symmetric and
the t test's level unchanged. (The earlier statistic, real peak − shuffled peak with each peak the
largest block, was biased: a flat profile's largest block reads higher than a peaked one's at
equal true heights, by about 1σ of the blocks' noise; issue 49.)

The two probe runs of a seed must have read the same checkpoint (one step, the same blocks) on
the text their folder names (the table's ``texts`` column); anything else is an error
naming the run and the command. A run folder with one text only is left out, and named.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from repgeom.experiments import statistics as st
from repgeom.experiments.report_findings import Finding, adjust, effect_text
from repgeom.experiments.report_runs import MASKINGS, RUN_FOLDER
from repgeom.experiments.report_sections import markdown_table
from repgeom.experiments.seeds import t_interval
from repgeom.probes.core import table
from repgeom.probes.core.table import FINAL_NORM

METRIC = "twonn"
FAMILY = "the shuffled-text control"
"""Holm's family of this section's checks (`report_findings.adjust`)."""
TEXTS = ("real", "shuffled")
COMMAND = ("python probe.py ckpt=<run>/checkpoints/last.ckpt texts=<real|shuffled> "
           "hydra.run.dir=<folder>/<masking>-seed<k>/<real|shuffled>")


def profile(probe_run: Path, text: str) -> tuple[int, pd.Series]:
    """The step and the TwoNN over blocks 1..L (index: block) of a probe run of one checkpoint on
    `text`; a missing reading is NaN.

    Raises
    ------
    FileNotFoundError
        The folder holds no table.
    ValueError
        The table was probed on another text, holds no TwoNN rows over blocks, or several steps.
    """
    frame = table.read_table(probe_run)
    texts = table.texts_of(frame)
    if texts != {text}:
        raise ValueError(
            f"{probe_run} was probed on {' and '.join(sorted(texts)) or 'no'} text, and its "
            f"folder says {text}: probe the checkpoint with texts={text} ({COMMAND})")
    rows = frame.loc[(frame["metric"] == METRIC) & (frame["layer"] >= 1)
                     & (frame["layer_name"] != FINAL_NORM)]
    if rows.empty:
        raise ValueError(f"{probe_run} holds no {METRIC} rows over blocks 1..L: probe it with "
                         f"a metric set that has {METRIC}: {COMMAND} 'metrics=[default]'")
    if rows["step"].nunique() > 1:
        raise ValueError(f"{probe_run} holds {rows['step'].nunique()} steps; the control reads "
                         "one checkpoint per probe run (probe.py ckpt=...)")
    return int(rows["step"].iloc[0]), rows.groupby("layer")["value"].mean().sort_index()


def runs(folder: Path) -> tuple[list[tuple[Path, str, int]], list[str]]:
    """The (run folder, masking, seed) with both texts probed, and a line for each folder left
    out: a name that is no ``<masking>-seed<k>``, a text not probed, or a text folder without a
    table (a probe run that has not finished: Hydra makes the folder when it starts). Hidden
    folders are skipped."""
    pairs, left = [], []
    for run in sorted(p for p in Path(folder).iterdir()
                      if p.is_dir() and not p.name.startswith(".")):
        match = RUN_FOLDER.match(run.name)
        if match is None or match["masking"] not in MASKINGS:
            left.append(f"{run.name} (not <masking>-seed<k>, masking one of "
                        f"{', '.join(MASKINGS)})")
        elif missing := [t for t in TEXTS if not (run / t).is_dir()]:
            left.append(f"{run.name} (no {' and no '.join(missing)}/ probe run)")
        elif unfinished := [t for t in TEXTS if not table.has_table(run / t)]:
            left.append(f"{run.name} (no table in {' and '.join(unfinished)}/: a probe run "
                        f"that did not finish; run it again: {COMMAND})")
        else:
            pairs.append((run, match["masking"], int(match["seed"])))
    return pairs, left


def interior_height(values: pd.Series) -> float:
    """The declared interior-peak contrast of a profile over blocks (index: block, in order): the
    mean of the interior blocks minus the mean of the first and the last; NaN with fewer than 3
    blocks."""
    v = values.to_numpy(dtype=float)
    if v.size < 3:
        return np.nan
    return float(v[1:-1].mean() - (v[0] + v[-1]) / 2)


def pair_columns(real: pd.Series, shuffled: pd.Series) -> dict:
    """One seed's columns of `peaks` from its two profiles over blocks (index: block, in order;
    NaN: not read): per text, over the blocks read on both texts, ``<text>_peak`` (the largest
    TwoNN) and ``<text>_block`` (its block), ``<text>_interior_peak`` (that block is neither the
    first nor the last), ``<text>_height`` (`interior_height`), and ``<text>_nan``."""
    both = real.notna() & shuffled.notna()
    row = {}
    for text, values in zip(TEXTS, (real, shuffled), strict=True):
        read = values[both]
        row[f"{text}_peak"] = float(read.max()) if len(read) else np.nan
        row[f"{text}_block"] = int(read.idxmax()) if len(read) else -1
        row[f"{text}_interior_peak"] = bool(
            len(read) >= 3 and read.index[0] < row[f"{text}_block"] < read.index[-1])
        row[f"{text}_height"] = interior_height(read)
        row[f"{text}_nan"] = int(values.isna().sum())
    return row


def peaks(folder: Path) -> pd.DataFrame:
    """One row per (masking, seed) with both texts probed: the step, the number of blocks, and
    per text, over the blocks read on both texts, the peak (largest TwoNN) and its block, whether
    that block is interior (neither the first nor the last), the interior-peak height
    (`interior_height`), and the text's NaN readings."""
    return _peaks(folder, runs(folder)[0])


def _peaks(folder: Path, pairs: list[tuple[Path, str, int]]) -> pd.DataFrame:
    """`peaks` of the run folders `runs` found."""
    rows = []
    for run, masking, seed in pairs:
        (step, real), (step_b, shuffled) = (profile(run / text, text) for text in TEXTS)
        if step != step_b:
            raise ValueError(f"{run}: real text probed at step {step}, shuffled at step "
                             f"{step_b}: probe the same checkpoint on both ({COMMAND})")
        if list(real.index) != list(shuffled.index):
            raise ValueError(
                f"{run}: real text read blocks {list(real.index)}, shuffled blocks "
                f"{list(shuffled.index)}; one checkpoint reads the same blocks on both texts: "
                f"probe the same checkpoint on both ({COMMAND})")
        rows.append({"masking": masking, "seed": seed, "step": step, "blocks": len(real),
                     **pair_columns(real, shuffled)})
    if not rows:
        raise FileNotFoundError(
            f"no <masking>-seed<k>/real and /shuffled probe runs in {folder}: make them with "
            f"{COMMAND}")
    return pd.DataFrame(rows).sort_values(["masking", "seed"], ignore_index=True)


def findings(folder: Path) -> list[Finding]:
    """The control's checks, one per masking present, Holm-adjusted together."""
    return _findings(peaks(folder))


def _findings(table_: pd.DataFrame) -> list[Finding]:
    """`findings` of the `peaks` already read."""
    out = []
    for masking, group in table_.groupby("masking", sort=False):
        diff = (group["real_height"] - group["shuffled_height"]).to_numpy(dtype=float)
        finite = diff[np.isfinite(diff)]
        interior = int(group["real_interior_peak"].sum() + group["shuffled_interior_peak"].sum())
        blocks = ", ".join(f"seed {s}: block {r} real, block {h} shuffled" for s, r, h in zip(
            group["seed"], group["real_block"], group["shuffled_block"], strict=True))
        nan = int(group["real_nan"].sum() + group["shuffled_nan"].sum())
        readings = int(2 * group["blocks"].sum())
        role = "decoder" if masking == "causal" else "encoder"
        observed = (f"seeds {', '.join(str(s) for s in group['seed'])}; interior-peak height "
                    f"real {t_interval(group['real_height'].to_numpy(dtype=float))}, shuffled "
                    f"{t_interval(group['shuffled_height'].to_numpy(dtype=float))}; largest "
                    f"blocks ({blocks}); {interior} of {2 * len(group)} probe runs have their "
                    f"largest block inside the profile; NaN readings: {nan} of {readings} "
                    "(block, text, seed)")
        if interior == 0:
            p = np.nan
            observed += ("; no probe run of this masking peaks inside the profile, on either "
                         "text: the middle-layer peak the claim compares is not there, so there "
                         "is no test")
        else:
            p = st.t_test(finite)
            observed += "; " + effect_text("real − shuffled", finite, p)
        out.append(Finding(
            claim=f"the {role}'s intrinsic-dimension peak in the middle layers is lower on "
                  f"shuffled text than on real text ({masking})",
            check="per seed, the interior-peak height of the last checkpoint's TwoNN profile "
                  "over blocks 1..L (the blocks read on both texts): the mean of the interior "
                  "blocks minus the mean of the first and the last block, a contrast declared "
                  "before the data (no block chosen), real minus shuffled (the same windows and "
                  "positions, tokens shuffled within each window); one-sided Student t test over "
                  "seeds; not testable where no probe run of the masking, on either text, has "
                  "its largest block inside the profile; Holm over the control's checks",
            observed=observed, p=p,
            seeds_holding=int((finite > 0).sum()) if interior else None,
            n_seeds=int(finite.size)))
    adjust(out, FAMILY)
    return out


def lines(folder: Path) -> list[str]:
    """The report's section: the command, the per-run peaks and the verdicts."""
    pairs, left = runs(folder)
    read = _peaks(folder, pairs)  # every probe table read once, for the table and the checks
    shown = read.set_index(["masking", "seed"])[
        ["step", "real_height", "shuffled_height", "real_peak", "real_block", "shuffled_peak",
         "shuffled_block"]]
    shown.index = [f"{m}-seed{s}" for m, s in shown.index]
    shown.index.name = "run"
    return [
        f"Command, per trained run and text: `{COMMAND}` (probe runs under "
        f"`{Path(folder).as_posix()}`).",
        *([f"Left out: {'; '.join(left)}."] if left else []),
        "",
        markdown_table(shown),
        "",
        *[f.markdown() for f in _findings(read)],
    ]
