"""``repgeom-survey``: one table and one figure per metric over many probe folders
(`repgeom.probes.report.survey`).

    repgeom-survey outputs/probe/a outputs/probe/b --out survey/ --metrics anisotropy
    repgeom-survey folders=[outputs/probe/a,outputs/probe/b] out=survey/ metrics=[anisotropy]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from repgeom.cli.command import console, run_command


@dataclass
class SurveyConfig:
    folders: list[str] = field(default_factory=list)
    """probe.py output folders, or a sweep folder that holds them (bare words too)."""
    out: str | None = None
    """Output folder (default: <FOLDER>/survey for one folder)."""
    metrics: list[str] | None = None
    """Metrics to draw (default: every layer-profile metric present)."""


def task(cfg: SurveyConfig) -> list[Path]:
    from repgeom.probes.report.survey import survey

    if not cfg.folders:
        raise ValueError("give the folders: repgeom-survey FOLDER [FOLDER ...]")
    return survey(list(cfg.folders), cfg.out,
                  metrics=None if cfg.metrics is None else list(cfg.metrics))


def main(argv: Sequence[str] | None = None) -> list[Path] | None:
    return run_command("survey", SurveyConfig, task, argv, positional=("folders",))


if __name__ == "__main__":
    raise SystemExit(console(main))
