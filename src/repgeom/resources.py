"""Files the package needs at run time, found the same way in a checkout and in an install.

- The bundled enwik8 sample is package data of `repgeom.data` (`repgeom.data.enwik8.SAMPLE_PATH`).
- The Hydra configs live in the project's root `conf/` folder; a built wheel carries a copy as
  ``repgeom/conf`` (`setup.py`). `conf_dir` returns the copy when there is one (an installed
  package), else the checkout's folder (an editable install or `PYTHONPATH=src`).
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def conf_dir() -> Path:
    """The folder of the Hydra configs (``train.yaml``, ``probe.yaml``, the config groups).

    Raises
    ------
    FileNotFoundError
        If neither the installed copy nor a checkout's ``conf/`` exists.
    """
    candidates = (_PACKAGE / "conf", _PACKAGE.parents[1] / "conf")
    for folder in candidates:
        if (folder / "train.yaml").is_file():
            return folder
    looked = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(f"no Hydra config folder (train.yaml) found; looked in {looked}")
