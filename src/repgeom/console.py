"""A quiet console: silence the library lines a user would have to learn to ignore.

Each filter below drops exactly one known message, at its source, and says why it is noise;
everything else (the progress bar, the probe summary, warnings that matter, the final line
that says where everything is) is left alone. `quiet_console` is idempotent: `train` and
`probe` call it before they import or start anything that prints.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

LIGHTNING_TIP_PREFIX = "\N{ELECTRIC LIGHT BULB} Tip:"
"""Lightning's advertising lines (litlogger, litmodels): `logger_connector.py` and
`callback_connector.py` log them through `rank_zero_info` at every `Trainer` set-up."""

PYTREE_DEPRECATION = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
"""torch 2.13 deprecates `LeafSpec()`; lightning/pytorch/utilities/_pytree.py still builds one
(a FutureWarning on every fit, nothing a user can act on)."""

_RANK_ZERO_LOGGERS = (
    "lightning.fabric.utilities.rank_zero",
    "lightning.pytorch.utilities.rank_zero",
    "lightning_utilities.core.rank_zero",
)


class _DropPrefix(logging.Filter):
    """Drop log records whose message starts with `prefix`."""

    def __init__(self, prefix: str) -> None:
        super().__init__(f"drop:{prefix}")
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.prefix)


def quiet_console() -> None:
    """Install the filters; safe to call any number of times.

    - ``faiss.loader``: on import FAISS tries its AVX512 and AVX2 modules and logs at INFO that
      they "could not load" before loading the generic one, which dispatches to the CPU's
      instructions at run time (faiss >= 1.9 wheels): three alarming lines for a normal start.
      Its warnings and errors still show.
    - Lightning's "Tip:" lines (`LIGHTNING_TIP_PREFIX`).
    - The pytree FutureWarning (`PYTREE_DEPRECATION`).
    W&B's "anonymous setting" warning is avoided where the logger is built
    (`drop_unset_wandb_anonymous`), not filtered.
    """
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    for name in _RANK_ZERO_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropPrefix) for f in logger.filters):
            logger.addFilter(_DropPrefix(LIGHTNING_TIP_PREFIX))
    warnings.filterwarnings("ignore", message=PYTREE_DEPRECATION, category=FutureWarning)


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
