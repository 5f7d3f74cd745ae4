"""``repgeom-report``: the results page, ``<out>/results.md`` (`repgeom.experiments.report`).

    repgeom-report shape_of_learning=<sweep> common_bias=<folder> distributions=<probe run> out=docs
    repgeom-report --shape-of-learning <sweep> --out docs        (the same words as before)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from repgeom.cli.command import console, run_command


@dataclass
class ReportConfig:
    shape_of_learning: str | None = None
    """Sweep folder with <masking>-seed<k>/ runs (probes/probes.parquet, .hydra/)."""
    distributions: str | None = None
    """probe.py run folder with distribution fits."""
    distributions_command: str = "python probe.py ckpt=<causal run>/checkpoints/last.ckpt"
    common_bias: str | None = None
    """Folder with <model>/summary.json of experiment 4."""
    shuffled_control: str | None = None
    """Folder with <masking>-seed<k>/{real,shuffled}/ probe runs of last checkpoints: the ID
    peak over layers on real against shuffled text (`repgeom.experiments.report_shuffled`)."""
    analyses: str | None = None
    """A hand-written markdown file (its own '## ' headings, links relative to out) placed after
    the generated sections: the analyses of docs/results/analyses."""
    notes: str | None = None
    """A markdown file appended as the closing section."""
    out: str = "docs"


def main(argv: Sequence[str] | None = None) -> Path | None:
    words = list(sys.argv[1:] if argv is None else argv)

    def task(cfg: ReportConfig) -> Path:
        from repgeom.experiments.report import render

        path = render(SimpleNamespace(**{k: cfg[k] for k in cfg}, argv=words))
        print(f"wrote {path}")
        return path

    return run_command("report", ReportConfig, task, words)


if __name__ == "__main__":
    raise SystemExit(console(main))
