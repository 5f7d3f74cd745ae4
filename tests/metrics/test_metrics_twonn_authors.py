"""`twonn_authors` against the Shape of Learning authors' own code (llm-microscope 0.0.7)."""

from __future__ import annotations

import pytest
import torch

from repgeom.metrics import anisotropy, linearity, twonn, twonn_authors


def _data_sets() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    plane = torch.randn(1003, 6, generator=g) @ torch.randn(6, 40, generator=g)  # 1003: not 5k
    gauss = torch.randn(1200, 10, generator=g) @ torch.randn(10, 64, generator=g) + 3.0
    copies = torch.cat([plane[:900], plane[:57]])  # 57 exact duplicates
    ties = plane[:500].clone()
    ties[1] = ties[0] + 1e-3 * torch.ones(40)  # ...and a near pair, kept
    ties = torch.cat([ties, ties[:3]])
    wide = torch.randn(777, 128, generator=g)  # a high dimension, far from the plane
    return {"plane_6d": plane, "gauss_10d": gauss, "duplicates": copies, "ties": ties,
            "isotropic_128d": wide}


@pytest.mark.parametrize("name", list(_data_sets()))
def test_equals_the_authors_package(name, llm_microscope_functions) -> None:
    X = _data_sets()[name]
    theirs = llm_microscope_functions.intrinsic_dimension(X, "cpu")
    ours = twonn_authors(X)
    # Both work in float64 on the same exact distances; 1e-6 relative leaves room for the
    # last bits of a distance computed in another order (FAISS finds the neighbours in
    # float32, their distances are recomputed in float64).
    assert ours.dimension == pytest.approx(theirs, rel=1e-6)


def test_duplicates_are_dropped_and_counted() -> None:
    X = _data_sets()["duplicates"]
    r = twonn_authors(X)
    # By brute force: a ratio is dropped when r1 = 0 (a copy) or r2 = r1 (its two nearest are
    # the two members of a copied pair): 114 copies and 51 such neighbours here.
    x = X.double() - X.double().mean(0)
    x = x / x.norm(dim=1).mean()
    d = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist")  # exact, no matmul
    d = d.fill_diagonal_(float("inf")).sort(dim=1).values
    dropped = (d[:, 0] < 1e-8) | (d[:, 1] / d[:, 0].clamp_min(1e-300) <= 1 + 1e-8)
    assert r.n_dropped == int(dropped.sum()) > 2 * 57
    assert r.n_fitted == (X.shape[0] - r.n_dropped) // 5


def test_reads_a_known_dimension_and_differs_from_facco() -> None:
    g = torch.Generator().manual_seed(1)
    X = torch.randn(4096, 10, generator=g) @ torch.randn(10, 64, generator=g)
    authors, facco = twonn_authors(X).dimension, twonn(X).dimension
    assert 9.0 < authors < 11.0 and 9.0 < facco < 11.0
    assert authors != pytest.approx(facco, rel=1e-3)  # two conventions, two numbers


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="reduction_factor"):
        twonn_authors(torch.randn(50, 3), reduction_factor=0)
    with pytest.raises(ValueError, match="duplicates or ties"):
        twonn_authors(torch.ones(20, 3))
    with pytest.raises(ValueError, match="duplicates or ties"):
        twonn_authors(torch.cat([torch.randn(4, 3)] * 5))


def test_their_anisotropy_and_procrustes_equal_ours(llm_microscope_functions) -> None:
    g = torch.Generator().manual_seed(2)
    X = torch.randn(600, 32, generator=g) @ torch.randn(32, 32, generator=g)
    Y = X @ torch.linalg.qr(torch.randn(32, 32, generator=g))[0] + 0.3 * torch.randn(600, 32,
                                                                                     generator=g)
    # Float32 inputs: their SVD and ours round differently in the last bits (1e-6 relative).
    assert anisotropy(X) == pytest.approx(
        llm_microscope_functions.calculate_anisotropy_torch(X), rel=1e-5)
    assert linearity(X, Y) == pytest.approx(
        float(llm_microscope_functions.procrustes_similarity(X, Y)), rel=1e-5)
