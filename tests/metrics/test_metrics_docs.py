"""The examples in the metrics docstrings run and print what they claim."""

import doctest
import importlib
import pkgutil

import pytest

import repgeom.metrics

# Every module of the package, found (a new metric's module needs no entry here).
MODULES = sorted(
    m.name.removeprefix("repgeom.metrics.")
    for m in pkgutil.walk_packages(repgeom.metrics.__path__, "repgeom.metrics.")
    if not m.name.rpartition(".")[2].startswith("_")
)


def test_the_modules_are_found():
    assert {"anisotropy", "intrinsic_dimension", "intrinsic_dimension.twonn", "rank",
            "alignment"} <= set(MODULES)


# The printed numbers are stored in the docstrings: they are rounded (or compared with a range)
# so that they hold on any CPU; `make test-stored-numbers` checks that under another kernel.
@pytest.mark.stored_numbers
@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"repgeom.metrics.{name}")
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
