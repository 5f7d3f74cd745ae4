"""Regenerate `docs/results.md` and its figures from run folders: no number is typed by hand.

    python -m repgeom.experiments.report \\
        --shape-of-learning multirun/shape_of_learning/<stamp> \\
        --distributions outputs/probe/<date>/<time> \\
        --common-bias docs/results/common_bias \\
        --out docs

Each claim of the papers is turned into a check on the tables the runs wrote; the report states
the check, the numbers it read and whether our run agrees.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from repgeom.probes import plots
from repgeom.probes.table import head_means, layer_means, read_table

MASKINGS = ("causal", "bidirectional")


@dataclass
class Finding:
    """One claim, the check that tests it, what our run gave, and the verdict."""

    claim: str
    check: str
    observed: str
    agrees: bool

    def markdown(self) -> str:
        verdict = "**agrees**" if self.agrees else "**does not agree**"
        return (
            f"- *Claim:* {self.claim}\n  *Check:* {self.check}\n"
            f"  *Ours:* {self.observed} → {verdict}"
        )


def _save(fig: Figure, path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, facecolor="white")
    return path.as_posix()


def _profile(frame: pd.DataFrame, metric: str, step: int) -> pd.Series:
    rows = head_means(frame[(frame["metric"] == metric) & (frame["step"] == step)])
    return rows.set_index("layer")["value"].sort_index()


def _fmt(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:.3f}" for v in values) + "]"


def _markdown_table(frame: pd.DataFrame) -> str:
    """A DataFrame as a GitHub markdown table (index first)."""
    header = [frame.index.name or "", *map(str, frame.columns)]
    rows = [
        [str(i), *(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row)]
        for i, row in zip(frame.index, frame.itertuples(index=False), strict=True)
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _run_facts(sweep: Path) -> dict:
    """Model, data and steps of the sweep's runs, read from Hydra's saved configs."""
    import yaml

    facts = {}
    for masking in MASKINGS:
        cfg = yaml.safe_load((sweep / masking / ".hydra" / "config.yaml").read_text())
        facts[masking] = {
            "model": cfg["model"]["name"],
            "layers": cfg["model"]["n_layer"],
            "width": cfg["model"]["n_embd"],
            "data": cfg["data"]["source"],
            "steps": cfg["trainer"]["max_steps"],
            "batch": cfg["data"]["batch_size"],
            "block": cfg["model"]["block_size"],
        }
    return facts


def shape_of_learning(
    sweep: Path, figures: Path
) -> tuple[list[str], dict[str, list[Finding]], dict]:
    """Experiments 1-3 from a sweep folder holding `causal/` and `bidirectional/` runs."""
    tables = {m: read_table(sweep / m) for m in MASKINGS}
    facts = _run_facts(sweep)
    images = []
    findings: dict[str, list[Finding]] = {"profile": [], "id": [], "attention": []}

    # 1. Decoder vs encoder anisotropy profile, and anisotropy growing with training.
    images.append(
        _save(
            plots.profiles_side_by_side(tables, "anisotropy"), figures / "anisotropy_profiles.png"
        )
    )
    for m in MASKINGS:
        images.append(
            _save(
                plots.per_layer_vs_step(tables[m], "anisotropy"),
                figures / f"anisotropy_vs_step_{m}.png",
            )
        )
    final = {m: _profile(t, "anisotropy", int(t["step"].max())) for m, t in tables.items()}
    first = {m: _profile(t, "anisotropy", int(t["step"].min())) for m, t in tables.items()}
    blocks = {m: p.loc[p.index >= 1] for m, p in final.items()}
    peak = blocks["causal"].idxmax()
    inner = 1 < peak < blocks["causal"].index.max()
    findings["profile"].append(
        Finding(
            "the decoder's anisotropy profile over layers is bell-shaped "
            "(highest in the middle layers)",
            "the most anisotropic block of the final causal profile is neither the first nor "
            "the last block",
            f"final causal profile (layer 0 = embedding) {_fmt(final['causal'])}, "
            f"peak at block {peak}",
            bool(inner),
        )
    )
    spread = {m: float(b.max() - b.min()) for m, b in blocks.items()}
    findings["profile"].append(
        Finding(
            "the encoder's profile is flatter than the decoder's",
            "max − min over blocks of the final profile is smaller for the bidirectional model",
            f"spread causal {spread['causal']:.3f}, bidirectional {spread['bidirectional']:.3f}; "
            f"final bidirectional profile {_fmt(final['bidirectional'])}",
            spread["bidirectional"] < spread["causal"],
        )
    )
    for m in MASKINGS:
        grew = (final[m] > first[m]).loc[final[m].index >= 1]
        findings["profile"].append(
            Finding(
                f"anisotropy grows during training ({m})",
                "every block's anisotropy is higher at the last probe than at step 0",
                f"{int(grew.sum())} of {len(grew)} blocks grew; "
                f"step 0 {_fmt(first[m])} → final {_fmt(final[m])}",
                bool(grew.all()),
            )
        )

    # 2. Intrinsic dimension over training: rises early, then falls.
    id_frames = {m: t.assign(run=m) for m, t in tables.items()}
    combined = pd.concat(id_frames.values(), ignore_index=True)
    for metric in ("twonn", "gride_k16"):
        if metric in set(combined["metric"]):
            images.append(
                _save(
                    plots.metric_vs_step(combined, metric, by="run"),
                    figures / f"{metric}_vs_step.png",
                )
            )
    for metric in ("twonn", "gride_k16"):
        for m in MASKINGS:
            means = layer_means(tables[m][tables[m]["metric"] == metric]).sort_values("step")
            if means.empty:
                continue
            values, steps = means["value"].to_numpy(), means["step"].to_numpy()
            top = int(np.argmax(values))
            rise_fall = (
                0 < top < len(values) - 1 and values[-1] < values[top] and values[top] > values[0]
            )
            findings["id"].append(
                Finding(
                    f"the mean intrinsic dimension ({metric}) rises early in training, "
                    f"then falls ({m})",
                    "the layer mean (blocks 1..L) peaks strictly inside the run, above both its "
                    "start and its end",
                    f"start {values[0]:.2f}, peak {values[top]:.2f} at step {steps[top]}, "
                    f"end {values[-1]:.2f} (step {steps[-1]})",
                    bool(rise_fall),
                )
            )
    share = combined[combined["metric"] == "near_duplicate_share"]
    if not share.empty:
        last = share[share["step"] == share.groupby("run")["step"].transform("max")]
        worst, early = last.loc[last["value"].idxmax()], share.loc[share["value"].idxmax()]
        findings["id"].append(
            Finding(
                "TwoNN reads the smallest scale, so a layer full of near-duplicates makes it "
                "meaningless (issue 3); the final curves should be free of them",
                "near-duplicate share at the last probe is below 5% in every layer of both runs",
                f"largest final share {worst['value']:.3f} ({worst['run']}, layer "
                f"{int(worst['layer'])}); largest over the whole run {early['value']:.3f} "
                f"({early['run']}, layer {int(early['layer'])}, step {int(early['step'])}): "
                "TwoNN there is flagged, GRIDE at order 16 reads past it",
                bool(worst["value"] < 0.05),
            )
        )

    # 3. Attention sharpening and Q/K alignment.
    for m in MASKINGS:
        images.append(
            _save(
                plots.per_layer_vs_step(tables[m], "attention_entropy"),
                figures / f"attention_entropy_{m}.png",
            )
        )
        images.append(
            _save(plots.per_head_vs_step(tables[m], "qk_cosine"), figures / f"qk_cosine_{m}.png")
        )
        t = tables[m]
        ent_first = _profile(t, "attention_entropy", int(t["step"].min()))
        ent_last = _profile(t, "attention_entropy", int(t["step"].max()))
        findings["attention"].append(
            Finding(
                f"attention entropy falls during training ({m})",
                "every block's head-mean entropy is lower at the last probe than at step 0",
                f"step 0 {_fmt(ent_first)} → final {_fmt(ent_last)} nats",
                bool((ent_last < ent_first).all()),
            )
        )
        findings["attention"].append(
            Finding(
                f"early layers attend more sharply than late ones ({m})",
                "final entropy of the first block is below that of the last block",
                f"first block {ent_last.iloc[0]:.3f}, last block {ent_last.iloc[-1]:.3f} nats",
                bool(ent_last.iloc[0] < ent_last.iloc[-1]),
            )
        )
        qk = _profile(t, "qk_cosine", int(t["step"].max()))
        findings["attention"].append(
            Finding(
                f"mean query and mean key align in early layers and oppose in late layers ({m})",
                "final head-mean cos(Q̄, K̄) is positive in the first block and negative in the last",
                f"final head-mean cos(Q̄, K̄) per block {_fmt(qk)}",
                bool(qk.iloc[0] > 0 and qk.iloc[-1] < 0),
            )
        )
    return images, findings, facts


def distributions(run: Path, figures: Path) -> tuple[list[str], pd.DataFrame]:
    """Experiment 5: best-fitting family and number of modes per layer, from a probe.py run."""
    frame = read_table(run)
    frame = frame[frame["step"] == frame["step"].max()]

    def best(prefix: str, largest: bool) -> pd.Series:
        rows = frame[frame["metric"].str.startswith(prefix)].sort_values("value", ascending=largest)
        return rows.groupby("layer").tail(1).set_index("layer")["metric"].str.removeprefix(prefix)

    per_layer = pd.DataFrame(
        {
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
    blocks = per_layer.loc[per_layer.index >= 1, "best by AIC"]
    normal = [int(layer) for layer, family in blocks.items() if family == "normal"]
    return Finding(
        "activations inside the network are not Gaussian: another family fits them better",
        "the normal law is not the AIC-best family in any block",
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


def render(args: argparse.Namespace) -> Path:
    out = Path(args.out)
    figures = out / "results" / "figures"
    lines = [
        "# Results",
        "",
        f"Generated by `python -m repgeom.experiments.report {shlex.join(args.argv)}` from the "
        "run folders named below; every number here was read from a file a command wrote.",
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
            f"{f['steps']} steps of {f['batch']}×{f['block']} characters, on CPU"
        )
        command = "python train.py -m experiment=shape_of_learning masking=causal,bidirectional"
        titles = {
            "profile": "1. Decoder vs encoder anisotropy profile (Razzhigaev et al. 2023)",
            "id": "2. Intrinsic dimension over training (Razzhigaev et al. 2023)",
            "attention": "3. Attention sharpening and Q/K drift (Godey et al. 2024, §5)",
        }
        for key, title in titles.items():
            lines += [
                f"## {title}",
                "",
                f"Command: `{command}` (run folder `{sweep.as_posix()}`).",
                f"Scale: {scale}.",
                "",
            ]
            lines += [finding.markdown() for finding in findings[key]] + [""]
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
    if args.notes:
        lines += ["## Scale and what it would take", "", Path(args.notes).read_text().strip(), ""]
    path = out / "results.md"
    path.write_text("\n".join(lines))
    return path


def main(argv: Sequence[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shape-of-learning", help="sweep folder with causal/ and bidirectional/ runs"
    )
    parser.add_argument("--distributions", help="probe.py run folder with distribution fits")
    parser.add_argument(
        "--distributions-command", default="python probe.py ckpt=<causal run>/checkpoints/last.ckpt"
    )
    parser.add_argument("--common-bias", help="folder with <model>/summary.json of experiment 4")
    parser.add_argument("--notes", help="a markdown file appended as the closing section")
    parser.add_argument("--out", default="docs")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    path = render(args)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
