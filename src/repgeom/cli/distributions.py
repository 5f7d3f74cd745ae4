"""``repgeom-distributions``: which distribution fits the hidden-state values of each layer
(`repgeom.analyses.distributions`).

    repgeom-distributions hf=<name or folder> csv=<file> out=<dir> [group_by=subject,attribute]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from repgeom.cli.command import console, run_command
from repgeom.cli.model_options import TextTableOptions, subject_of
from repgeom.metrics.distributions import FIT_SAMPLES, MODE_SAMPLES


@dataclass
class DistributionsConfig(TextTableOptions):
    group_by: str = ""
    """Comma-separated label columns."""
    n_samples: int = FIT_SAMPLES
    """Values per fit (subsample)."""
    mode_samples: int = MODE_SAMPLES
    """Values per KDE (subsample)."""
    criterion: str = "loglik"
    """Which winner the figures show, loglik or aic (both are in the tables)."""
    seed: int = 0
    figures: bool = True
    """figures=false (or --no-figures) writes the tables only."""


def task(cfg: DistributionsConfig):
    import pandas as pd

    from repgeom.analyses.distributions import run

    if cfg.criterion not in ("loglik", "aic"):
        raise ValueError(f"criterion: expected loglik or aic, got {cfg.criterion!r}")
    group_by = [c for c in cfg.group_by.split(",") if c]
    return run(subject_of(cfg), pd.read_csv(cfg.csv), cfg.out, group_by=group_by,
               text_col=cfg.text, n_samples=cfg.n_samples, seed=cfg.seed,
               criterion=cfg.criterion, mode_samples=cfg.mode_samples, figures=cfg.figures)


def main(argv: Sequence[str] | None = None):
    return run_command("distributions", DistributionsConfig, task, argv)


if __name__ == "__main__":
    raise SystemExit(console(main))
