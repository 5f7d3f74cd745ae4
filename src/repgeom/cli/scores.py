"""``repgeom-scores``: attention scores of a model on real text, per block
(`repgeom.analyses.scores`).

    repgeom-scores hf=<name or folder> csv=<file with a text column> out=<dir>
    repgeom-scores ckpt=<file.ckpt> "text=some text" "text=another" out=<dir>
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from omegaconf import MISSING

from repgeom.analyses.scores import MAX_SCORES
from repgeom.cli.command import console, run_command
from repgeom.cli.model_options import ModelOptions, subject_of


@dataclass
class ScoresConfig(ModelOptions):
    text: list[str] = field(default_factory=list)
    """Texts (text=... may be repeated)."""
    csv: str | None = None
    """CSV whose 'text' column holds the texts."""
    max_scores: int = MAX_SCORES
    """Scores kept per layer for the quantiles and histograms."""
    seed: int = 0
    """Seed of the subset of scores kept."""
    out: str = MISSING
    """Output folder."""


def task(cfg: ScoresConfig):
    from repgeom.analyses.scores import read_texts, write

    texts = [str(t) for t in cfg.text]
    if cfg.csv is not None:
        texts += read_texts(cfg.csv)
    if not texts:
        raise ValueError("give text=... and/or csv=<file with a text column>")
    return write(subject_of(cfg), texts, cfg.out, max_scores=cfg.max_scores, seed=cfg.seed)


def main(argv: Sequence[str] | None = None):
    return run_command("scores", ScoresConfig, task, argv)


if __name__ == "__main__":
    raise SystemExit(console(main))
