"""``repgeom-distinctiveness``: how distinct subjects and attributes are, layer by layer
(`repgeom.analyses.distinctiveness`).

    repgeom-distinctiveness hf=<name or folder> csv=<file> out=<dir> [pooling=last] [pca=0]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from repgeom.cli.command import console, run_command
from repgeom.cli.model_options import TextTableOptions, subject_of


@dataclass
class DistinctivenessConfig(TextTableOptions):
    subject: str = "subject"
    attribute: str = "attribute"
    pooling: str = "mean"
    """mean or last."""
    pca: float = 0.9
    """Variance share kept; 0 = no PCA."""


def task(cfg: DistinctivenessConfig):
    import pandas as pd

    from repgeom.analyses.distinctiveness import run

    if cfg.pooling not in ("mean", "last"):
        raise ValueError(f"pooling: expected mean or last, got {cfg.pooling!r}")
    return run(subject_of(cfg), pd.read_csv(cfg.csv), cfg.out, subject_col=cfg.subject,
               attribute_col=cfg.attribute, text_col=cfg.text, pooling=cfg.pooling,
               pca_variance=cfg.pca or None)


def main(argv: Sequence[str] | None = None):
    return run_command("distinctiveness", DistinctivenessConfig, task, argv)


if __name__ == "__main__":
    raise SystemExit(console(main))
