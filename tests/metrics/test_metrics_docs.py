"""The examples in the metrics docstrings run and print what they claim."""

import doctest
import importlib

import pytest

MODULES = ["alignment", "anisotropy", "attention", "cosine", "distributions", "drift",
           "intrinsic_dimension", "isoscore", "neighbors", "rank", "similarity"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"repgeom.metrics.{name}")
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
