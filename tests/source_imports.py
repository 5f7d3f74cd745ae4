"""What a `from ... import` in repgeom's source names: shared by the tests that read the source
with `ast` (tests/test_architecture.py's floors, tests/test_private_names.py's scan)."""

from __future__ import annotations

import ast


def from_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute dotted module of ``from <module> import ...`` written in `package`; a
    relative import (``from ..x import y``) is resolved against `package` as Python does."""
    base = node.module or ""
    if not node.level:
        return base
    anchor = package.split(".")
    anchor = anchor[: len(anchor) - node.level + 1]
    return ".".join([*anchor, base] if base else anchor)
