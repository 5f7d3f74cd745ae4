"""Similarity between texts (pooled) and between the tokens of one text."""

from __future__ import annotations

import torch

from ._validation import check_matrix

__all__ = ["pooled_similarity", "layer_pooled_similarity", "token_cosine_matrix"]


def pooled_similarity(A, B) -> float:
    r"""Cosine similarity of two texts' mean-pooled states at one layer.

    .. math:: \cos(\bar a, \bar b), \qquad \bar a = \tfrac{1}{T_A} \sum_t a_t

    As in the "GPT-2's anisotropic antics" study: with a large common offset, any two texts
    look similar after pooling; compare against :func:`repgeom.metrics.drift`.

    Parameters
    ----------
    A : Tensor or ndarray, shape (T_A, d)
        States of text A at one layer.
    B : Tensor or ndarray, shape (T_B, d)
        States of text B at the same layer (same ``d``; ``T_B`` may differ).

    Returns
    -------
    float in [-1, 1]

    Raises
    ------
    ValueError
        On wrong shapes, mismatched ``d``, NaN/Inf, or a zero pooled vector.

    Examples
    --------
    >>> import torch
    >>> A, B = torch.tensor([[1.0, 0.0], [1.0, 2.0]]), torch.tensor([[2.0, 2.0]])
    >>> round(pooled_similarity(A, B), 6)
    1.0
    """
    A = check_matrix(A, "A", min_rows=1)
    B = check_matrix(B, "B", min_rows=1)
    if A.shape[1] != B.shape[1]:
        raise ValueError(
            f"A and B must have the same number of features, got {A.shape[1]} and {B.shape[1]}"
        )
    return _pooled_similarity(A, B)


def layer_pooled_similarity(A, B) -> list[float]:
    """`pooled_similarity` of two texts at every layer: the pooled cosine of compare mode and
    of the similarity analysis.

    Parameters
    ----------
    A, B : sequences of Tensor or ndarray, shapes (T_A, d_l) and (T_B, d_l)
        The two texts' states, one entry per layer (as many in each).

    Returns
    -------
    list of float, one per layer

    Examples
    --------
    >>> import torch
    >>> A = [torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])]
    >>> B = [torch.tensor([[2.0, 0.0]]), torch.tensor([[1.0, 0.0]])]
    >>> layer_pooled_similarity(A, B)
    [1.0, 0.0]
    """
    if len(A) != len(B):
        raise ValueError(f"A and B must have as many layers, got {len(A)} and {len(B)}")
    return [pooled_similarity(a, b) for a, b in zip(A, B, strict=True)]


def _pooled_similarity(A: torch.Tensor, B: torch.Tensor) -> float:
    a = A.to(torch.float64).mean(dim=0)
    b = B.to(torch.float64).mean(dim=0).to(a.device)
    na, nb = torch.linalg.vector_norm(a), torch.linalg.vector_norm(b)
    if float(na) == 0.0 or float(nb) == 0.0:
        raise ValueError("the mean of A or of B is the zero vector; its cosine is undefined")
    return float(torch.clamp((a @ b) / (na * nb), -1.0, 1.0))


def token_cosine_matrix(X) -> torch.Tensor:
    r"""Matrix of cosine similarities between all pairs of rows (tokens) of one text.

    .. math:: C_{ij} = \frac{x_i^\top x_j}{\lVert x_i \rVert \lVert x_j \rVert}

    Parameters
    ----------
    X : Tensor or ndarray, shape (T, d)
        States of one text at one layer.

    Returns
    -------
    Tensor, shape (T, T), float32 (float64 if ``X`` is float64), on ``X``'s device
        Symmetric with ones on the diagonal; rows of ``X`` that are all zero give zero rows.

    Examples
    --------
    >>> import torch
    >>> token_cosine_matrix(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
    tensor([[1., 0.],
            [0., 1.]])
    """
    X = check_matrix(X, "X", min_rows=1)
    return _token_cosine_matrix(X)


def _token_cosine_matrix(X: torch.Tensor) -> torch.Tensor:
    dtype = torch.float64 if X.dtype == torch.float64 else torch.float32
    U = torch.nn.functional.normalize(X.to(dtype), dim=1)  # (T, d), zero rows stay zero
    C = U @ U.T  # (T, T)
    return C.clamp_(-1.0, 1.0)
