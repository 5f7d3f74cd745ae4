import numpy as np
import pytest
import torch
from sklearn.decomposition import PCA

from repgeom.metrics import effective_rank, pca_dimension, rankme
from repgeom.metrics._spectrum import gram_eigh


def frame(d: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """(k, d) orthonormal rows: k random orthogonal directions of R^d."""
    Q, _ = np.linalg.qr(rng.normal(size=(d, k)))
    return Q.T


def equal_spread(k: int, d: int, rng: np.random.Generator, offset: float = 0.0) -> np.ndarray:
    """2k points +-e_i along k orthogonal directions of R^d (plus a common offset): centred
    singular values all equal to sqrt(2)."""
    F = frame(d, k, rng)
    return np.concatenate([F, -F]) + offset * rng.normal(size=d)


def _erank_numpy(X: np.ndarray, centre: bool) -> float:
    """Roy & Vetterli 2007, definition 1, written with numpy's SVD."""
    X = X.astype(np.float64)
    if centre:
        X = X - X.mean(axis=0)
    s = np.linalg.svd(X, compute_uv=False)
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def _rankme_numpy(Z: np.ndarray, eps: float = 1e-7) -> float:
    """Garrido et al. 2023, eq. 1: p_k = sigma_k / ||sigma||_1 + eps, exp of the entropy."""
    s = np.linalg.svd(Z.astype(np.float64), compute_uv=False)
    p = s / s.sum() + eps
    return float(np.exp(-(p * np.log(p)).sum()))


# ---------------------------------------------------------------------------------- effective rank


@pytest.mark.parametrize("k", [1, 2, 5, 17])
def test_effective_rank_of_k_equal_directions_is_k(k):
    X = equal_spread(k, 40, np.random.default_rng(k), offset=50.0)
    # exact in exact arithmetic; float64 SVD noise on the zero singular values is ~1e-15
    # relative, contributing ~1e-13 to the entropy; the common offset is removed by centring
    assert effective_rank(torch.tensor(X)) == pytest.approx(k, abs=1e-9)


@pytest.mark.parametrize("k", [1, 2, 5, 17])
@pytest.mark.parametrize("copies", [1, 25])  # 2k < 40 rows (n x n Gram) and >= 40 (d x d)
def test_effective_rank_of_k_equal_directions_is_exactly_k(k, copies):
    X = np.tile(equal_spread(k, 40, np.random.default_rng(k), offset=50.0), (copies, 1))
    # the Gram path reads the zero directions' eigenvalue noise as 0, so only the rounding of
    # p_k = 1/k, log and exp is left: within 2 ulps of k (an SVD of the same data: 1e-12 off)
    assert effective_rank(torch.tensor(X)) == pytest.approx(k, rel=1e-15)


def test_the_spurious_singular_values_an_svd_was_kept_for_are_gone():
    # rank.py kept the SVD because square roots of eigenvalues turn their rounding noise into
    # spurious singular values. Rank 3 in 64 dimensions, a large offset, 2000 states:
    X = np.tile(equal_spread(3, 64, np.random.default_rng(9), offset=100.0), (334, 1))
    Xc = torch.tensor(X - X.mean(axis=0))
    lam = torch.linalg.eigvalsh(Xc.T @ Xc)
    noise = lam[:-3].abs().sqrt() / lam[-1].sqrt()  # the 61 zero directions
    assert noise.max() > 1e-9  # the reason was real: spurious singular values (4e-8) ...
    p = torch.cat([lam[-3:].sqrt(), noise * lam[-1].sqrt()])
    p = p / p.sum()
    assert float(torch.exp(-(p * torch.log(p)).sum())) - 3.0 > 1e-6  # ... move the rank 2e-5
    refined, V = gram_eigh(Xc, float(np.linalg.norm(X)))  # the floor scaled as X's numbers
    # recomputed from Xc: at most the float64 rounding of the offset, below the rank floor
    assert bool((refined[:-3] == 0).all())
    assert torch.allclose(refined[-3:], lam[-3:], rtol=1e-12, atol=0)  # 668 each, 1e-14 off
    assert torch.allclose(V.T @ V, torch.eye(64, dtype=torch.float64), atol=1e-12)
    assert effective_rank(torch.tensor(X)) == pytest.approx(3.0, rel=1e-15)


def test_float32_rounding_directions_are_kept_as_an_svd_keeps_them():
    # A layer norm's output sums to 0 over its features (before the affine map): centred, its
    # float32 states span d - 1 directions and a last one of float32 rounding, ~1e-8 of the
    # largest singular value. The SVD reads that direction (it is in the float64 data); the
    # Gram matrix alone would put it at its rounding floor, up to 3e-7 off (BERT's post-LN
    # layers in bench_tables_identical.py).
    g = torch.Generator().manual_seed(12)
    X = torch.randn(192, 32, generator=g) @ torch.randn(32, 32, generator=g)
    X = torch.nn.functional.layer_norm(X, (32,))  # float32
    ref = _erank_numpy(X.double().numpy(), centre=True)
    s = np.linalg.svd(X.double().numpy() - X.double().numpy().mean(axis=0), compute_uv=False)
    assert 1e-10 < s[-1] / s[0] < 1e-6  # the rounding direction is there
    assert effective_rank(X) == pytest.approx(ref, rel=1e-10)
    assert rankme(X) == pytest.approx(_rankme_numpy(X.double().numpy()), rel=1e-10)


def _ill_conditioned(n: int, d: int, condition: float, offset: float, seed: int) -> np.ndarray:
    """States with centred singular values log-spaced from 1 down to 1/condition, plus a common
    offset of norm ``offset`` (hidden states share one much larger than their spread)."""
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.normal(size=(n, d)))
    U -= U.mean(axis=0)  # centred columns, still nearly orthonormal (n >> d)
    V, _ = np.linalg.qr(rng.normal(size=(d, d)))
    mean = rng.normal(size=d)
    return (U * np.logspace(0, -np.log10(condition), d)) @ V.T + offset * mean / np.linalg.norm(
        mean)


