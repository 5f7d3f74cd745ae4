"""The report's sections: figures and findings of the sweep, its setup paragraph, Godey's
drift/cosine test, the distributions, experiment 4, and hand-written pages.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from repgeom.experiments import figures as bands
from repgeom.experiments import seeds
from repgeom.experiments import statistics as st
from repgeom.experiments.report_findings import (
    Finding,
    adjust,
    attention_findings,
    profile_findings,
)
from repgeom.experiments.report_id import id_findings, scale_lines
from repgeom.experiments.report_runs import MASKINGS, PAPER_VOCAB, find_runs, run_facts
from repgeom.probes.core.table import FINAL_NORM, layer_rows, read_table
from repgeom.probes.report import plots
from repgeom.probes.report.drift_cosine import drift_cosine_correlation


def save_figure(fig: Figure, path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    # bbox_inches="tight": nothing (a legend beside the axes, a long title) is cut at the edge.
    fig.savefig(path, dpi=110, facecolor="white", bbox_inches="tight")
    return path.as_posix()


def markdown_table(frame: pd.DataFrame) -> str:
    """A DataFrame as a GitHub markdown table (index first)."""
    header = [frame.index.name or "", *map(str, frame.columns)]
    rows = [
        [str(i), *(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row)]
        for i, row in zip(frame.index, frame.itertuples(index=False), strict=True)
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


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


def id_scale_lines(sweep: Path) -> list[str]:
    """The two sentences of experiment 2 on which scale the papers' TwoNN reads
    (`report_id.scale_lines`), from the sweep's tables."""
    runs = find_runs(sweep)
    tables = {m: [read_table(r.path) for r in runs[m]] for m in MASKINGS}
    batch = run_facts({m: runs[m] for m in MASKINGS})["causal"].get("state_batch")
    return scale_lines(tables, batch)


def drift_cosine_lines(sweep: Path) -> list[str]:
    """The paragraph and table of `drift_cosine` for Godey's section of the report."""
    corr = drift_cosine(sweep)
    if corr.empty:
        return ["Drift norm against mean cosine: not measured (no `drift_norm` rows)."]
    return [
        "Drift norm ‖x̄‖ against mean cosine across blocks 1..L at the last probe "
        "(Godey et al. 2024, §3.3, Fig. 5: Spearman; appendix A, Fig. 16: Pearson), the mean "
        "over seeds and how many seeds reach p < 0.05. One point per block: Spearman's p is "
        "exact over all orderings of up to 8 blocks "
        "(`repgeom.probes.report.drift_cosine.spearman_p`), and "
        "with 4 blocks it is at least 2/24 = 0.083 even at rho = 1, so only Pearson's test can "
        "reach p < 0.05 here.",
        "",
        markdown_table(corr),
    ]


FAMILIES = {"profile": "experiment 1", "id": "experiment 2", "attention": "experiment 3"}
"""Holm's families: one per experiment, i.e. the claims of one paper's experiment (anisotropy
profiles, Razzhigaev et al. 2023; intrinsic dimension over training, the same paper; attention,
Godey et al. 2024), each read as one conclusion whose chance of holding a false "agrees" is at most
`statistics.ALPHA`. The shuffled-text control, a claim of another paper on other runs, is its own
family (`report_shuffled`)."""


def sweep_findings(sweep: Path) -> tuple[dict[str, list[Finding]], dict, dict]:
    """The verdicts of experiments 1-3 from a sweep folder of ``<masking>-seed<k>`` runs, without
    the figures.

    Returns
    -------
    findings : dict
        ``profile``, ``id`` and ``attention``: the `Finding` of each check, their p's adjusted
        by Holm within each experiment (`FAMILIES`, `report_findings.adjust`).
    facts : dict
        Per masking, what `run_facts` read from the configs.
    tables : dict
        Per masking, the probe table of each seed.

    Raises
    ------
    ValueError
        When the seeds of a masking were probed at different steps.
    """
    runs = find_runs(sweep)
    tables = {m: [read_table(r.path) for r in runs[m]] for m in MASKINGS}
    names = {m: [r.path.name for r in runs[m]] for m in MASKINGS}
    seeds.check_steps(tables, names)
    facts = run_facts({m: runs[m] for m in MASKINGS})
    n = {m: len(tables[m]) for m in MASKINGS}
    threshold = facts["causal"]["near_duplicate_threshold"]
    findings = {
        "profile": profile_findings(tables, n),
        "id": id_findings(tables, names, threshold, facts["causal"].get("state_batch")),
        "attention": attention_findings(tables, n),
    }
    for key, group in findings.items():
        adjust(group, FAMILIES[key])
    return findings, facts, tables


