"""The shuffled-text control of the report: the intrinsic-dimension peak over layers on real text
against the same windows with their tokens shuffled (Cheng et al. 2025, ICLR, "Emergence of a
high-dimensional abstraction phase in language transformers", §4.1: the ID profile over layers
has a peak in the middle layers on real text, much reduced on shuffled text).

The folder holds, for each trained run (``<masking>-seed<k>``), two probe runs of its last
checkpoint, one per text, made with the same protocol (``probe.py``, the checkpoint's own probe
set; ``texts=`` the only difference)::

    <folder>/<masking>-seed<k>/real/probes/probes.parquet
    <folder>/<masking>-seed<k>/shuffled/probes/probes.parquet

The check, per masking, with the seed as the unit: each probe run's peak is the largest TwoNN
over blocks 1..L (never the final norm's output), a statistic of its own profile, so no choice is
made on the contrast; per seed, real peak − shuffled peak; one-sided Student t test over seeds
(`repgeom.experiments.statistics.t_test`); Holm over this section's checks (one per masking).
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
TEXTS = ("real", "shuffled")
COMMAND = ("python probe.py ckpt=<run>/checkpoints/last.ckpt texts=<real|shuffled> "
           "hydra.run.dir=<folder>/<masking>-seed<k>/<real|shuffled>")


def profile(probe_run: Path) -> pd.Series:
    """The TwoNN over blocks 1..L (index: block) of a probe run of one checkpoint; a missing
    reading is NaN. Raises FileNotFoundError naming the folder when it holds no table."""
    frame = table.read_table(probe_run)
    rows = frame.loc[(frame["metric"] == METRIC) & (frame["layer"] >= 1)
                     & (frame["layer_name"] != FINAL_NORM)]
    if rows["step"].nunique() > 1:
        raise ValueError(f"{probe_run} holds {rows['step'].nunique()} steps; the control reads "
                         "one checkpoint per probe run (probe.py ckpt=...)")
    return rows.groupby("layer")["value"].mean().sort_index()


def peaks(folder: Path) -> pd.DataFrame:
    """One row per (masking, seed) with both texts probed: the peak (largest TwoNN over blocks)
    and its block, per text."""
    rows = []
    for run in sorted(p for p in Path(folder).iterdir() if p.is_dir()):
        match = RUN_FOLDER.match(run.name)
        if match is None or match["masking"] not in MASKINGS:
            continue
        if not all((run / text).is_dir() for text in TEXTS):
            continue
        row = {"masking": match["masking"], "seed": int(match["seed"])}
        for text in TEXTS:
            values = profile(run / text)
            finite = values.dropna()
            row[f"{text}_peak"] = float(finite.max()) if len(finite) else np.nan
            row[f"{text}_block"] = int(finite.idxmax()) if len(finite) else -1
            row[f"{text}_nan"] = int(values.isna().sum())
            row["blocks"] = len(values)
        rows.append(row)
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
        diff = (group["real_peak"] - group["shuffled_peak"]).to_numpy(dtype=float)
        finite = diff[np.isfinite(diff)]
        p = st.t_test(finite)
        blocks = ", ".join(f"seed {s}: block {r} real, block {h} shuffled" for s, r, h in zip(
            group["seed"], group["real_block"], group["shuffled_block"], strict=True))
        nan = int(group["real_nan"].sum() + group["shuffled_nan"].sum())
        readings = int(2 * group["blocks"].sum())
        role = "decoder" if masking == "causal" else "encoder"
        out.append(Finding(
            claim=f"the {role}'s intrinsic-dimension peak over layers is lower on shuffled text "
                  f"than on real text ({masking})",
            check="per seed, the largest TwoNN over blocks 1..L of the last checkpoint's profile, "
                  "real minus shuffled (the same windows and positions, tokens shuffled within "
                  "each window); one-sided Student t test over seeds; Holm over the control's "
                  "checks",
            observed=(f"seeds {', '.join(str(s) for s in group['seed'])}; peak real "
                      f"{t_interval(group['real_peak'].to_numpy(dtype=float))}, shuffled "
                      f"{t_interval(group['shuffled_peak'].to_numpy(dtype=float))}; "
                      + effect_text("real − shuffled", finite, p)
                      + f"; peak blocks ({blocks}); NaN readings: {nan} of {readings} "
                        "(block, text, seed)"),
            p=p, seeds_holding=int((finite > 0).sum()), n_seeds=int(finite.size)))
    adjust(out)
    return out


def lines(folder: Path) -> list[str]:
    """The report's section: the command, the per-run peaks and the verdicts."""
    read = peaks(folder)  # every probe table read once, for the table and the checks
    shown = read.set_index(["masking", "seed"])[
        ["real_peak", "real_block", "shuffled_peak", "shuffled_block"]]
    shown.index = [f"{m}-seed{s}" for m, s in shown.index]
    shown.index.name = "run"
    return [
        f"Command, per trained run and text: `{COMMAND}` (probe runs under "
        f"`{Path(folder).as_posix()}`).",
        "",
        markdown_table(shown),
        "",
        *[f.markdown() for f in _findings(read)],
    ]
