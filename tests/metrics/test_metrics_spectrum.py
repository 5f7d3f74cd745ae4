"""Inside `shared_spectrum` the metrics that read a batch's centred states and scatter
eigenvalues share one computation, and give exactly the numbers they give alone."""

import torch

from repgeom import metrics
from repgeom.metrics import _spectrum


def _values(X: torch.Tensor) -> list[float]:
    pca = metrics.pca_dimension(X, variance=(0.9, 0.99))
    return [metrics.anisotropy(X), metrics.isoscore(X), *pca, metrics.effective_rank(X),
            metrics.rankme(X)]


def test_shared_spectrum_computes_once_and_changes_no_number(monkeypatch) -> None:
    X = torch.randn(300, 12, generator=torch.Generator().manual_seed(0)) * torch.arange(1, 13)
    alone = _values(X)
    calls = []
    eigvalsh = torch.linalg.eigvalsh
    monkeypatch.setattr(torch.linalg, "eigvalsh", lambda A: calls.append(A.shape) or eigvalsh(A))
    eigh_calls = []
    eigh = torch.linalg.eigh
    monkeypatch.setattr(torch.linalg, "eigh", lambda A: eigh_calls.append(A.shape) or eigh(A))
    with _spectrum.shared_spectrum():
        shared = _values(X)
        # anisotropy, IsoScore and the PCA dimension: one decomposition; the effective rank
        # and RankMe one with eigenvectors (no eigenvalue below 1e-6 of the largest to refine)
        assert len(calls) == 1 and len(eigh_calls) == 1
        X.mul_(2.0)  # an in-place change is noticed
        doubled = _values(X)
        assert len(calls) == 2 and len(eigh_calls) == 2
    assert shared == alone  # bit for bit
    assert doubled[2:4] == alone[2:4] and abs(doubled[0] - alone[0]) < 1e-12
    outside = _values(X)  # nothing kept after the block
    assert len(calls) == 5 and len(eigh_calls) == 4 and outside == doubled


def test_small_batches_read_the_gram_matrix() -> None:
    X = torch.randn(5, 40, generator=torch.Generator().manual_seed(1))
    with _spectrum.shared_spectrum():
        inside = metrics.pca_dimension(X, variance=(0.5, 0.9))
    assert inside == metrics.pca_dimension(X, variance=(0.5, 0.9))
