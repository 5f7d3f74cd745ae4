"""``repgeom-qk-projection``: queries and keys of a training run's trajectory in one SVD basis
(`repgeom.analyses.qk_projection`).

    repgeom-qk-projection run=<train.py run folder> out=<dir> [layer=1,2] [head=0]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from omegaconf import MISSING

from repgeom.analyses.qk_projection import BASES, DEFAULT_POINTS
from repgeom.cli.command import console, run_command


@dataclass
class QKProjectionConfig:
    run: str = MISSING
    """A train.py run folder (<run>/checkpoints)."""
    out: str = MISSING
    """Output folder."""
    layer: str | None = None
    """Blocks from 1, comma-separated (default: all)."""
    head: str | None = None
    """Heads from 0, comma-separated (default: all)."""
    basis: str = "union"
    """Fit the SVD on queries and keys (union), or on one kind (appendix C)."""
    windows: int | None = None
    """Whole probe windows (default: the training probe's attention_windows)."""
    points: int = DEFAULT_POINTS
    """Tokens per step drawn and written."""
    seed: int = 0
    """Which tokens are drawn."""
    device: str = "auto"
    """auto (CUDA when available), cpu, cuda."""


def task(cfg: QKProjectionConfig):
    from repgeom.analyses.qk_projection import int_list, write

    if cfg.basis not in BASES:
        raise ValueError(f"basis: expected one of {list(BASES)}, got {cfg.basis!r}")
    layers = None if cfg.layer is None else int_list(cfg.layer)
    heads = None if cfg.head is None else int_list(cfg.head)
    tables, _ = write(cfg.run, cfg.out, layers=layers, heads=heads, basis=cfg.basis,
                      windows=cfg.windows, points=cfg.points, seed=cfg.seed, device=cfg.device)
    return tables


def main(argv: Sequence[str] | None = None):
    return run_command("qk_projection", QKProjectionConfig, task, argv)


if __name__ == "__main__":
    raise SystemExit(console(main))