@pytest.mark.parametrize("shape", [(8192, 128), (4096, 512)])
def test_ill_conditioned_states_match_the_svd(shape):
    X = _ill_conditioned(*shape, condition=1e6, offset=1e3, seed=10)
    s = np.linalg.svd(X - X.mean(axis=0), compute_uv=False)
    assert s[0] / s[-1] > 1e6 * 0.9  # ill-conditioned as asked (centring moves it a little)
    assert np.linalg.svd(X, compute_uv=False)[0] / s[0] > 100  # the offset dominates Z
    # Today's values came from an SVD (the numpy functions above). Measured: 1e-11 relative
    # for the effective rank, 1e-14 for RankMe; 1e-7 is the bound the probe tables need.
    # A floor of n * eps * max would read the 1e-12 eigenvalues of 8192 x 128 as 0 and miss by
    # 5e-6; RankMe from eigvalsh of the uncentred Z^T Z would miss by 2e-5 (8192 x 128) to 2e-4.
    assert effective_rank(X) == pytest.approx(_erank_numpy(X, centre=True), rel=1e-7)
    assert rankme(X) == pytest.approx(_rankme_numpy(X), rel=1e-7)
    assert rankme(X, eps=0.0) == pytest.approx(_rankme_numpy(X, eps=0.0), rel=1e-7)


def test_the_states_get_no_svd(monkeypatch):
    shapes = []
    svdvals = torch.linalg.svdvals
    monkeypatch.setattr(torch.linalg, "svdvals", lambda A: shapes.append(A.shape) or svdvals(A))
    X = torch.randn(2000, 48, generator=torch.Generator().manual_seed(11)) + 3.0
    effective_rank(X)
    rankme(X)
    assert shapes == [(49, 48)]  # only RankMe's (d + 1) x d matrix, never the 2000 x 48 states


