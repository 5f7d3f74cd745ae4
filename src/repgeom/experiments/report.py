"""Regenerate `docs/results.md` and its figures from run folders: no number is typed by hand.

The generated sections are followed by two hand-written files passed in, ``--analyses`` (the
analyses' sections, with numbers read from their CSV files) and ``--notes``.

    python -m repgeom.experiments.report \\
        --shape-of-learning multirun/shape_of_learning/<stamp> \\
        --distributions outputs/probe/<date>/<time> \\
        --common-bias docs/results/common_bias \\
        --analyses docs/results_analyses.md \\
        --out docs

Each claim of the papers is turned into a check on the tables the runs wrote; the report states
the check, the numbers it read and whether our runs agree.

Experiments 1-3 run several seeds per masking. The sweep folder holds one run folder per run,
named as Hydra's sweep names them, ``<masking>-seed<k>``, each with at least::

    <masking>-seed<k>/probes/probes.parquet     (or probes.csv)
    <masking>-seed<k>/.hydra/config.yaml        model, data, probe settings, masking.name, seed

and optionally ``csv/version_*/hparams.yaml`` (or ``hparams.yaml``), where the training run saved
``model.vocab_size``. Every verdict is counted per seed ("holds in 3 of 3 seeds") and decided on
the mean over seeds with a tolerance: an effect counts when it exceeds both the probe's batch
noise and the seed-to-seed spread (`repgeom.experiments.seeds`). Profiles and verdicts read blocks
1..L only, never the final norm's output (which is reported as its own number).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from matplotlib.figure import Figure

from repgeom.analyses.godey import drift_cosine_correlation
from repgeom.experiments import seeds
from repgeom.experiments.seeds import Effect, Interval, t_interval
from repgeom.probes import plots
from repgeom.probes.table import FINAL_NORM, read_table

MASKINGS = ("causal", "bidirectional")
RUN_FOLDER = re.compile(r"^(?P<masking>.+)-seed(?P<seed>\d+)$")
"""Hydra's sweep sub-folder of the preset: ``${masking.name}-seed${seed}``."""
NEAR_DUPLICATE_FLAG = 0.01
"""A layer is flagged when more than this share of its states have a near-duplicate. At the
probe's calibrated threshold (0.005 of the median neighbour distance), clean manifolds of
dimension 2-10 read under 1%, so a share above it is a property of the states, not of the
estimator."""
PAPER_VOCAB = 205
"""Characters of the full enwik8 after the cleaning of Razzhigaev et al. 2023, §2.1."""


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

    @property
    def count(self) -> str:
        """``holds in 3 of 3 seeds``, or '' when the finding is not per seed."""
        if self.n_seeds is None:
            return ""
        return f"holds in {self.seeds_holding} of {self.n_seeds} {self.unit}"

    def markdown(self) -> str:
        verdict = "**agrees**" if self.agrees else "**does not agree**"
        count = f"; {self.count}" if self.count else ""
        return (
            f"- *Claim:* {self.claim}\n  *Check:* {self.check}\n"
            f"  *Ours:* {self.observed}{count} → {verdict}"
        )


@dataclass
class Run:
    """One run folder of the sweep: its masking, seed, folder and saved config."""

    masking: str
    seed: int
    path: Path
    config: dict = field(default_factory=dict)


def _save(fig: Figure, path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    # bbox_inches="tight": nothing (a legend beside the axes, a long title) is cut at the edge.
    fig.savefig(path, dpi=110, facecolor="white", bbox_inches="tight")
    return path.as_posix()


def _fmt(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:.3f}" for v in values) + "]"


def _fmt_intervals(index: Sequence, intervals: Sequence[Interval], name: str = "block") -> str:
    return "; ".join(f"{name} {int(i)} {ci}" for i, ci in zip(index, intervals, strict=True))


