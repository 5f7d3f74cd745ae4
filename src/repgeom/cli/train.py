"""``repgeom-train`` (``python train.py``): train a model, conf/train.yaml.

    repgeom-train model=gpt_small masking=causal
"""

from __future__ import annotations

from collections.abc import Sequence

from repgeom.cli.command import console
from repgeom.cli.yaml_config import run_yaml


def task(cfg):
    """Run the job; its imports are here, so that --help and --cfg load none of them."""
    from repgeom.train import train

    return train(cfg)


def main(argv: Sequence[str] | None = None) -> None:
    # Lightning before Hydra's logging: imported with no root handler, Lightning prints its
    # lines through its own handler only; imported after, each line came out twice (its own
    # handler's, and the root's in Hydra's format).
    import lightning.pytorch  # noqa: F401

    import repgeom.probes.core.spec  # noqa: F401  (stores the schema conf/probe/ extends: probe/base)

    run_yaml("train", task, argv)


if __name__ == "__main__":
    raise SystemExit(console(main))
