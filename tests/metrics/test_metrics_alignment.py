import numpy as np
import pytest
import torch

from repgeom.metrics import linear_cka, mutual_knn


def rotation(d: int, seed: int) -> np.ndarray:
    Q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, d)))
    return Q


def states(n: int, d: int, seed: int) -> np.ndarray:
    """Anisotropic Gaussian states with an offset, like a layer's hidden states."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)) * np.geomspace(0.2, 3.0, d) + rng.normal(size=d)


def paired(n: int, d1: int, d2: int, seed: int, noise: float = 1.0):
    """X and a noisy linear image Y of it (different width): partially similar, CKA in (0, 1)."""
    rng = np.random.default_rng(seed)
    X = states(n, d1, seed)
    Y = X @ rng.normal(size=(d1, d2)) + noise * rng.normal(size=(n, d2)) * np.sqrt(d1)
    return X, Y


# ---------------------------------------------------------------------------------- linear CKA


def _cka_hsic(X: np.ndarray, Y: np.ndarray) -> float:
    """The task's independent formula: HSIC(K, L) = tr(K H L H)/(n-1)^2 with K = X X^T,
    L = Y Y^T (uncentred features; H centres), CKA = HSIC(K,L)/sqrt(HSIC(K,K) HSIC(L,L))."""
    n = X.shape[0]
    H = np.eye(n) - 1.0 / n
    K, L = X @ X.T, Y @ Y.T

    def hsic(A, B):
        return np.trace(A @ H @ B @ H) / (n - 1) ** 2

    return float(hsic(K, L) / np.sqrt(hsic(K, K) * hsic(L, L)))


# n > d (feature-space form) and n < d (Gram form); noise keeps CKA away from 0 and 1
CKA_CASES = [(300, 12, 20, 1.0), (300, 40, 7, 1.0), (60, 100, 150, 1.0), (80, 5, 200, 5.0)]


@pytest.mark.parametrize("n, d1, d2, noise", CKA_CASES)
def test_cka_matches_hsic_formula(n, d1, d2, noise):
    X, Y = paired(n, d1, d2, seed=n + d1, noise=noise)
    ours = linear_cka(torch.tensor(X), torch.tensor(Y))
    assert 0.05 < ours < 0.95  # a case that tests something
    # float64 both; feature-space (or Gram) form vs n x n traces: ~1e-14 relative
    assert ours == pytest.approx(_cka_hsic(X, Y), rel=1e-10)


@pytest.mark.parametrize("n, d1, d2, noise", CKA_CASES)
@pytest.mark.parametrize("method", ["fro_norm", "hsic"])
def test_cka_matches_ckatorch(n, d1, d2, noise, method, ckatorch_cka_base):
    X, Y = paired(n, d1, d2, seed=n + d2, noise=noise)
    ref = float(ckatorch_cka_base(torch.tensor(X), torch.tensor(Y), kernel="linear",
                                  method=method))
    # ckatorch: Kornblith et al.'s centred Gram matrices, in float64; ~1e-14 relative
    assert linear_cka(X, Y) == pytest.approx(ref, rel=1e-10)


def test_cka_of_a_set_with_itself_is_one():
    X = states(500, 32, 0)
    assert linear_cka(X, X) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("side", ["X", "Y"])
def test_cka_invariant_to_orthogonal_maps_scaling_and_offsets(side):
    X, Y = paired(400, 24, 24, seed=1)
    base = linear_cka(X, Y)
    Q = rotation(24, 2)
    if side == "X":
        moved = linear_cka(5.0 * X @ Q + 3.0, Y)
    else:
        moved = linear_cka(X, 0.01 * Y @ Q - 7.0)
    # exact invariances (Kornblith et al. 2019, section 2); float64 rounding only
    assert moved == pytest.approx(base, rel=1e-10)
    # and a rotated, scaled copy of a set is CKA-identical to it
    assert linear_cka(X, 2.0 * X @ Q) == pytest.approx(1.0, abs=1e-12)


def test_cka_not_invariant_to_invertible_linear_maps():
    X = np.random.default_rng(3).normal(size=(2000, 16))  # about isotropic
    stretch = np.ones(16)
    stretch[0] = 100.0
    A = np.diag(stretch) @ rotation(16, 4)  # invertible (det 100), not orthogonal
    # with X^T X ~ n I, CKA(X, XA) ~ ||A||_F^2 / (sqrt(d) ||A^T A||_F)
    # = (15 + 1e4) / (4 sqrt(15 + 1e8)) ~ 0.25: one stretched direction dominates Y's kernel
    expected = (15 + 1e4) / (4 * np.sqrt(15 + 1e8))
    assert linear_cka(X, X @ A) == pytest.approx(expected, abs=0.05)
    assert abs(np.linalg.det(A)) == pytest.approx(100.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cka_low_precision_input(dtype):
    X, Y = paired(300, 12, 20, seed=5)
    Xt, Yt = torch.tensor(X).to(dtype), torch.tensor(Y).to(dtype)
    ref = _cka_hsic(Xt.double().numpy(), Yt.double().numpy())
    # computed in float64 on the upcast values
    assert linear_cka(Xt, Yt) == pytest.approx(ref, rel=1e-10)


@pytest.mark.parametrize(
    "X, Y, match",
    [
        (torch.randn(10, 3), torch.randn(11, 3), "same number of rows"),
        (torch.ones(10, 3), torch.randn(10, 3), "X has zero variance"),
        (torch.randn(10, 3), torch.ones(10, 2), "Y has zero variance"),
        (torch.randn(10, 3), torch.full((10, 2), float("nan")), "Y contains .* NaN or Inf"),
        (torch.randn(10), torch.randn(10, 2), "X must be 2-D"),
        (torch.randn(1, 3), torch.randn(1, 2), "X needs at least 2 rows"),
    ],
)
def test_cka_errors(X, Y, match):
    with pytest.raises(ValueError, match=match):
        linear_cka(X, Y)


# ---------------------------------------------------------------------------------- mutual kNN


def _mutual_knn_brute_force(X: np.ndarray, Y: np.ndarray, k: int) -> float:
    """Huh et al.'s metric in numpy, as their code: L2-normalise, full cosine similarity
    matrix, self excluded, argsort, top k; mean of |N_X(i) & N_Y(i)| / k. Float64."""

    def knn(F):
        U = F / np.linalg.norm(F, axis=1, keepdims=True)
        S = U @ U.T
        np.fill_diagonal(S, -np.inf)
        return np.argsort(-S, axis=1, kind="stable")[:, :k]

    a, b = knn(X), knn(Y)
    return float(np.mean([len(set(r) & set(s)) for r, s in zip(a, b, strict=True)]) / k)


def test_mutual_knn_of_a_set_with_itself_is_one():
    X = states(800, 16, 6)
    assert mutual_knn(X, X) == 1.0
    assert mutual_knn(X, X, k=1) == 1.0


def test_mutual_knn_rotated_and_scaled_is_one():
    X = states(800, 16, 7)
    Y = 4.0 * X @ rotation(16, 8)  # same cosines, hence the same neighbours
    # rounding (float32 search) could only swap neighbours whose similarities tie to ~1e-7;
    # none do in continuous data of this size, so the value is exactly 1
    assert mutual_knn(X, Y) == 1.0
    assert mutual_knn(torch.tensor(X, dtype=torch.float32), torch.tensor(Y), k=25) == 1.0


@pytest.mark.parametrize("k", [10, 50])
def test_mutual_knn_of_independent_sets_is_chance(k):
    n = 2000
    rng = np.random.default_rng(9)
    X, Y = rng.normal(size=(n, 16)), rng.normal(size=(n, 24))
    # independent sets: N_Y(i) is a uniform k-subset of the n-1 others given N_X(i), so the
    # overlap is hypergeometric, mean k^2/(n-1), variance ~ k^2/(n-1): expected score k/(n-1)
    # (0.005 for k=10, 0.025 for k=50), per-point sd of overlap/k ~ 1/sqrt(n-1) = 0.022. The
    # mean over n = 2000 points has sd ~5e-4, ~7e-4 counting that neighbours i, j often share
    # their overlaps; 3e-3 is > 4 sd
    assert mutual_knn(X, Y, k=k) == pytest.approx(k / (n - 1), abs=3e-3)


@pytest.mark.parametrize(
    "n, d1, d2, noise, k", [(600, 16, 16, 0.3, 10), (500, 8, 40, 1.0, 10), (400, 32, 6, 0.5, 30)]
)
def test_mutual_knn_matches_brute_force(n, d1, d2, noise, k):
    X, Y = paired(n, d1, d2, seed=n, noise=noise)
    ours = mutual_knn(torch.tensor(X), torch.tensor(Y), k=k)
    ref = _mutual_knn_brute_force(X, Y, k)
    assert 0.05 < ref < 0.95  # partially aligned: the comparison can catch a mistake
    # same neighbours unless two similarities at the k-th place tie to float32 precision
    # (~1e-7), which would swap one neighbour and move the score by 1/(n k); allow two swaps
    assert ours == pytest.approx(ref, abs=2 / (n * k))


def test_mutual_knn_with_a_large_common_offset():
    rng = np.random.default_rng(10)
    X, Y = paired(500, 16, 16, seed=11, noise=0.5)
    off = 1e3 * rng.normal(size=16)
    # cosines of rows that share a large offset differ by ~1e-6: the float64 normalisation and
    # centring before the float32 search keep them apart (see mutual_knn's Notes)
    ours = mutual_knn(X + off, Y + off)
    ref = _mutual_knn_brute_force(X + off, Y + off, 10)
    assert ours == pytest.approx(ref, abs=2 / (500 * 10))


@pytest.mark.parametrize(
    "X, Y, kwargs, match",
    [
        (torch.randn(10, 3), torch.randn(11, 3), {}, "same number of rows"),
        (torch.randn(10, 3), torch.randn(10, 3), {"k": 10}, "k must be at most n - 1 = 9"),
        (torch.randn(10, 3), torch.randn(10, 3), {"k": 0}, "k must be an integer >= 1"),
        (torch.randn(10, 3), torch.randn(10, 3), {"k": 2.5}, "k must be an integer"),
        (torch.zeros(10, 3), torch.randn(10, 3), {"k": 2}, "X has 10 all-zero row"),
        (torch.randn(10, 3), torch.full((10, 3), float("inf")), {"k": 2}, "Y contains"),
    ],
)
def test_mutual_knn_errors(X, Y, kwargs, match):
    with pytest.raises(ValueError, match=match):
        mutual_knn(X, Y, **kwargs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu():
    X, Y = paired(600, 16, 24, seed=12, noise=0.5)
    Xt, Yt = torch.tensor(X, dtype=torch.float32), torch.tensor(Y, dtype=torch.float32)
    # CKA: float64 on either device, different reduction orders: ~1e-15
    assert linear_cka(Xt.cuda(), Yt.cuda()) == pytest.approx(linear_cka(Xt, Yt), rel=1e-10)
    # the GPU search (FAISS GPU or the torch fallback) finds the same neighbours barring
    # float32 near-ties at the k-th place (see test_mutual_knn_matches_brute_force)
    assert mutual_knn(Xt.cuda(), Yt.cuda()) == pytest.approx(mutual_knn(Xt, Yt), abs=2 / 6000)