def _markdown_table(frame: pd.DataFrame) -> str:
    """A DataFrame as a GitHub markdown table (index first)."""
    header = [frame.index.name or "", *map(str, frame.columns)]
    rows = [
        [str(i), *(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row)]
        for i, row in zip(frame.index, frame.itertuples(index=False), strict=True)
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


# ---------------------------------------------------------------------------------------------
# The sweep on disk


def find_runs(sweep: Path) -> dict[str, list[Run]]:
    """The run folders of a sweep, grouped by masking and sorted by seed.

    A run folder is a sub-folder of `sweep` with a probe table. Its masking and seed come from
    its ``.hydra/config.yaml`` (``masking.name``, ``seed``) where there is one, else from its name
    (``<masking>-seed<k>``; a folder named just ``causal`` is seed 0).

    Raises
    ------
    FileNotFoundError
        When `sweep` is missing or lacks runs of a masking in `MASKINGS`.
    ValueError
        When a folder's masking or seed cannot be told, or two folders share both.
    """
    if not sweep.is_dir():
        raise FileNotFoundError(f"sweep: {sweep} is not a folder")
    runs: dict[str, list[Run]] = {}
    for folder in sorted(p for p in sweep.iterdir() if p.is_dir()):
        if not any((folder / "probes" / f"probes.{ext}").is_file() for ext in ("parquet", "csv")):
            continue
        config_file = folder / ".hydra" / "config.yaml"
        config = yaml.safe_load(config_file.read_text()) if config_file.is_file() else {}
        named = RUN_FOLDER.match(folder.name)
        masking = (config.get("masking") or {}).get("name") or (
            named["masking"] if named else folder.name if folder.name in MASKINGS else None
        )
        seed = config.get("seed", int(named["seed"]) if named else 0 if masking else None)
        if masking is None or seed is None:
            raise ValueError(
                f"{folder}: cannot tell its masking and seed; name it <masking>-seed<k> or keep "
                "its .hydra/config.yaml"
            )
        runs.setdefault(str(masking), []).append(Run(str(masking), int(seed), folder, config))
    missing = [m for m in MASKINGS if m not in runs]
    if missing:
        found = {m: [r.path.name for r in rs] for m, rs in runs.items()}
        raise FileNotFoundError(
            f"{sweep}: no run folder with a probe table for masking {missing} "
            f"(expected <masking>-seed<k>/probes/probes.parquet); found {found or 'none'}"
        )
    for masking, group in runs.items():
        group.sort(key=lambda r: r.seed)
        seen = [r.seed for r in group]
        if len(set(seen)) < len(seen):
            raise ValueError(f"{sweep}: masking {masking!r} has a seed twice: {seen}")
    return runs


def vocab_size(run: Run) -> int | None:
    """``model.vocab_size`` of a run, from its config or the training run's ``hparams.yaml``.

    Hydra's saved config does not hold it (the data module sets it when it builds the
    vocabulary); Lightning's CSV logger saves the resolved one in ``csv/version_*/hparams.yaml``.
    None when no file of the run folder records it.
    """
    size = (run.config.get("model") or {}).get("vocab_size")
    if size is not None:
        return int(size)
    for path in [run.path / "hparams.yaml", *sorted(run.path.glob("csv/version_*/hparams.yaml"))]:
        if path.is_file():
            size = ((yaml.safe_load(path.read_text()) or {}).get("model") or {}).get("vocab_size")
            if size is not None:
                return int(size)
    return None


def _probe_set_used(group: list[Run]) -> dict | None:
    """The probe set a run actually used (``probes/probe_set.json``, written by the callback);
    None for runs written before it existed."""
    path = group[0].path / "probes" / "probe_set.json"
    return json.loads(path.read_text()) if path.exists() else None


def _run_facts(runs: dict[str, list[Run]]) -> dict:
    """Model, data, steps, seeds, vocabulary and probe protocol of each masking's runs."""
    facts = {}
    for masking, group in runs.items():
        cfg = group[0].config
        if not cfg:
            raise FileNotFoundError(f"{group[0].path}: no .hydra/config.yaml to read the scale")
        probe = cfg.get("probe") or {}
        settings = probe.get("settings") or {}
        sizes = {vocab_size(r) for r in group}
        facts[masking] = {
            "model": cfg["model"]["name"],
            "layers": cfg["model"]["n_layer"],
            "width": cfg["model"]["n_embd"],
            "data": cfg["data"]["source"],
            "clean": bool(cfg["data"].get("clean", False)),
            "steps": cfg["trainer"]["max_steps"],
            "batch": cfg["data"]["batch_size"],
            "block": cfg["model"]["block_size"],
            "seeds": [r.seed for r in group],
            "vocab": sorted(s for s in sizes if s is not None),
            "n_states": probe.get("n_states"),
            "positions": probe.get("positions_per_window"),
            "used": _probe_set_used(group),
            "state_batch": settings.get("state_batch_size"),
            "accelerator": str(cfg["trainer"].get("accelerator", "cpu")),
            "near_duplicate_threshold": settings.get("near_duplicate_threshold"),
        }
    return facts


# ---------------------------------------------------------------------------------------------
# Experiments 1-3


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
        f"{_fmt_intervals(values.index, bell.mean)}; peak at block {top}; "
        f"{bell.above_start.format().replace('start', 'first block')}, "
        f"{bell.above_end.format().replace('end', 'last block')}{norm_text}",
        bell.agrees, bell.seeds_holding, bell.n_seeds,
    )


