"""``repgeom-common-bias``: experiment 4, an untrained block under a common bias,
conf/common_bias.yaml (`repgeom.experiments.common_bias`).

    repgeom-common-bias model=gpt_small
"""

from __future__ import annotations

from collections.abc import Sequence

from repgeom.cli.command import console
from repgeom.cli.yaml_config import run_yaml


def task(cfg):
    """Run the job; its imports are here, so that --help and --cfg load none of them."""
    from repgeom.experiments.common_bias import run

    return run(cfg)


def main(argv: Sequence[str] | None = None) -> None:
    run_yaml("common_bias", task, argv)


if __name__ == "__main__":
    raise SystemExit(console(main))
