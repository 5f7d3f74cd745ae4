"""Geometry metrics of hidden states: pure functions on torch tensors (any device).

Each public function validates its inputs (``ValueError`` naming the argument) and calls a
private one that computes. See each docstring for the formula and the paper it follows.
"""

from .anisotropy import anisotropy
from .attention import AttentionResult, QKAlignmentResult, attention_entropy, qk_alignment
from .cosine import (
    isotropic_cosine_baseline,
    isotropic_mean_cosine_chance,
    mean_cosine_similarity,
)
from .distributions import FAMILIES, DistributionResult, activation_distribution
from .drift import DriftResult, drift
from .intrinsic_dimension import (
    GrideResult,
    IntrinsicDimensionResult,
    TwoNNResult,
    batch_indices,
    gride,
    intrinsic_dimension,
    near_duplicate_share,
    twonn,
)
from .neighbors import faiss_has_gpu, nearest_neighbors
from .similarity import pooled_similarity, token_cosine_matrix

__all__ = [
    "batch_indices",
    "anisotropy",
    "mean_cosine_similarity",
    "isotropic_cosine_baseline",
    "isotropic_mean_cosine_chance",
    "drift",
    "DriftResult",
    "nearest_neighbors",
    "faiss_has_gpu",
    "twonn",
    "TwoNNResult",
    "gride",
    "GrideResult",
    "near_duplicate_share",
    "intrinsic_dimension",
    "IntrinsicDimensionResult",
    "attention_entropy",
    "AttentionResult",
    "qk_alignment",
    "QKAlignmentResult",
    "activation_distribution",
    "DistributionResult",
    "FAMILIES",
    "pooled_similarity",
    "token_cosine_matrix",
]