def _profile_findings(tables: dict[str, list[pd.DataFrame]], n: dict[str, int]) -> list[Finding]:
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


def _id_findings(
    tables: dict[str, list[pd.DataFrame]], names: dict[str, list[str]], threshold: float | None
) -> list[Finding]:
    """The intrinsic dimension rises, then falls; and where TwoNN reads near-duplicates."""
    out = []
    shares = {
        m: seeds.per_seed(tables[m], "near_duplicate_share")
        for m in MASKINGS if all("near_duplicate_share" in set(t["metric"]) for t in tables[m])
    }
    for metric in ("twonn", "gride_k16"):
        for m in MASKINGS:
            if not all(metric in set(t["metric"]) for t in tables[m]):
                continue
            values, stds = seeds.grid(seeds.per_seed(tables[m], metric), layer_mean=True)
            if len(values) < 3:
                continue
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
            out.append(Finding(
                f"the mean intrinsic dimension ({metric}) rises early in training, then falls "
                f"({m})",
                "the mean over seeds of the layer mean (blocks 1..L) peaks strictly inside the "
                "run, and peak − start and peak − end both exceed the noise: their 95% "
                "intervals over seeds exclude 0 and their means beat the batch std (root mean "
                "square of the per-layer stds, combined in quadrature over the two points)",
                f"start {rf.mean[0]} (step {steps[0]}), peak {rf.mean[rf.peak]} at step "
                f"{steps[rf.peak]}, end {rf.mean[-1]} (step {steps[-1]}); "
                f"{rf.above_start.format()}, {rf.above_end.format()}{note}",
                rf.agrees, rf.seeds_holding, rf.n_seeds,
            ))
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


def _attention_findings(tables: dict[str, list[pd.DataFrame]], n: dict[str, int]) -> list[Finding]:
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
            f"{_fmt_intervals(qk_v.index, [t_interval(qk_v.loc[b]) for b in qk_v.index])}",
            positive.holds and negative.holds, _count([positive, negative]), n[m],
        ))
    return out


