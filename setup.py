"""Ship the root `conf/` folder inside the wheel as `repgeom/conf` (everything else: pyproject).

The Hydra configs stay at the project root, where `train.py`, `probe.py`, the tests and the
benchmarks read them and where a user edits them; a built package (`pip install .`) carries a
copy as package data so that installed code finds them too (`repgeom.resources.conf_dir`). An
editable install reads the root folder directly.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithConf(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # editable: repgeom.resources reads <root>/conf itself
            return
        target = Path(self.build_lib) / "repgeom" / "conf"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(ROOT / "conf", target, ignore=shutil.ignore_patterns("__pycache__"))


setup(cmdclass={"build_py": BuildPyWithConf})
