import numpy as np
import pytest
import torch

from repgeom.metrics import faiss_has_gpu, nearest_neighbors


def _torch_knn(X: torch.Tensor, k: int):
    """Independent reference: float64 cdist of the centred data, self excluded, top-k."""
    X = X.double()
    X = X - X.mean(dim=0)
    D = torch.cdist(X, X)
    D.fill_diagonal_(float("inf"))
    d, i = torch.topk(D, k, dim=1, largest=False)
    return d, i


@pytest.mark.parametrize("n, d, k", [(500, 8, 1), (800, 64, 5), (300, 768, 3)])
def test_same_neighbours_as_plain_torch(n, d, k):
    X = torch.randn(n, d, generator=torch.Generator().manual_seed(n + d))
    dist, idx = nearest_neighbors(X, k)
    ref_d, ref_i = _torch_knn(X, k)
    assert dist.shape == (n, k) and idx.shape == (n, k) and idx.dtype == torch.int64
    # continuous Gaussian data: no ties, so the neighbour sets must be identical
    assert torch.equal(idx, ref_i)
    # distances recomputed directly in float32: relative error ~1e-6
    torch.testing.assert_close(dist.double(), ref_d, rtol=1e-5, atol=1e-6)


def test_large_common_offset_does_not_change_neighbours():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(1000, 64, generator=g, dtype=torch.float64)
    offset = torch.randn(64, generator=g, dtype=torch.float64)
    X_off = X + offset / offset.norm() * 1e4  # the drift anisotropy measures, norm 1e4
    dist, idx = nearest_neighbors(X_off, 2)
    ref_d, ref_i = _torch_knn(X, 2)
    # without centring, float32 ||x||^2 ~ 1e8 leaves ~10 absolute error on d^2 ~ 100: wrong
    # neighbours. Centred, the result must equal the offset-free one.
    assert torch.equal(idx, ref_i)
    torch.testing.assert_close(dist.double(), ref_d, rtol=1e-5, atol=1e-6)


def test_duplicates_and_self_exclusion():
    X = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [5.0, 5.0]])
    dist, idx = nearest_neighbors(X, 1)
    assert idx[:2, 0].tolist() == [1, 0]  # each copy finds the other, never itself
    assert dist[:2, 0].tolist() == [0.0, 0.0]
    # three copies and k=1: self may hide behind another copy; never returned as its own nbr
    X3 = torch.zeros(3, 2)
    _, idx3 = nearest_neighbors(X3, 2)
    assert all(i not in row for i, row in enumerate(idx3.tolist()))


def test_numpy_input_and_explicit_cpu():
    X = np.random.default_rng(2).normal(size=(50, 4)).astype(np.float32)
    d1, i1 = nearest_neighbors(X, 3, device="cpu")
    d2, i2 = nearest_neighbors(torch.from_numpy(X), 3)
    assert torch.equal(i1, i2) and torch.equal(d1, d2)


@pytest.mark.parametrize(
    "X, k, match",
    [
        (torch.randn(5, 3), 5, "k must be at most n - 1 = 4"),
        (torch.randn(5, 3), 0, "k must be an integer >= 1"),
        (torch.tensor([[float("nan"), 0.0], [0.0, 0.0]]), 1, "X contains"),
        (torch.randn(5), 1, "X must be 2-D"),
        (torch.randn(1, 3), 1, "X needs at least 2 rows"),
    ],
)
def test_errors(X, k, match):
    with pytest.raises(ValueError, match=match):
        nearest_neighbors(X, k)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_matches_cpu():
    X = torch.randn(3000, 128, generator=torch.Generator().manual_seed(7))
    d_cpu, i_cpu = nearest_neighbors(X, 4)
    d_gpu, i_gpu = nearest_neighbors(X.cuda(), 4)
    assert i_gpu.is_cuda  # FAISS GPU (or the torch fallback) keeps results on the device
    assert torch.equal(i_gpu.cpu(), i_cpu)
    torch.testing.assert_close(d_gpu.cpu(), d_cpu, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and faiss_has_gpu()),
                    reason="needs a CUDA GPU and a GPU build of FAISS")
def test_faiss_gpu_path_used():
    X = torch.randn(500, 16, device="cuda")
    _, idx = nearest_neighbors(X, 2)
    assert idx.device.type == "cuda"
