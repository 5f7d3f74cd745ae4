import math

import numpy as np
import pytest
import torch
from sklearn.decomposition import PCA

from repgeom.metrics import isoscore


@pytest.fixture(scope="module")
def reference_isoscore():
    """The authors' implementation, PyPI ``isoscore`` 2.0.1 (``IsoScore.IsoScore.IsoScore``).

    It needs only torch (which it does not declare); requirements-dev.txt installs it with
    ``--no-deps`` so pip never touches torch. It takes a numpy array and returns a 0-d float64
    tensor for float64 input, but builds its constants from ``torch.tensor(D)``, an int64
    tensor, so ``sqrt(D)``, ``sqrt(2 (D - sqrt D))`` and the ones vector are float32: its
    scores carry ~1e-8 relative error (see test_matches_algorithm_1_in_float64).
    """
    mod = pytest.importorskip(
        "IsoScore.IsoScore", reason="pip install --no-deps isoscore==2.0.1"
    )
    return lambda X: float(mod.IsoScore(np.asarray(X, dtype=np.float64)))


def _clouds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    n, D = 4000, 16
    Q, _ = np.linalg.qr(rng.normal(size=(D, D)))
    return {
        "isotropic": rng.normal(size=(n, D)),
        "one_direction": np.outer(rng.normal(size=n), rng.normal(size=D)) + 5.0,
        "anisotropic": rng.normal(size=(n, D)) * np.geomspace(0.05, 3.0, D) @ Q.T,
        "half_used": np.concatenate([rng.normal(size=(n, D // 2)), np.zeros((n, D // 2))], 1) @ Q,
        "offset": rng.normal(size=(n, D)) * np.linspace(0.5, 1.5, D) + 1e3,
        "few_points": rng.normal(size=(10, D)),  # n < D: at most 9 nonzero variances
    }


CLOUDS = _clouds()


@pytest.mark.parametrize("name", list(CLOUDS))
def test_matches_the_authors_package(name, reference_isoscore):
    X = CLOUDS[name]
    # same spectrum in float64 (eigvalsh of the scatter matrix vs svdvals of torch.cov) and the
    # same closed-form steps, but the package's float32 constants (fixture docstring) leave
    # differences of up to ~4e-8 on these clouds: 1e-6, the task's tolerance
    assert isoscore(torch.tensor(X)) == pytest.approx(reference_isoscore(X), abs=1e-6)


def _algorithm_1(X: np.ndarray) -> float:
    """Rudman et al. 2022, Algorithm 1, step by step in float64 (independent of our code: PCA
    by scikit-learn, variances by numpy)."""
    D = X.shape[1]
    X_pca = PCA(n_components=min(X.shape), svd_solver="full").fit_transform(X)  # 1. reorient
    var = np.zeros(D)
    var[: X_pca.shape[1]] = np.var(X_pca, axis=0)  # 2. variance vector (0 beyond the rank)
    var_hat = np.sqrt(D) * var / np.linalg.norm(var)  # 3. normalise to length sqrt(D)
    delta = np.linalg.norm(var_hat - 1) / np.sqrt(2 * (D - np.sqrt(D)))  # 4. isotropy defect
    phi = (D - delta**2 * (D - np.sqrt(D))) ** 2 / D**2  # 5. fraction of dimensions used
    return float((D * phi - 1) / (D - 1))  # 6. IsoScore


@pytest.mark.parametrize("name", list(CLOUDS))
def test_matches_algorithm_1_in_float64(name):
    X = CLOUDS[name]
    # both in float64 throughout; eigenvalues vs squared singular values of the centred data
    # differ by ~1e-15 relative, the score by ~1e-13
    assert isoscore(X) == pytest.approx(_algorithm_1(X), abs=1e-10)


def test_known_answers():
    X = CLOUDS["isotropic"]
    # 4000 samples in 16-D: sample variances along the principal axes spread by ~ +-2 sqrt(D/n)
    # (Marchenko-Pastur), which costs IsoScore about 1%; the paper's Gaussian example is ~0.99
    assert isoscore(X) == pytest.approx(1.0, abs=0.03)
    # one direction: variance vector (sqrt D, 0, ..., 0) after normalisation, defect 1, score 0
    assert isoscore(CLOUDS["one_direction"]) == pytest.approx(0.0, abs=1e-9)
    # exactly equal variances along D axes (+-e_i): score 1 up to rounding
    D = 8
    assert isoscore(np.concatenate([np.eye(D), -np.eye(D)])) == pytest.approx(1.0, abs=1e-12)


def test_half_the_dimensions_exactly():
    # equal variance in k of D dims: Sigma_hat = sqrt(D/k) on k entries, so
    # ||Sigma_hat - 1||^2 = k (sqrt(D/k) - 1)^2 + (D - k) = 2 (D - sqrt(D k)) and
    # delta^2 = (D - sqrt(Dk)) / (D - sqrt D); phi = k / D; score = (k - 1)/(D - 1)
    D, k = 16, 8
    X = np.concatenate([np.eye(D)[:k], -np.eye(D)[:k]])
    assert math.isclose(isoscore(X), (k - 1) / (D - 1), abs_tol=1e-12)
    dims_used = 1 + (D - 1) * isoscore(X)  # D phi
    assert dims_used == pytest.approx(k, abs=1e-9)


def test_invariant_to_rotation_scale_and_offset():
    X = CLOUDS["anisotropic"]
    Q, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(16, 16)))
    # float64 eigenvalues of rotated/scaled scatter matrices: ~1e-13
    assert isoscore(3.0 * X @ Q + 10.0) == pytest.approx(isoscore(X), abs=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_input(dtype, reference_isoscore):
    X = torch.tensor(CLOUDS["anisotropic"]).to(dtype)
    # computed in float64 on the upcast values: same as the reference on those values (1e-6:
    # the reference's float32 constants)
    assert isoscore(X) == pytest.approx(reference_isoscore(X.double().numpy()), abs=1e-6)


@pytest.mark.parametrize(
    "X, match",
    [
        (torch.tensor([[1.0, float("nan")], [0.0, 1.0]]), "X contains .* NaN or Inf"),
        (torch.ones(1, 4), "X needs at least 2 rows"),
        (torch.ones(5, 1), r"X needs at least 2 column\(s\)"),
        (torch.ones(4), "X must be 2-D"),
        (torch.ones(5, 4), "X has zero variance"),
    ],
)
def test_errors(X, match):
    with pytest.raises(ValueError, match=match):
        isoscore(X)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu():
    X = torch.tensor(CLOUDS["anisotropic"], dtype=torch.float32)
    # float64 eigendecomposition on either device: ~1e-13
    assert isoscore(X.cuda()) == pytest.approx(isoscore(X), abs=1e-10)