def test_effective_rank_of_rank_one_is_one():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(300, 1, generator=g) @ torch.randn(1, 64, generator=g) + 7.0
    # float32 data upcast: the rank-one structure is exact up to float32 rounding of the
    # product (~1e-7 relative), which leaves singular values ~1e-7 of the first; entropy ~1e-5
    assert effective_rank(X) == pytest.approx(1.0, abs=1e-4)
    assert effective_rank(X.double()) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("shape", [(500, 24), (30, 80)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_effective_rank_matches_numpy(shape, dtype):
    rng = np.random.default_rng(1)
    X = torch.tensor(rng.normal(size=shape) * np.linspace(0.1, 3.0, shape[1]) + 4.0).to(dtype)
    ref = _erank_numpy(X.double().numpy(), centre=True)
    # same float64 data (the upcast of X), two SVD implementations: ~1e-13
    assert effective_rank(X) == pytest.approx(ref, rel=1e-10)


def test_effective_rank_is_centred_and_rankme_is_not():
    rng = np.random.default_rng(2)
    X = equal_spread(4, 16, rng, offset=0.0)
    shifted = X + 100.0 * frame(16, 1, rng)[0]
    assert effective_rank(shifted) == pytest.approx(4.0, abs=1e-9)  # offset removed
    # uncentred, one huge direction dominates: close to 1
    assert rankme(shifted) < 1.5
    assert rankme(shifted) == pytest.approx(_rankme_numpy(shifted), rel=1e-10)


# ---------------------------------------------------------------------------------- RankMe


def test_rankme_known_answers():
    rng = np.random.default_rng(3)
    F = frame(32, 6, rng)  # 6 orthonormal rows: 6 singular values equal to 1
    # a 6 x 32 matrix has min(6, 32) = 6 singular values, all 1: p_k = 1/6 + eps and
    # RankMe = exp(-6 (1/6 + eps) log(1/6 + eps)), 6 up to ~1e-6
    expected = np.exp(-6 * (1 / 6 + 1e-7) * np.log(1 / 6 + 1e-7))
    assert rankme(F) == pytest.approx(expected, rel=1e-12)
    assert rankme(F) == pytest.approx(6.0, abs=1e-5)
    rank_one = np.outer(rng.normal(size=50), rng.normal(size=20))  # 20 singular values, 1 nonzero
    assert rankme(rank_one) == pytest.approx(1.0, abs=1e-4)  # eps * 19 terms: ~3e-5 above 1
    assert rankme(rank_one, eps=0.0) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("shape", [(400, 32), (16, 64)])
def test_rankme_matches_numpy(shape):
    rng = np.random.default_rng(4)
    Z = rng.normal(size=shape) * np.linspace(0.5, 2.0, shape[1]) + 1.0
    # same formula and data in float64; only the SVD routine differs
    assert rankme(torch.tensor(Z)) == pytest.approx(_rankme_numpy(Z), rel=1e-10)
    assert rankme(Z, eps=1e-3) == pytest.approx(_rankme_numpy(Z, eps=1e-3), rel=1e-10)


# ---------------------------------------------------------------------------------- PCA dimension


def test_pca_dimension_known_answers():
    rng = np.random.default_rng(5)
    X = equal_spread(10, 30, rng, offset=20.0)  # 10 equal variances
    # at least 90% of 10 equal parts is exactly 9 of them; 99% needs all 10
    assert pca_dimension(X) == 9
    assert pca_dimension(X, variance=0.99) == 10
    assert pca_dimension(X, variance=(0.9, 0.99, 1.0)) == (9, 10, 10)
    assert pca_dimension(X, variance=0.05) == 1
    rank_one = np.outer(rng.normal(size=100), rng.normal(size=12))
    assert pca_dimension(rank_one, variance=(0.9, 0.99)) == (1, 1)


def test_pca_dimension_variances():
    # variances 8, 4, 2, 1, 1 along axes (exactly, via +-e_i): shares .5, .75, .875, .9375, 1
    scale = np.sqrt(np.array([8.0, 4.0, 2.0, 1.0, 1.0]))
    X = np.concatenate([np.diag(scale), -np.diag(scale)])
    assert pca_dimension(X, variance=(0.5, 0.6, 0.875, 0.9, 0.95)) == (1, 2, 3, 4, 5)


def _sklearn_pca_dimension(X: np.ndarray, variance: float) -> int:
    return int(PCA(n_components=variance, svd_solver="full").fit(X).n_components_)


@pytest.mark.parametrize("shape", [(600, 40), (50, 120)])
@pytest.mark.parametrize("variance", [0.5, 0.9, 0.99])
def test_pca_dimension_matches_sklearn(shape, variance):
    rng = np.random.default_rng(6)
    # a decaying spectrum, like hidden states: variance of column j ~ 1/(j+1)
    X = rng.normal(size=shape) / np.sqrt(np.arange(1, shape[1] + 1)) + 3.0
    # sklearn asks for a share strictly above `variance`, we for at least: the same unless a
    # cumulative share equals a level exactly, which random data never do
    assert pca_dimension(torch.tensor(X), variance=variance) == _sklearn_pca_dimension(X, variance)


def test_pca_dimension_float32_input():
    g = torch.Generator().manual_seed(7)
    X = torch.randn(300, 20, generator=g) * torch.linspace(0.1, 4, 20)
    assert pca_dimension(X, variance=0.9) == _sklearn_pca_dimension(X.double().numpy(), 0.9)


# ---------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("fn", [effective_rank, pca_dimension])
@pytest.mark.parametrize(
    "X, match",
    [
        (torch.tensor([[1.0, float("nan")], [0.0, 1.0]]), "X contains .* NaN or Inf"),
        (torch.ones(1, 4), "X needs at least 2 rows"),
        (torch.ones(4), "X must be 2-D"),
        (torch.ones(5, 4), "X has zero variance"),
    ],
)
def test_input_errors(fn, X, match):
    with pytest.raises(ValueError, match=match):
        fn(X)


@pytest.mark.parametrize(
    "Z, kwargs, match",
    [
        (torch.zeros(3, 4), {}, "Z is all zeros"),
        (torch.ones(3), {}, "Z must be 2-D"),
        (torch.ones(3, 4), {"eps": -1.0}, "eps must be"),
        (torch.ones(3, 4), {"eps": "a"}, "eps must be"),
    ],
)
def test_rankme_errors(Z, kwargs, match):
    with pytest.raises(ValueError, match=match):
        rankme(Z, **kwargs)


@pytest.mark.parametrize("variance", [0.0, 1.5, -0.1, "x", (), (0.9, 2.0)])
def test_pca_dimension_variance_errors(variance):
    with pytest.raises(ValueError, match="variance"):
        pca_dimension(torch.randn(20, 3), variance=variance)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu():
    X = torch.randn(800, 48, generator=torch.Generator().manual_seed(8))
    X = X * torch.linspace(0.1, 3, 48)
    # float64 SVD / eigendecomposition on either device (cuSOLVER vs LAPACK): ~1e-13
    assert effective_rank(X.cuda()) == pytest.approx(effective_rank(X), rel=1e-10)
    assert rankme(X.cuda()) == pytest.approx(rankme(X), rel=1e-10)
    assert pca_dimension(X.cuda(), variance=(0.9, 0.99)) == pca_dimension(X, variance=(0.9, 0.99))
