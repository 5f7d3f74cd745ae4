"""``repgeom-train`` (``python train.py``): train a model, conf/train.yaml.

    repgeom-train model=gpt_small masking=causal
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from repgeom.cli.command import console
from repgeom.cli.yaml_config import run_yaml


def task(cfg):
    """Run the job; its imports are here, so that --help and --cfg load none of them."""
    from repgeom.train import train

    return train(cfg)


_PRINT_ONLY = {"--help", "-h", "--hydra-help", "--version", "--cfg", "-c", "--info", "-i",
               "--shell-completion", "-sc"}
"""Hydra flags that print and exit without running the job: no Lightning line to format."""


def main(argv: Sequence[str] | None = None) -> None:
    words = sys.argv[1:] if argv is None else list(argv)
    if not _PRINT_ONLY.intersection(w.split("=", 1)[0] for w in words):
        # Lightning before Hydra's logging: imported with no root handler, Lightning prints its
        # lines through its own handler only; imported after, each line came out twice (its
        # own handler's, and the root's in Hydra's format). --help skips it (~10 s cold).
        import lightning.pytorch  # noqa: F401

    import repgeom.probes.core.spec  # noqa: F401  (stores the schema conf/probe/ extends: probe/base)

    run_yaml("train", task, argv)


if __name__ == "__main__":
    raise SystemExit(console(main))
