"""The commands a user runs, declared in ``pyproject.toml`` (``[project.scripts]``).

Each wraps its module's ``main`` so the process exits 0 on success (a console script exits with
what the function returns). ``repgeom-train`` and ``repgeom-probe`` are ``train.py`` and
``probe.py`` for an installed package: the same Hydra configs (`repgeom.resources.conf_dir`), the
same ``key=value`` overrides; the other commands parse ``key=value`` words too
(`repgeom.analyses.cli`).
"""

from __future__ import annotations

import importlib

from repgeom.resources import conf_dir


def _hydra(function: str, config_name: str) -> None:
    import hydra

    module, name = function.rsplit(".", 1)
    task = getattr(importlib.import_module(module), name)
    hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name=config_name)(task)()


def _main(module: str) -> None:
    importlib.import_module(module).main()


def train() -> None:
    """``repgeom-train``: ``python train.py`` (conf/train.yaml)."""
    _hydra("repgeom.train.train", "train")


def probe() -> None:
    """``repgeom-probe``: ``python probe.py`` (conf/probe.yaml)."""
    _hydra("repgeom.analyses.probe_extras.probe", "probe")


COMMANDS = {
    "repgeom-common-bias": "repgeom.experiments.common_bias",
    "repgeom-report": "repgeom.experiments.report",
    "repgeom-compare-runs": "repgeom.experiments.compare_runs",
    "repgeom-survey": "repgeom.probes.survey",
    "repgeom-export-hf": "repgeom.models.export_hf",
    "repgeom-dashboard": "repgeom.dashboard",
    "repgeom-distinctiveness": "repgeom.analyses.distinctiveness",
    "repgeom-distributions": "repgeom.analyses.distributions",
    "repgeom-similarity": "repgeom.analyses.similarity",
    "repgeom-scores": "repgeom.analyses.scores",
    "repgeom-qk-projection": "repgeom.analyses.qk_projection",
    "repgeom-example-data": "repgeom.analyses.example_data",
}
"""Command name -> the module whose ``main()`` it runs (``python -m <module>`` does the same)."""


def common_bias() -> None:
    _main(COMMANDS["repgeom-common-bias"])


def report() -> None:
    _main(COMMANDS["repgeom-report"])


def compare_runs() -> None:
    _main(COMMANDS["repgeom-compare-runs"])


def survey() -> None:
    _main(COMMANDS["repgeom-survey"])


def export_hf() -> None:
    _main(COMMANDS["repgeom-export-hf"])


def dashboard() -> None:
    _main(COMMANDS["repgeom-dashboard"])


def distinctiveness() -> None:
    _main(COMMANDS["repgeom-distinctiveness"])


def distributions() -> None:
    _main(COMMANDS["repgeom-distributions"])


def similarity() -> None:
    _main(COMMANDS["repgeom-similarity"])


def scores() -> None:
    _main(COMMANDS["repgeom-scores"])


def qk_projection() -> None:
    _main(COMMANDS["repgeom-qk-projection"])


def example_data() -> None:
    _main(COMMANDS["repgeom-example-data"])