def drift_cosine(sweep: Path) -> pd.DataFrame:
    """Drift norm against mean cosine across blocks 1..L at the last probe, per masking
    (Godey et al. 2024, §3.3, Fig. 5: Spearman; appendix A, Fig. 16: Pearson).

    Returns
    -------
    DataFrame indexed by masking: ``step`` (the last probe), ``blocks``, ``seeds``, the mean over
    seeds of Spearman's rho and Pearson's r, and how many seeds have p < 0.05 for each
    (``spearman p<0.05``, ``pearson p<0.05``). Maskings whose tables lack ``drift_norm`` or
    ``mean_cosine`` are left out.
    """
    out = {}
    found = find_runs(sweep)
    for masking in [m for m in MASKINGS if m in found] + [m for m in found if m not in MASKINGS]:
        runs = found[masking]
        per_seed = []
        for run in runs:
            frame = read_table(run.path)
            if not {"drift_norm", "mean_cosine"} <= set(frame["metric"]):
                continue
            corr = drift_cosine_correlation(frame)
            per_seed.append(corr.loc[corr["step"] == corr["step"].max()].iloc[0])
        if not per_seed:
            continue
        seeds_frame = pd.DataFrame(per_seed)
        out[masking] = {
            "step": int(seeds_frame["step"].max()),
            "blocks": int(seeds_frame["n_layers"].min()),
            "seeds": len(seeds_frame),
            "spearman rho": float(seeds_frame["spearman_rho"].mean()),
            "spearman p<0.05": int((seeds_frame["spearman_p"] < 0.05).sum()),
            "pearson r": float(seeds_frame["pearson_r"].mean()),
            "pearson p<0.05": int((seeds_frame["pearson_p"] < 0.05).sum()),
        }
    result = pd.DataFrame.from_dict(out, orient="index")
    result.index.name = "masking"
    return result


def drift_cosine_lines(sweep: Path) -> list[str]:
    """The paragraph and table of `drift_cosine` for Godey's section of the report."""
    corr = drift_cosine(sweep)
    if corr.empty:
        return ["Drift norm against mean cosine: not measured (no `drift_norm` rows)."]
    return [
        "Drift norm ‖x̄‖ against mean cosine across blocks 1..L at the last probe "
        "(Godey et al. 2024, §3.3, Fig. 5: Spearman; appendix A, Fig. 16: Pearson), the mean "
        "over seeds and how many seeds reach p < 0.05. One point per block: Spearman's p is "
        "exact over all orderings of up to 8 blocks (`repgeom.analyses.godey.spearman_p`), and "
        "with 4 blocks it is at least 2/24 = 0.083 even at rho = 1, so only Pearson's test can "
        "reach p < 0.05 here.",
        "",
        _markdown_table(corr),
    ]


def shape_of_learning(
    sweep: Path, figures: Path
) -> tuple[list[str], dict[str, list[Finding]], dict]:
    """Experiments 1-3 from a sweep folder of ``<masking>-seed<k>`` runs (see the module doc).

    Returns
    -------
    images : list of str
        The figures written under `figures`.
    findings : dict
        ``profile``, ``id`` and ``attention``: the `Finding` of each check.
    facts : dict
        Per masking, what `_run_facts` read from the configs.

    Raises
    ------
    ValueError
        When the seeds of a masking were probed at different steps.
    """
    runs = find_runs(sweep)
    tables = {m: [read_table(r.path) for r in runs[m]] for m in MASKINGS}
    names = {m: [r.path.name for r in runs[m]] for m in MASKINGS}
    seeds.check_steps(tables, names)
    facts = _run_facts({m: runs[m] for m in MASKINGS})
    n = {m: len(tables[m]) for m in MASKINGS}
    images = []

    images.append(_save(figures.profile_bands(tables, "anisotropy"),
                        figures / "anisotropy_profiles.png"))
    for m in MASKINGS:
        images.append(_save(figures.per_layer_vs_step_bands(tables[m], "anisotropy"),
                            figures / f"anisotropy_vs_step_{m}.png"))
    for metric in ("twonn", "gride_k16"):
        if all(metric in set(t["metric"]) for ts in tables.values() for t in ts):
            images.append(_save(figures.metric_vs_step_bands(tables, metric),
                                figures / f"{metric}_vs_step.png"))
    for m in MASKINGS:
        images.append(_save(figures.per_layer_vs_step_bands(tables[m], "attention_entropy"),
                            figures / f"attention_entropy_{m}.png"))
        images.append(_save(figures.per_layer_vs_step_bands(tables[m], "qk_cosine"),
                            figures / f"qk_cosine_{m}.png"))

    threshold = facts["causal"]["near_duplicate_threshold"]
    findings = {
        "profile": _profile_findings(tables, n),
        "id": _id_findings(tables, names, threshold),
        "attention": _attention_findings(tables, n),
    }
    return images, findings, facts


