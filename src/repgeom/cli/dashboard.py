"""``repgeom-dashboard``: create the repgeom W&B dashboard (a saved workspace view;
`repgeom.dashboard`).

    repgeom-dashboard entity=<you or your team> project=repgeom
    repgeom-dashboard entity=me project=repgeom dry_run=dashboard.json   # offline, saves nothing
    repgeom-dashboard --entity me --project repgeom --dry-run             # repgeom-dashboard.json
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from omegaconf import MISSING

from repgeom.cli.command import console, run_command

DRY_RUN_FILE = "repgeom-dashboard.json"


@dataclass
class DashboardConfig:
    entity: str = MISSING
    """W&B entity (user or team)."""
    project: str = MISSING
    """W&B project of the runs (repgeom)."""
    name: str = "repgeom"
    """The saved view's name."""
    dry_run: str | None = None
    """Write the specification to this file and save nothing (--dry-run alone:
    repgeom-dashboard.json)."""


def task(cfg: DashboardConfig) -> None:
    from repgeom.dashboard import build_workspace, write_specification

    if cfg.dry_run:
        spec = write_specification(cfg.entity, cfg.project, cfg.dry_run, name=cfg.name)
        n_panels = sum(len(s["panels"]) for s in spec["sections"])
        print(f"wrote {cfg.dry_run}: {len(spec['sections'])} sections, {n_panels} panels")
        return
    from repgeom.loggers import wandb_logged_in

    if not wandb_logged_in():
        print("saving the dashboard needs a W&B login (wandb login, or WANDB_API_KEY); "
              "dry_run=FILE (--dry-run) writes its specification without one", file=sys.stderr)
        raise SystemExit(2)
    workspace = build_workspace(cfg.entity, cfg.project, name=cfg.name).save()
    print(f"dashboard saved: {workspace.url}")


def main(argv: Sequence[str] | None = None) -> None:
    run_command("dashboard", DashboardConfig, task, argv, flag_values={"dry_run": DRY_RUN_FILE})


if __name__ == "__main__":
    raise SystemExit(console(main))
