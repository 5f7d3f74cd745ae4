"""Run one command through Hydra: the config, the words a user types, the task.

`run_command` registers a command's structured config (a dataclass) in Hydra's ConfigStore,
turns the words of the command line into Hydra overrides, and runs ``hydra.main`` on the task,
returning what the task returns (tests and notebooks call ``main(argv)`` of a `repgeom.cli`
module; a console script drops the value).

Words (`hydra_words`), so that the command lines written before Hydra still work:

- ``key=value``: a Hydra override. A value of a ``str`` field is quoted, so free text (``text=a,
  b: c``) and comma lists (``group_by=subject,attribute``) arrive as typed, except with
  ``--multirun``, where ``hf=gpt2,distilgpt2`` sweeps; a field holding a list collects repeated
  words (``text=a text=b``).
- ``--key value``, ``--key=value``, ``--key v1 v2`` (a list field), ``--flag`` / ``--no-flag``
  (a bool field), and bare words (the command's positional fields, in order): the same as
  ``key=value``.
- Hydra's own flags (``--help``, ``--cfg job``, ``--multirun``, ...) pass through.

The commands write where their options say and leave no ``outputs/<date>`` folder and no
``.hydra/`` behind (`QUIET`); ``hydra.run.dir=...`` on the command line still wins.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import typing
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["run_command", "hydra_words", "with_defaults", "console", "QUIET"]

QUIET = ("hydra.output_subdir=null", "hydra.run.dir=.", "hydra/job_logging=none",
         "hydra/hydra_logging=none")
"""Overrides added unless the user sets the same key: no run folder, no ``.hydra/``, no log
file."""

_HYDRA_FLAGS = {"--help", "-h", "--hydra-help", "--version", "--cfg", "-c", "--resolve",
                "--package", "-p", "--run", "-r", "--multirun", "-m", "--shell-completion",
                "-sc", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
                "--info", "-i", "--experimental-rerun"}
_HYDRA_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--shell-completion", "-sc",
                           "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
                           "--experimental-rerun"}


def _kinds(config: type) -> dict[str, str]:
    """Field name -> 'list', 'bool', 'str' or 'other'."""
    hints = typing.get_type_hints(config)
    out = {}
    for f in dataclasses.fields(config):
        text = str(hints[f.name])
        if "list" in text.lower():
            out[f.name] = "list"
        elif hints[f.name] is bool:
            out[f.name] = "bool"
        elif hints[f.name] is str or text in ("typing.Optional[str]", "str | None"):
            out[f.name] = "str"
        else:
            out[f.name] = "other"
    return out


def _quote(value: str) -> str:
    if value[:1] in ("'", '"'):
        return value
    return "'" + value.replace("'", "\\'") + "'"


def hydra_words(argv: Sequence[str], config: type, *, positional: Sequence[str] = (),
                flag_values: dict[str, str] | None = None) -> list[str]:
    """The Hydra overrides and flags that `argv` (old or new style) means for `config`.

    `positional` names the fields that bare words fill, in order; the last one, when a list,
    takes every remaining bare word. `flag_values` gives the value of ``--key`` written alone
    for a field that is not a bool (``dry_run`` -> ``repgeom-dashboard.json``).

    Raises
    ------
    ValueError
        For a ``--key`` that is not a field, a bare word with no positional field left, or a
        ``--key`` with no value.
    """
    kinds = _kinds(config)
    flag_values = flag_values or {}
    words = list(argv)
    multirun = "-m" in words or "--multirun" in words
    values: dict[str, list[str]] = {}
    flags: list[str] = []  # Hydra's own, first: argparse takes one run of overrides after them
    passed: list[str] = []
    free = list(positional)

    def put(key: str, value: str) -> None:
        if kinds.get(key) == "list" and not value.startswith("["):
            values.setdefault(key, []).append(value)
        else:
            values[key] = [value]

    i = 0
    while i < len(words):
        w = words[i]
        i += 1
        if w.split("=", 1)[0] in _HYDRA_FLAGS:
            flags.append(w)
            if w in _HYDRA_FLAGS_WITH_VALUE and i < len(words):
                flags.append(words[i])
                i += 1
            continue
        if w.startswith("--"):
            key, eq, value = w[2:].partition("=")
            key = key.replace("-", "_")
            if key not in kinds and key.startswith("no_") and kinds.get(key[3:]) == "bool":
                values[key[3:]] = ["false"]
                continue
            if key not in kinds:
                raise ValueError(f"unknown option {w.split('=')[0]}; options: "
                                 f"{', '.join(sorted(kinds))}")
            if eq:
                put(key, value)
                continue
            following = []
            while (i < len(words) and not words[i].startswith("-")
                   and not (kinds.get(key) != "list" and following)
                   and words[i].split("=", 1)[0].replace("-", "_") not in kinds):
                following.append(words[i])
                i += 1
            if kinds[key] == "bool" and not following:
                values[key] = ["true"]
            elif not following and key in flag_values:
                values[key] = [flag_values[key]]
            elif not following:
                raise ValueError(f"{w} needs a value")
            else:
                for value in following:
                    put(key, value)
            continue
        key, eq, value = w.partition("=")
        if eq and (key.replace("-", "_") in kinds or "." in key or key.startswith(("+", "~"))):
            key = key.replace("-", "_")
            if key in kinds:
                put(key, value)
            else:
                passed.append(w)
            continue
        if eq and re.fullmatch(r"[A-Za-z_][\w-]*", key):  # a misspelt option, not a path
            raise ValueError(f"unknown option {key}=; options: {', '.join(sorted(kinds))}")
        if not free:
            raise ValueError(f"unexpected word {w!r}; options are key=value "
                             f"({', '.join(sorted(kinds))})")
        key = free[0]
        put(key, w)
        if kinds[key] != "list":
            free.pop(0)
    out = []
    for key, vs in values.items():
        if kinds[key] == "list" and not vs[0].startswith("["):
            out.append(f"{key}=[{','.join(_quote(v) for v in vs)}]")
        elif kinds[key] == "str" and not multirun:
            out.append(f"{key}={_quote(vs[0])}")
        else:
            out.append(f"{key}={vs[0]}")
    return [*flags, *out, *passed]


def with_defaults(words: Sequence[str], defaults: Sequence[str]) -> list[str]:
    """`words` with the overrides of `defaults` whose key none of them sets (the user's wins).

    Hydra's parser (argparse) reads the overrides as one run of words between its flags, so the
    added ones go beside the user's first override, or last when there is none.
    """
    keys = {w.split("=", 1)[0].lstrip("+~") for w in words if "=" in w}
    added = [d for d in defaults if d.split("=", 1)[0] not in keys]
    words = list(words)
    at = next((i for i, w in enumerate(words) if "=" in w and not w.startswith("-")), len(words))
    return [*words[:at], *added, *words[at:]]


def run_command(name: str, config: type, task: Callable[[Any], Any],
                argv: Sequence[str] | None = None, *, positional: Sequence[str] = (),
                flag_values: dict[str, str] | None = None) -> Any:
    """Run `task` on the config `config` (stored as `name`) with the words `argv`.

    ``argv=None`` reads ``sys.argv``. Returns what `task` returned (None under ``--help``,
    ``--cfg`` and ``--multirun``). A `ValueError` or `FileNotFoundError` of `task` is raised
    from here as it is (Hydra would turn it into exit status 1); `console` turns it into a
    message. Words that name no option exit with a message (`SystemExit`), as argparse did.
    """
    import hydra
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra

    words = sys.argv[1:] if argv is None else list(argv)
    try:
        overrides = hydra_words(words, config, positional=positional, flag_values=flag_values)
    except ValueError as err:
        raise SystemExit(f"{name}: error: {err}") from None
    if "--help" in overrides or "-h" in overrides:  # what the command does, then Hydra's help
        print((sys.modules[task.__module__].__doc__ or "").strip() + "\n")
    ConfigStore.instance().store(name=f"repgeom_{name}", node=config)
    result: dict[str, Any] = {}

    def job(cfg: Any) -> None:
        try:
            result["value"] = task(cfg)
        except (ValueError, FileNotFoundError) as err:  # the user's mistake: raised by main
            result["error"] = err

    saved = sys.argv
    sys.argv = [f"repgeom-{name.replace('_', '-')}",
                *with_defaults(overrides, (f"hydra.job.name={name}", *QUIET))]
    try:
        GlobalHydra.instance().clear()
        hydra.main(version_base="1.3", config_path=None, config_name=f"repgeom_{name}")(job)()
    finally:
        sys.argv = saved
        GlobalHydra.instance().clear()
    if "error" in result:
        raise result["error"]
    return result.get("value")


def console(main: Callable[[], Any]) -> int:
    """Run a command's `main` for a console (a script, ``python -m``): 0 on success, a one-line
    message and exit status 1 for a `ValueError` or `FileNotFoundError` (a wrong path or option),
    a traceback for anything else."""
    try:
        main()
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None
    return 0