def setup_lines(facts: dict) -> list[str]:
    """The paragraph that states the seeds, the vocabulary, the probe protocol and the statistics
    of experiments 1-3, every number read from `facts` (`_run_facts`)."""
    counts = ", ".join(
        f"{len(f['seeds'])} {m} (seeds {', '.join(map(str, f['seeds']))})" for m, f in facts.items()
    )
    sizes = sorted({v for f in facts.values() for v in f["vocab"]})
    vocab = (
        f"ours {', '.join(map(str, sizes))}, paper {PAPER_VOCAB}"
        if sizes else f"ours not recorded in the run folders (no model.vocab_size in "
        f".hydra/config.yaml or csv/version_*/hparams.yaml), paper {PAPER_VOCAB}"
    )
    f = facts["causal"]
    text = "cleaned text (markup removed, as the paper's §2.1 does)" if f["clean"] else "raw text"
    used = f["used"]
    if used and f["state_batch"]:
        fallback = ""
        if f["positions"] and used["positions_per_window"] > f["positions"]:
            fallback = (
                f" (the configured {f['positions']} positions from each of "
                f"{-(-f['n_states'] // f['positions'])} windows need more windows than the "
                f"{used['n_windows']} the validation split holds, so every window was probed at "
                f"{used['positions_per_window']} positions: a batch holds about "
                f"{f['state_batch'] / used['n_windows']:.1f} states per window and TwoNN reads "
                "up to about 10% low, benchmarks/README.md)"
            )
        protocol = (
            f"{used['n_states']} hidden states per layer and probe, "
            f"{used['positions_per_window']} random positions from each of {used['n_windows']} "
            f"windows of {used['window']}{fallback}, shuffled into batches of "
            f"{f['state_batch']}; every number is the mean over batches, with the std over "
            "batches (Razzhigaev et al. 2023, §2.2); attention and Q/K metrics on "
            f"{used['attention_windows']} whole windows"
        )
    elif f["n_states"] and f["positions"] and f["state_batch"]:
        protocol = (
            f"{f['n_states']} hidden states per layer and probe, {f['positions']} positions from "
            f"each of {f['n_states'] // f['positions']} windows (decorrelated: no two states "
            f"from one window beyond those {f['positions']}), in batches of {f['state_batch']}; "
            "every number is the mean over batches, with the std over batches (Razzhigaev et "
            "al. 2023, §2.2)"
        )
    else:
        protocol = "probe settings not recorded in the runs' configs"
    return [
        f"Seeds per masking: {counts}. Data: {f['data']}, {text}; vocabulary {vocab} "
        f"(characters of the full enwik8). Probe protocol: {protocol}.",
        "",
        "Statistics: a verdict is decided on the mean over seeds. Every effect (a difference "
        "such as peak − end) is given as mean [95% interval over seeds], the interval being "
        "mean ± t_{0.975, n−1} · s/√n (s the sample std of the n per-seed values; Welch's "
        "interval for a causal − bidirectional difference). It counts only when its mean "
        "exceeds the noise, the larger of (a) the batch noise — the table's std over batches, "
        "combined in quadrature over the points the effect is made of, the std of a layer mean "
        "taken as the root mean square of the per-layer stds (an overestimate whatever the "
        "correlation between layers) — and (b) the interval's half-width. "
        "\"Holds in k of n seeds\" counts the seeds in which the effect beats that seed's own "
        "batch noise. Profiles and verdicts use blocks 1..L; the final norm's output is shown "
        "in the figures as an open marker and reported as its own number, never as a block.",
    ]


