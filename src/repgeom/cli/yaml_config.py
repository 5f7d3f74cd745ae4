"""The commands with YAML configs under ``conf/`` (train, probe, common_bias): ``hydra.main``
on the task, the config found the same way in a checkout and an install (`conf_dir`)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from repgeom.cli.command import with_defaults
from repgeom.resources import conf_dir

__all__ = ["run_yaml"]


def run_yaml(config_name: str, task: Callable[[Any], Any],
             argv: Sequence[str] | None = None) -> None:
    """``hydra.main`` of `task` on ``conf/<config_name>.yaml`` with the overrides `argv`
    (default: ``sys.argv``); the job is named `config_name` (``${hydra:job.name}``)."""
    import hydra

    saved = sys.argv
    words = saved[1:] if argv is None else list(argv)
    # The job's name is the config's, not that of the file calling hydra.main (this one).
    sys.argv = [saved[0], *with_defaults(words, [f"hydra.job.name={config_name}"])]
    try:
        hydra.main(version_base="1.3", config_path=str(conf_dir()),
                   config_name=config_name)(task)()
    finally:
        sys.argv = saved
