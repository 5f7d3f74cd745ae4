"""Which weight files a revision needs (`repgeom.models.weights_rule`): the rule's examples.
The rule against a hub's revisions is tested in tests/models/hub/test_downloads.py."""

from __future__ import annotations

import doctest

from repgeom.models import weights_rule


def test_docstring_examples() -> None:
    result = doctest.testmod(weights_rule, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0  # examples ran, and all held
