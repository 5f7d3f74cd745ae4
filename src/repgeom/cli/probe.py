"""``repgeom-probe`` (``python probe.py``): probe checkpoints, runs and Hugging Face models,
conf/probe.yaml. It imports no training code (``tests/test_architecture.py``).

    repgeom-probe hf=gpt2
"""

from __future__ import annotations

from collections.abc import Sequence

from repgeom.cli.command import console
from repgeom.cli.yaml_config import run_yaml


def main(argv: Sequence[str] | None = None) -> None:
    from repgeom.analyses.probe_extras import probe

    run_yaml("probe", probe, argv)


if __name__ == "__main__":
    raise SystemExit(console(main))
