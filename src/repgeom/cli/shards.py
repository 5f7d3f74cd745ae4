"""``repgeom-shards``: merge a sweep's shard jobs by hand (`repgeom.probes.run.shards`); a sweep
merges itself when its last job ends, this is for one that was cut short.

    repgeom-shards <sweep dir> [--out DIR]
    repgeom-shards sweep=<sweep dir> [out=DIR]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from omegaconf import MISSING

from repgeom.cli.command import console, run_command


@dataclass
class ShardsConfig:
    sweep: str = MISSING
    """The sweep folder (its jobs are 0/, 1/, ...)."""
    out: str | None = None
    """Output folder (default: <sweep>/merged, one trajectory only)."""


def task(cfg: ShardsConfig):
    from repgeom.probes.run.shards import merge_sweep

    return merge_sweep(cfg.sweep, cfg.out)


def main(argv: Sequence[str] | None = None):
    return run_command("shards", ShardsConfig, task, argv, positional=("sweep",))


if __name__ == "__main__":
    raise SystemExit(console(main))