def distributions(run: Path, figures: Path) -> tuple[list[str], pd.DataFrame]:
    """Experiment 5: best-fitting family and number of modes per layer, from a probe.py run."""
    frame = read_table(run)
    frame = frame[frame["step"] == frame["step"].max()]

    def best(prefix: str, largest: bool) -> pd.Series:
        rows = frame[frame["metric"].str.startswith(prefix)].sort_values("value", ascending=largest)
        return rows.groupby("layer").tail(1).set_index("layer")["metric"].str.removeprefix(prefix)

    names = frame.drop_duplicates("layer").set_index("layer")["layer_name"]
    per_layer = pd.DataFrame(
        {
            "name": names,
            "best by log-likelihood": best("loglik_", largest=True),
            "best by AIC": best("aic_", largest=False),
            "kurtosis": frame[frame["metric"] == "kurtosis"].set_index("layer")["value"],
            "modes": frame[frame["metric"] == "n_modes"].set_index("layer")["value"].astype(int),
        }
    ).sort_index()
    images = [_save(plots.layer_profile(frame, "kurtosis"), figures / "kurtosis_profile.png")]
    return images, per_layer


def distribution_finding(per_layer: pd.DataFrame) -> Finding:
    """The study's headline: hidden-state activations are not Gaussian."""
    blocks = per_layer.loc[
        (per_layer.index >= 1) & (per_layer["name"] != FINAL_NORM), "best by AIC"
    ]
    normal = [int(layer) for layer, family in blocks.items() if family == "normal"]
    return Finding(
        "activations inside the network are not Gaussian: another family fits them better",
        "the normal law is not the AIC-best family in any block (the final norm's output, "
        "listed in the table, is not a block)",
        f"AIC-best per block {dict(blocks.items())}; normal best in blocks {normal or 'none'}",
        not normal,
    )


def common_bias(folder: Path, out: Path) -> list[str]:
    """Experiment 4: the page `render_markdown` makes from each model's summary.json, re-rooted
    at `out` (headings one level down, figure links relative to the report)."""
    from repgeom.experiments.common_bias import render_markdown

    summaries = [json.loads(p.read_text()) for p in sorted(folder.glob("*/summary.json"))]
    if not summaries:
        raise FileNotFoundError(f"no */summary.json under {folder}; run experiment 4 first")
    prefix = folder.resolve().relative_to(out.resolve()).as_posix()
    lines = render_markdown(summaries).splitlines()[1:]  # its own title is ours
    body = []
    for line in lines:
        if line.startswith("#"):
            line = "#" + line
        line = re.sub(r"\]\((?!https?:)([^)]+\.png)\)", rf"]({prefix}/\1)", line)
        body.append(line)
    return body


def included_markdown(path: Path, out: Path) -> str:
    """The text of a hand-written section file, after checking that its links resolve from `out`.

    The analyses' sections (docs/results/analyses, papers/000 and papers/004) are written by hand
    from their CSV files; including them here keeps them when this report rewrites results.md.
    A relative link or figure that does not exist under `out` would be a dead link in the report.
    """
    text = path.read_text().strip()
    missing = [
        target
        for target in re.findall(r"\]\(([^)#\s]+)\)", text)
        if "://" not in target and not (out / target).exists()
    ]
    if missing:
        raise FileNotFoundError(
            f"{path} links to {missing}, which do not exist under {out}: write links relative "
            f"to the report's folder ({out}) and commit the files they name"
        )
    return text


