"""Reference implementations for the metrics tests (test-only dependencies)."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest


@pytest.fixture(scope="session")
def dadapy_id_estimation():
    """DADApy's ``IdEstimation`` class (the reference for TwoNN and GRIDE), or skip.

    DADApy 0.3.4 pins ``numpy<2`` and ships C extensions built against numpy 1.x, which do not
    import under this project's numpy 2. It is installed with ``pip install --no-deps
    dadapy==0.3.4`` (see requirements-dev.txt); its TwoNN/GRIDE code is pure numpy/scipy, so we
    load ``dadapy.id_estimation`` without running ``dadapy/__init__.py`` (which imports the C
    extensions and jax).
    """
    spec = importlib.util.find_spec("dadapy")
    if spec is None:
        pytest.skip("dadapy not installed: pip install --no-deps dadapy==0.3.4")
    if "dadapy" not in sys.modules:
        pkg = types.ModuleType("dadapy")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["dadapy"] = pkg
    import matplotlib

    matplotlib.use("Agg")  # dadapy's plotting helpers import pyplot
    from dadapy.id_estimation import IdEstimation

    return IdEstimation


@pytest.fixture(scope="session")
def ckatorch_cka_base():
    """``ckatorch.core.cka_base`` (ckatorch 1.0.3, "adapted from the one made by Kornblith et
    al." in google-research/representation_similarity), the reference for linear CKA, or skip.

    Installed with ``pip install --no-deps ckatorch==1.0.3`` (see requirements-dev.txt).
    ``ckatorch/__init__.py`` imports its plotting and training helpers (seaborn, safetensors,
    ...), which are not installed, so only ``ckatorch.core`` (torch only) is loaded, the way
    the DADApy fixture above does it.
    """
    spec = importlib.util.find_spec("ckatorch")
    if spec is None:
        pytest.skip("ckatorch not installed: pip install --no-deps ckatorch==1.0.3")
    if "ckatorch" not in sys.modules:
        pkg = types.ModuleType("ckatorch")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["ckatorch"] = pkg
    from ckatorch.core import cka_base

    return cka_base


@pytest.fixture(scope="session")
def llm_microscope_functions():
    """``llm_microscope/functions.py`` (llm-microscope 0.0.7, the Shape of Learning authors'
    code), the reference for `twonn_authors`, or skip.

    The package cannot be imported as shipped (its ``__init__.py`` does ``from logit_lens
    import *``, an absolute import of its own module), so ``functions.py`` is loaded by path.
    """
    spec = importlib.util.find_spec("llm_microscope")
    if spec is None:
        pytest.skip("llm-microscope not installed: pip install --no-deps llm-microscope==0.0.7")
    import matplotlib

    matplotlib.use("Agg")  # functions.py imports pyplot
    path = f"{list(spec.submodule_search_locations)[0]}/functions.py"
    module_spec = importlib.util.spec_from_file_location("llm_microscope_functions", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module
