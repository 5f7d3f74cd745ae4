"""``repgeom-train`` (``python train.py``): train a model, conf/train.yaml.

    repgeom-train model=gpt_small masking=causal
"""

from __future__ import annotations

from collections.abc import Sequence

from repgeom.cli.command import console
from repgeom.cli.yaml_config import run_yaml


def main(argv: Sequence[str] | None = None) -> None:
    from repgeom.train import train

    run_yaml("train", train, argv)


if __name__ == "__main__":
    raise SystemExit(console(main))
