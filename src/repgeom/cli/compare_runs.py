"""``repgeom-compare-runs``: layer profiles of several probed runs, side by side, in one PNG
(`repgeom.experiments.compare_runs`).

    repgeom-compare-runs outputs/causal outputs/bidirectional --metric anisotropy --out cmp.png
    repgeom-compare-runs runs=[outputs/causal,outputs/bidirectional] metric=anisotropy out=cmp.png
    repgeom-compare-runs <sweep>/*-seed* --group-by masking --out compare.png
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from repgeom.cli.command import console, run_command
from repgeom.probes.core.measure import ProbeSettings
from repgeom.probes.report.plots import DPI


@dataclass
class CompareRunsConfig:
    runs: list[str] = field(default_factory=list)
    """Run folders, their probes/ folders, or probes.parquet/.csv files (bare words too)."""
    metric: str = "anisotropy"
    out: str = "compare.png"
    """PNG to write."""
    labels: list[str] | None = None
    """One label per run (default: the run folders' names); runs that share a label are drawn
    as their mean with a 95% interval."""
    group_by: str | None = None
    """Label each run by this key of its .hydra/config.yaml ('masking' for masking.name, or a
    dotted path), grouping the runs that share it."""
    step: str = "last"
    """Probe step drawn in every panel, or 'last' for each run's own last."""
    dpi: int = DPI
    similarity: str | None = None
    """Instead of profiles: this similarity of the same layer of two runs, from their saved
    probe states (exactly two runs)."""
    batch_size: int = ProbeSettings.state_batch_size
    """similarity: states per batch."""
    seed: int = ProbeSettings.seed
    """similarity: seed of the batches."""


def task(cfg: CompareRunsConfig) -> Path:
    from repgeom.experiments.compare_runs import compare

    if not cfg.runs:
        raise ValueError("give the runs: repgeom-compare-runs RUN [RUN ...] (or runs=[a,b])")
    return compare(list(cfg.runs), cfg.out, metric=cfg.metric,
                   labels=None if cfg.labels is None else list(cfg.labels),
                   group_by=cfg.group_by, step=cfg.step, dpi=cfg.dpi,
                   similarity=cfg.similarity, batch_size=cfg.batch_size, seed=cfg.seed)


def main(argv: Sequence[str] | None = None) -> Path | None:
    return run_command("compare_runs", CompareRunsConfig, task, argv, positional=("runs",))


if __name__ == "__main__":
    raise SystemExit(console(main))
