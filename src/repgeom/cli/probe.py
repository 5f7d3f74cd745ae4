"""``repgeom-probe`` (``python probe.py``): probe checkpoints, runs and Hugging Face models,
conf/probe.yaml. It imports no training code (``tests/test_architecture.py``).

    repgeom-probe hf=gpt2
"""

from __future__ import annotations

from collections.abc import Sequence

from repgeom.cli.command import console
from repgeom.cli.yaml_config import run_yaml


def task(cfg):
    """Read and check the job (`repgeom.probes.run.job.probe_job`), then run it; the imports are
    here, so that --help and --cfg load none of them."""
    from repgeom.analyses.probe_extras import probe
    from repgeom.probes.run.job import probe_job

    return probe(probe_job(cfg))


def main(argv: Sequence[str] | None = None) -> None:
    run_yaml("probe", task, argv)


if __name__ == "__main__":
    raise SystemExit(console(main))
