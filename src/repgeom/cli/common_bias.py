"""``repgeom-common-bias``: experiment 4, an untrained block under a common bias,
conf/common_bias.yaml (`repgeom.experiments.common_bias`).

    repgeom-common-bias model=gpt_small
"""

from __future__ import annotations

from collections.abc import Sequence

from repgeom.cli.command import console
from repgeom.cli.yaml_config import run_yaml


def main(argv: Sequence[str] | None = None) -> None:
    from repgeom.experiments.common_bias import run

    run_yaml("common_bias", run, argv)


if __name__ == "__main__":
    raise SystemExit(console(main))