def shape_of_learning(
    sweep: Path, figures: Path
) -> tuple[list[str], dict[str, list[Finding]], dict]:
    """Experiments 1-3 from a sweep folder (see the module doc): `sweep_findings` and the figures.

    Returns
    -------
    images : list of str
        The figures written under `figures`.
    findings, facts : dict
        As `sweep_findings`.
    """
    findings, facts, tables = sweep_findings(sweep)
    images = []
    images.append(save_figure(bands.profile_bands(tables, "anisotropy"),
                        figures / "anisotropy_profiles.png"))
    for m in MASKINGS:
        images.append(save_figure(bands.per_layer_vs_step_bands(tables[m], "anisotropy"),
                            figures / f"anisotropy_vs_step_{m}.png"))
    for metric in ("twonn", "gride_k16"):
        if all(metric in set(t["metric"]) for ts in tables.values() for t in ts):
            images.append(save_figure(bands.metric_vs_step_bands(tables, metric),
                                figures / f"{metric}_vs_step.png"))
    for m in MASKINGS:
        images.append(save_figure(bands.per_layer_vs_step_bands(tables[m], "attention_entropy"),
                            figures / f"attention_entropy_{m}.png"))
        images.append(save_figure(bands.per_layer_vs_step_bands(tables[m], "qk_cosine"),
                            figures / f"qk_cosine_{m}.png"))
    return images, findings, facts


def setup_lines(facts: dict, tested: dict[str, int] | None = None) -> list[str]:
    """The paragraph that states the seeds, the vocabulary, the probe protocol and the statistics
    of experiments 1-3, every number read from `facts` (`run_facts`); `tested`: per Holm family
    (`FAMILIES`), how many checks its correction runs over."""
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
        *statistics_lines(tested),
    ]


