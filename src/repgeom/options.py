"""Check a training config before any work: a bad option fails in the first second, by name.

`train` calls `check_options` before it prepares the data (which can mean a 36 MB download and
a minute of tokenizing), so a negative learning rate or a head count that does not divide the
width is refused at once with the option's name, as litgpt's `Config.__post_init__` does.
The model's own checks live in `GPTConfig.__post_init__`; here it is built early with a
stand-in vocabulary size to run them.
"""

from __future__ import annotations

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from repgeom.data.enwik8 import check_path
from repgeom.models.recipe import check_recipe


class OptionError(ValueError):
    """An option of the run's config is out of range; the message names it."""


def check_options(cfg: DictConfig) -> None:
    """Raise `OptionError` (or the model config's `ValueError`) for an out-of-range option.

    Checks the model (`GPTConfig`: positive sizes, ``n_embd % n_head == 0``, dropout), the
    optimizer and schedule (``optim.optimizer.lr > 0``, weight decay and betas, warmup),
    ``trainer.max_steps``, ``data.batch_size`` and ``data.path`` (an existing file, not a
    folder: `repgeom.data.enwik8.check_path`, raising its `DataError`; the datamodule checks it
    again when it is built, for code that builds one directly) and the GPU recipe's switches
    (`repgeom.models.recipe.check_recipe`, raising its `RecipeError`).
    """
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model["vocab_size"] = 1  # the real one is known only after the data is read
    # Called directly, not through Hydra's instantiate, which would wrap the config's own
    # ValueError ("model.n_embd (...) must be divisible by model.n_head (...)") in its own.
    get_class(model.pop("_target_"))(**model)

    optim = cfg.get("optim") or {}
    opt = optim.get("optimizer") or {}
    _positive(opt, "lr", "optim.optimizer.lr")
    if opt.get("weight_decay") is not None and float(opt["weight_decay"]) < 0:
        raise OptionError(f"optim.optimizer.weight_decay must be >= 0, got {opt['weight_decay']}")
    for i, beta in enumerate(opt.get("betas") or []):
        if not 0.0 <= float(beta) < 1.0:
            raise OptionError(f"optim.optimizer.betas[{i}] must be in [0, 1), got {beta}")
    sched = optim.get("scheduler") or {}
    if sched.get("warmup_steps") is not None and int(sched["warmup_steps"]) < 0:
        raise OptionError(
            f"optim.scheduler.warmup_steps must be >= 0, got {sched['warmup_steps']}"
        )
    if sched.get("min_lr_ratio") is not None and not 0.0 <= float(sched["min_lr_ratio"]) <= 1.0:
        raise OptionError(
            f"optim.scheduler.min_lr_ratio must be in [0, 1], got {sched['min_lr_ratio']}"
        )

    trainer = cfg.get("trainer") or {}
    max_steps = trainer.get("max_steps")
    if max_steps is not None and int(max_steps) != -1 and int(max_steps) < 1:
        raise OptionError(f"trainer.max_steps must be >= 1 (or -1 for no limit), got {max_steps}")

    data = cfg.get("data") or {}
    if data.get("batch_size") is not None and int(data["batch_size"]) < 1:
        raise OptionError(f"data.batch_size must be >= 1, got {data['batch_size']}")
    if data.get("path") is not None:
        check_path(data["path"])
    recipe = cfg.get("recipe")
    check_recipe(OmegaConf.to_container(recipe, resolve=True) if recipe is not None else None)


def _positive(conf, key: str, name: str) -> None:
    value = conf.get(key)
    if value is not None and not float(value) > 0:
        raise OptionError(f"{name} must be > 0, got {value}")
