"""A quiet console: silence the library lines a user would have to learn to ignore.

Each filter below drops exactly one known message, at its source, and says why it is noise;
everything else (the progress bar, the probe summary, warnings that matter, the final line
that says where everything is) is left alone. `quiet_console` is idempotent: `train` and
`probe` call it before they import or start anything that prints.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any

LIGHTNING_TIP_PREFIX = "\N{ELECTRIC LIGHT BULB} Tip:"
"""Lightning's advertising lines (litlogger, litmodels): `logger_connector.py` and
`callback_connector.py` log them through `rank_zero_info` at every `Trainer` set-up."""

DEVICE_INFO_PREFIXES = ("GPU available:", "TPU available:")
"""Lightning's `_log_device_info` (trainer/setup.py) lines at every `Trainer` set-up: on a CPU
run they say twice what is not there ("GPU available: False, used: False"). The device a run
uses is said once in our own line (train.py, the effective batch size)."""

OWN_SUMMARY_NOTICE = "Trainer already configured with model summary callbacks"
"""Lightning's notice (callback_connector.py) that it keeps a `ModelSummary` callback it was
given instead of adding its own: ours (`repgeom.callbacks.model_summary`,
conf/callbacks/default.yaml)."""

PYTREE_DEPRECATION = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
"""torch 2.13 deprecates `LeafSpec()`; lightning/pytorch/utilities/_pytree.py still builds one
(a FutureWarning on every fit, nothing a user can act on)."""

SRUN_HINT = r"The `srun` command is available on your system but is not used"
"""Lightning's hint (fabric/plugins/environments/slurm.py, `_validate_srun_used`), given on every
`Trainer` set-up wherever SLURM's `srun` is installed (a cluster's login node, our CI): outside a
SLURM job it is noise (a run there is one process, and our SLURM runs go through `srun`:
submitit's job script). Inside a job (``SLURM_JOB_ID`` set) it is kept, where it warns of a
multi-process run started without `srun`, which would hang."""

_RANK_ZERO_LOGGERS = (
    "lightning.fabric.utilities.rank_zero",
    "lightning.pytorch.utilities.rank_zero",
    "lightning_utilities.core.rank_zero",
)


_PACKAGE = Path(__file__).resolve().parent


class _DropPrefix(logging.Filter):
    """Drop log records whose message starts with one of `prefixes`."""

    def __init__(self, *prefixes: str) -> None:
        super().__init__(f"drop:{prefixes}")
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.prefixes)


def format_warning(message, category, filename, lineno, line=None) -> str:
    """One line per warning, without the source line Python prints under it.

    Python's default (`warnings.formatwarning`) adds the line of code that warned, e.g.
    ``self.probes = probe_set(`` under the probe's sample-size warning: nothing a researcher
    acts on. Ours read ``UserWarning: <message>``; a library's keeps its file and line, so it
    can still be traced.
    """
    where = "" if Path(filename).resolve().is_relative_to(_PACKAGE) else f" ({filename}:{lineno})"
    return f"{category.__name__}: {message}{where}\n"


HTTP_CLIENT_LOGGERS = ("httpx", "httpx2", "httpcore", "urllib3")
"""Loggers of the HTTP clients huggingface_hub uses, quieted to warnings."""


def quiet_console() -> None:
    """Install the filters; safe to call any number of times.

    - ``faiss.loader``: on import FAISS tries its AVX512 and AVX2 modules and logs at INFO that
      they "could not load" before loading the generic one, which dispatches to the CPU's
      instructions at run time (faiss >= 1.9 wheels): three alarming lines for a normal start.
      Its warnings and errors still show.
    - Lightning's "Tip:" lines (`LIGHTNING_TIP_PREFIX`), its GPU/TPU availability lines
      (`DEVICE_INFO_PREFIXES`) and its notice that it keeps our model summary
      (`OWN_SUMMARY_NOTICE`).
    - The pytree FutureWarning (`PYTREE_DEPRECATION`).
    - Lightning's `srun` hint outside a SLURM job (`SRUN_HINT`).
    - The HTTP clients' one line per request (``HTTP Request: GET ...``: `HTTP_CLIENT_LOGGERS`,
      at INFO, which Hydra's job logging prints); the waits of the hub's retry policy say why
      nothing moves instead (`repgeom.models.hub.calls`).
    - Warnings are printed on one line each, without their source line (`format_warning`).
    W&B's "anonymous setting" warning is avoided where the logger is built
    (`drop_unset_wandb_anonymous`), not filtered; its end-of-run block ("Run history", "Run
    summary") is turned off by ``settings: {quiet: true}`` in conf/logger/wandb.yaml. Lightning's
    model summary without its FLOPs column is `repgeom.callbacks.model_summary`.
    """
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    for client in HTTP_CLIENT_LOGGERS:  # one INFO line per request under Hydra's logging
        logging.getLogger(client).setLevel(logging.WARNING)
    for name in _RANK_ZERO_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropPrefix) for f in logger.filters):
            logger.addFilter(
                _DropPrefix(LIGHTNING_TIP_PREFIX, OWN_SUMMARY_NOTICE, *DEVICE_INFO_PREFIXES)
            )
    warnings.filterwarnings("ignore", message=PYTREE_DEPRECATION, category=FutureWarning)
    if "SLURM_JOB_ID" not in os.environ:
        warnings.filterwarnings("ignore", message=SRUN_HINT)
    warnings.formatwarning = format_warning


def drop_unset_wandb_anonymous(logger: Any) -> Any:
    """Remove ``anonymous=None`` from a Lightning `WandbLogger`'s `wandb.init` arguments.

    Lightning passes ``anonymous=None`` when the option is not set (loggers/wandb.py), and
    wandb >= 0.22 warns "The anonymous setting has no effect" for any value other than unset
    (`Settings.validate_anonymous`). Leaving the key out is what not setting it means.
    """
    init = getattr(logger, "_wandb_init", None)
    if isinstance(init, dict) and init.get("anonymous") is None:
        init.pop("anonymous", None)
    return logger


def first_line(error: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message (at most `limit` characters), or its type's name
    for an exception without one (``str(error).splitlines()[0]`` raises IndexError on those).

    >>> first_line(ValueError("bad value\\nmore")), first_line(KeyError())
    ('bad value', 'KeyError')
    """
    lines = str(error).strip().splitlines()
    return lines[0][:limit] if lines else type(error).__name__
