"""``repgeom-example-data``: write the example sentences (subject x attribute x template) to a
CSV (`repgeom.analyses.example_data`).

    repgeom-example-data out=data/examples/subject_attribute.csv
    repgeom-example-data data/examples/subject_attribute.csv       (the same)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from omegaconf import MISSING

from repgeom.cli.command import console, run_command


@dataclass
class ExampleDataConfig:
    out: str = MISSING
    """The CSV file to write."""


def task(cfg: ExampleDataConfig) -> None:
    from repgeom.analyses.example_data import make_examples

    make_examples().to_csv(cfg.out, index=False)


def main(argv: Sequence[str] | None = None) -> None:
    return run_command("example_data", ExampleDataConfig, task, argv, positional=("out",))


if __name__ == "__main__":
    raise SystemExit(console(main))