def statistics_lines(tested: dict[str, int] | None = None) -> list[str]:
    """The report's statistics paragraph: each test, its reference, why it was chosen, Holm's
    families (with `tested`, how many checks each holds) and the labels."""
    a = st.ALPHA
    sizes = ""
    if tested:
        sizes = " (" + ", ".join(f"{name}: {k}" for name, k in tested.items()) + " tested here)"
    return [
        "Statistics. The seed is the unit: every check reduces a run to one number (a "
        "difference between two steps or two blocks), shown as mean [95% interval over seeds], "
        "mean ± t_{0.975, n−1} · s/√n. A difference between two steps is paired, per seed, over "
        "the blocks read at both steps in every seed, and each check says how many of its "
        "readings are NaN; an end of a check (its first or last step) that no block is read at "
        "in every seed makes it **not measured**: the end is never moved to a later step. The "
        "tests, all one-sided:",
        "",
        "- *one difference:* Student's t test over seeds (Student 1908, *Biometrika* 6:1; one "
        "sample, n − 1 degrees of freedom); causal against bidirectional, Welch's t test over the "
        "two groups of seeds (Welch 1947, *Biometrika* 34:28); "
        "a share that sits on its bound (the near-duplicate check), the exact sign test (Dixon "
        "and Mood 1946, *JASA* 41:557), whose smallest p with n runs is 2^−n;",
        "- *a claim made of several parts* (every block grows; first block aligned and last "
        "block opposed; a peak above both ends): the intersection-union test (Berger 1982, "
        "*Technometrics* 24:295): the claim's p is the largest part's p;",
        "- *a peak chosen on the data* (rises then falls; the bell-shaped profile): \"some "
        "candidate is above both ends\" is a union over the K candidates of intersections. The "
        "peak is the candidate most above both ends (the largest smaller-of-the-two mean "
        "contrasts), and its intersection-union p of the two t tests times K is the verdict's p "
        "(Bonferroni over the candidates). Under the null every candidate has a contrast whose "
        "mean is at most 0, so the bound holds whatever rule chose the peak and whatever the "
        "candidates' correlation, wherever each t test holds its level: the t tests assume "
        "near-normal seed contrasts, and with a skewed one (a seed in five far above the "
        "others) the level is not held (benchmarks/README.md); the intervals printed at the "
        "chosen peak are the uncorrected ones, and lower bounds that hold together over the K "
        "candidates are given beside them. "
        "Why this test: a sign-flip (permutation) max-T of Westfall and Young (1993, "
        "*Resampling-Based Multiple Testing*) over both contrasts at every candidate is exact but "
        "its smallest p with n seeds is 2^−n (1/32 with 5), which no Holm correction over a "
        "family lets reach 0.05, so it could not say yes with the seeds run; the sign flip of "
        "the largest smaller-of-two t is invalid (a size of 27-33% in the review of issue 49); "
        "a multivariate-t max-T (Hothorn, Bretz and Westfall 2008, *Biom. J.* 50:346) would "
        "need the 2K contrasts' correlation, estimated from n seeds with rank n − 1 (4 with 5 "
        "seeds, for 28 columns), so its level rests on a plug-in that the seeds cannot check; "
        "Bonferroni gives up little where the stored effects lie (benchmarks/README.md, "
        "\"The report's tests under their null and at the stored effect sizes\": at most "
        "a few percent false agrees on every null curve, and the stored TwoNN effect found in "
        f"nearly every 5-seed draw). From {st.SIGN_FLIP_FROM} seeds the sign-flip max-T is "
        "printed beside the verdict as a check;",
        "- *Holm's families:* Holm's step-down correction (Holm 1979, *Scand. J. Statist.* "
        "6:65) runs within one family per experiment: the claims of one paper's experiment "
        "(1: anisotropy profiles; 2: intrinsic dimension over training; 3: attention; the "
        "shuffled-text control, on other runs, its own), so that each experiment's conclusion "
        f"holds a false \"agrees\" with probability at most {a}, and adding a check to one "
        f"experiment does not change another's verdicts{sizes}. Every verdict names its family. "
        "The report as a whole is not corrected: with 4 families (3 experiments and the "
        "shuffled-text control) the chance of a false \"agrees\" anywhere in it can reach "
        f"about 4 × {a:.0%} = {4 * a:.0%}.",
        "",
        "Each check shows `p = ..., adjusted p = ...` (Holm, within its family). Labels: "
        f"**agrees** (adjusted p ≤ "
        f"{a}), **not shown** (adjusted p > {a}), **not testable** (fewer than "
        f"{st.MIN_SEEDS} seeds, a single run with no test, or, in the shuffled-text control, "
        "no probe run whose largest block is inside its profile), **not measured** (an end of the "
        "check not read). \"The sign holds in k of n seeds\" counts the seeds whose own number "
        "has the claimed sign, and the probe's batch noise, where shown, is information: neither "
        "decides a verdict. With no spread over seeds the t statistic is infinite, and p is 0 "
        "when the mean has the claimed sign (1 otherwise). Profiles and verdicts use blocks "
        "1..L; the final norm's output is shown in the figures as an open marker and reported "
        "as its own number, never as a block.",
    ]


def distributions(run: Path, figures: Path) -> tuple[list[str], pd.DataFrame]:
    """Experiment 5: best-fitting family and number of modes per layer, from a probe.py run."""
    frame = read_table(run)
    # the layers only: the whole model's rows (the LM loss) have no distribution
    frame = layer_rows(frame[frame["step"] == frame["step"].max()])

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
    images = [save_figure(plots.layer_profile(frame, "kurtosis"), figures / "kurtosis_profile.png")]
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
        f"AIC-best per block {dict(blocks.items())}; normal best in blocks {normal or 'none'} "
        f"({'so the claim holds in this run' if not normal else 'against the claim'})",
        n_seeds=1, unit="run", seeds_holding=int(not normal),
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
