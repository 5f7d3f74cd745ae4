"""The console scripts of ``pyproject.toml`` (``[project.scripts]``): one function per command,
running ``main()`` of its module in `repgeom.cli` and exiting 0 (a console script exits with
what its function returns, and ``main`` returns the command's result)."""

from __future__ import annotations

import importlib

SCRIPTS = {
    "repgeom-train": "train",
    "repgeom-probe": "probe",
    "repgeom-common-bias": "common_bias",
    "repgeom-report": "report",
    "repgeom-compare-runs": "compare_runs",
    "repgeom-survey": "survey",
    "repgeom-shards": "shards",
    "repgeom-export-hf": "export_hf",
    "repgeom-dashboard": "dashboard",
    "repgeom-distinctiveness": "distinctiveness",
    "repgeom-distributions": "distributions",
    "repgeom-similarity": "similarity",
    "repgeom-scores": "scores",
    "repgeom-qk-projection": "qk_projection",
    "repgeom-example-data": "example_data",
}
"""Console script -> its module in `repgeom.cli` (and the function below that runs it)."""


def _script(module: str):
    def run() -> int:
        from repgeom.cli.command import console

        return console(importlib.import_module(f"repgeom.cli.{module}").main)

    run.__name__ = module
    run.__doc__ = f"The console script of `repgeom.cli.{module}`."
    return run


train = _script("train")
probe = _script("probe")
common_bias = _script("common_bias")
report = _script("report")
compare_runs = _script("compare_runs")
survey = _script("survey")
shards = _script("shards")
export_hf = _script("export_hf")
dashboard = _script("dashboard")
distinctiveness = _script("distinctiveness")
distributions = _script("distributions")
similarity = _script("similarity")
scores = _script("scores")
qk_projection = _script("qk_projection")
example_data = _script("example_data")
