"""The commands a user runs: one module per command, all in one style, Hydra.

Every command is ``main(argv=None)`` of a module here, declared as a console script in
``pyproject.toml`` (``[project.scripts]`` -> `repgeom.cli.scripts`); ``python -m
repgeom.cli.<name>`` does the same, and ``python train.py`` / ``python probe.py`` in a checkout
call `repgeom.cli.train` and `repgeom.cli.probe`. This package is the top floor: it imports
the library, nothing imports it (``tests/test_architecture.py``).
Nothing below this package has a ``main`` or an argument parser: the modules it calls take plain
arguments.

Why Hydra for all of them: it is the house tool (train and probe compose config groups and need
it), so one style means Hydra, and every command then answers ``key=value``, ``--help``,
``--cfg job`` and ``--multirun`` the same way. ``train``, ``probe`` and ``common_bias`` read their
YAML under ``conf/``; the others are small structured configs (a dataclass at the top of each
module, stored in Hydra's ConfigStore), since their options are a handful of paths with no
groups to compose. The words users typed before (``--out DIR``, bare folder names, free text
with commas in ``text=``) are turned into Hydra overrides by `repgeom.cli.command.hydra_words`.
"""

