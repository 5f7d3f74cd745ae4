"""``repgeom-similarity``: token x token cosine of one text, pooled similarity of text pairs
(`repgeom.analyses.similarity`).

    repgeom-similarity hf=gpt2 "text=Cooking mushrooms in a pot is hard." out=<dir>
    repgeom-similarity ckpt=<file.ckpt> pairs=<csv with text_a,text_b> out=<dir>
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from omegaconf import MISSING

from repgeom.cli.command import console, run_command
from repgeom.cli.model_options import ModelOptions, subject_of


@dataclass
class SimilarityConfig(ModelOptions):
    text: str | None = None
    """One text for the token x token cosine."""
    pairs: str | None = None
    """CSV with columns text_a,text_b."""
    out: str = MISSING
    """Output folder."""


def task(cfg: SimilarityConfig):
    from repgeom.analyses.similarity import write

    if cfg.text is None and cfg.pairs is None:
        raise ValueError("give text=... and/or pairs=<csv>")
    return write(subject_of(cfg), cfg.out, text=cfg.text, pairs=cfg.pairs)


def main(argv: Sequence[str] | None = None):
    return run_command("similarity", SimilarityConfig, task, argv)


if __name__ == "__main__":
    raise SystemExit(console(main))