def render(args: argparse.Namespace) -> Path:
    out = Path(args.out)
    figures = out / "results" / "figures"
    lines = [
        "# Results",
        "",
        f"Generated by `python -m repgeom.experiments.report {shlex.join(args.argv)}` from the "
        "run folders named below; every number here was read from a file a command wrote "
        "(the hand-written sections included from --analyses and --notes name the files and "
        "the command their numbers come from).",
        "",
    ]

    def rel(path: str) -> str:
        return Path(path).resolve().relative_to(out.resolve()).as_posix()

    if args.shape_of_learning:
        sweep = Path(args.shape_of_learning)
        images, findings, facts = shape_of_learning(sweep, figures)
        f = facts["causal"]
        scale = (
            f"{f['model']} ({f['layers']} layers, d={f['width']}), data={f['data']}, "
            f"{f['steps']} steps of {f['batch']}×{f['block']} characters, on "
            f"{f['accelerator'].upper()}"
        )
        command = "python train.py -m experiment=shape_of_learning"
        titles = {
            "profile": "1. Decoder vs encoder anisotropy profile (Razzhigaev et al. 2023)",
            "id": "2. Intrinsic dimension over training (Razzhigaev et al. 2023)",
            "attention": "3. Attention sharpening and Q/K drift (Godey et al. 2024, §3.3, §5)",
        }
        lines += ["## Experiments 1-3: runs and statistics", "", *setup_lines(facts), ""]
        for key, title in titles.items():
            lines += [
                f"## {title}",
                "",
                f"Command: `{command}` (run folder `{sweep.as_posix()}`).",
                f"Scale: {scale}.",
                "",
            ]
            lines += [finding.markdown() for finding in findings[key]] + [""]
            if key == "attention":
                lines += [*drift_cosine_lines(sweep), ""]
            prefixes = {
                "profile": ("anisotropy_",),
                "id": ("twonn_", "gride_"),
                "attention": ("attention_entropy", "qk_cosine"),
            }[key]
            lines += [
                f"![{Path(image).name}]({rel(image)})"
                for image in images
                if Path(image).name.startswith(prefixes)
            ]
            lines.append("")
    if args.common_bias:
        lines += ["## 4. An untrained block under a common bias (Godey et al. 2024, §4)", ""]
        lines += common_bias(Path(args.common_bias), out) + [""]
    if args.distributions:
        images, per_layer = distributions(Path(args.distributions), figures)
        lines += [
            '## 5. Activation distributions across layers ("Beyond Gaussian")',
            "",
            f"Command: `{args.distributions_command}` (probe run `{args.distributions}`).",
            "",
            _markdown_table(per_layer),
            "",
            distribution_finding(per_layer).markdown(),
            "",
        ]
        lines += [f"![{Path(i).name}]({rel(i)})" for i in images] + [""]
    if args.analyses:
        lines += [included_markdown(Path(args.analyses), out), ""]
    if args.notes:
        lines += ["## Scale and what it would take", "", Path(args.notes).read_text().strip(), ""]
    path = out / "results.md"
    path.write_text("\n".join(lines))
    return path


def main(argv: Sequence[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shape-of-learning",
        help="sweep folder with <masking>-seed<k>/ runs (probes/probes.parquet, .hydra/)",
    )
    parser.add_argument("--distributions", help="probe.py run folder with distribution fits")
    parser.add_argument(
        "--distributions-command", default="python probe.py ckpt=<causal run>/checkpoints/last.ckpt"
    )
    parser.add_argument("--common-bias", help="folder with <model>/summary.json of experiment 4")
    parser.add_argument(
        "--analyses",
        help="a hand-written markdown file (its own '## ' headings, links relative to --out) "
        "placed after the generated sections: the analyses of docs/results/analyses",
    )
    parser.add_argument("--notes", help="a markdown file appended as the closing section")
    parser.add_argument("--out", default="docs")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    path = render(args)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
