"""Tiny random Hugging Face models, saved to disk and loaded back, with no download.

`tiny_hf(family)` loads a 2-layer model of that family written by `tiny_hf_models.build_tiny_hf`
(its docstring lists the families and their tokenizers). Each folder is built once per test
session.
"""

from __future__ import annotations

import pytest
from tiny_hf_models import TEXT, build_tiny_hf


@pytest.fixture(scope="session")
def tiny_text() -> str:
    """A few hundred characters, all in the tiny tokenizers' vocabulary."""
    return TEXT


@pytest.fixture(scope="session")
def tiny_hf_folder(tmp_path_factory):
    """`tiny_hf_folder(family)` -> path of a saved tiny model of that family (built once);
    ``tokenizer=False``: the same model saved without its tokenizer."""
    built: dict[tuple[str, bool], str] = {}

    def make(family: str, *, tokenizer: bool = True) -> str:
        if (family, tokenizer) not in built:
            name = family.replace("-", "_") + ("" if tokenizer else "_model_only")
            folder = tmp_path_factory.mktemp(name)
            build_tiny_hf(family, folder, tokenizer=tokenizer)
            built[family, tokenizer] = str(folder)
        return built[family, tokenizer]

    return make


@pytest.fixture(scope="session")
def tiny_hf(tiny_hf_folder):
    """`tiny_hf(family)` -> `HFModel` loaded from its saved folder through `load_hf_model`."""
    from repgeom.models.hf import load_hf_model

    loaded: dict = {}

    def make(family: str):
        if family not in loaded:
            loaded[family] = load_hf_model(tiny_hf_folder(family))
        return loaded[family]

    return make
