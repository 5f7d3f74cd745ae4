import numpy as np
import pytest
import torch

from repgeom.metrics import pooled_similarity, token_cosine_matrix


def test_pooled_matches_numpy():
    rng = np.random.default_rng(0)
    A, B = rng.normal(size=(12, 8)) + 1.0, rng.normal(size=(5, 8)) + 1.0
    a, b = A.mean(axis=0), B.mean(axis=0)
    ref = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
    # float64 throughout: ~1e-15
    assert pooled_similarity(torch.tensor(A), torch.tensor(B)) == pytest.approx(ref, abs=1e-12)


def test_pooled_identical_texts_is_one():
    A = torch.randn(7, 4)
    assert pooled_similarity(A, A) == pytest.approx(1.0, abs=1e-12)


def test_pooled_errors():
    with pytest.raises(ValueError, match="same number of features"):
        pooled_similarity(torch.ones(3, 4), torch.ones(3, 5))
    with pytest.raises(ValueError, match="zero vector"):
        pooled_similarity(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]), torch.ones(2, 2))
    with pytest.raises(ValueError, match="B .*NaN"):
        pooled_similarity(torch.ones(2, 2), torch.tensor([[float("nan"), 0.0]]))
    with pytest.raises(ValueError, match="A must be 2-D"):
        pooled_similarity(torch.ones(2), torch.ones(2, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_token_cosine_matrix_matches_numpy(dtype):
    X = np.random.default_rng(1).normal(size=(9, 6))
    C = token_cosine_matrix(torch.tensor(X, dtype=dtype))
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    assert C.shape == (9, 9) and C.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-12  # float32 rounding of unit vectors
    np.testing.assert_allclose(C.numpy(), U @ U.T, atol=tol)
    np.testing.assert_allclose(np.diag(C.numpy()), 1.0, atol=tol)


def test_token_cosine_matrix_errors():
    with pytest.raises(ValueError, match="X must be 2-D"):
        token_cosine_matrix(torch.ones(2, 3, 4))
    with pytest.raises(ValueError, match="NaN or Inf"):
        token_cosine_matrix(torch.tensor([[float("inf"), 1.0]]))
