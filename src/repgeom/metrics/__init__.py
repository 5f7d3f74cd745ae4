"""Geometry metrics of hidden states: pure functions on torch tensors (any device).

Each public function validates its inputs (``ValueError`` naming the argument) and calls a
private one that computes. See each docstring for the formula and the paper it follows.

Modules:

- ``anisotropy``: share of variance along the first principal direction.
- ``cosine``: mean pairwise cosine and its isotropic chance level.
- ``drift``: the common offset of the states.
- ``rank``: effective rank (Roy & Vetterli, centred), RankMe (Garrido et al.), PCA dimension.
- ``powerlaw``: alpha-ReQ (Agrawal et al.), the power-law decay of the covariance spectrum.
- ``isoscore``: IsoScore (Rudman et al.), uniformity of the variance over dimensions.
- ``twonn``: TwoNN (Facco et al.) in DADApy's and scikit-dimension's convention;
  ``twonn_authors``: TwoNN in the convention of the Shape of Learning authors' llm-microscope.
- ``linearity``: Procrustes linearity score of two paired state sets (Razzhigaev et al. 2024).
- ``gride``: multi-scale GRIDE (Denti et al.); ``mle``: Levina-Bickel MLE;
  ``near_duplicates``: the near-duplicate share; ``knn_batches``: the shuffled, deduplicated
  batches and the one exact kNN search per batch (``neighbors``) they all read;
  ``intrinsic_dimension``: all four from that one search (the probe's entry point).
- ``id_scales``: the intrinsic dimension against scale, TwoNN by decimation (Facco et al.) and
  the plateau of a profile.
- ``alignment``: similarity of two paired state sets, linear CKA (Kornblith et al.) and
  mutual-kNN alignment (Huh et al.), and CKA from the unbiased HSIC (Song et al.).
- ``similarity``: pooled similarity of two texts, token cosine matrix.
- ``attention``: ``entropy``, attention entropy; ``qk``, QK alignment (per head and heads
  concatenated), pre-softmax scores.
- ``distributions``: activation laws.
"""

from .alignment import linear_cka, linear_cka_unbiased, mutual_knn
from .anisotropy import anisotropy
from .attention.entropy import AttentionResult, attention_entropy
from .attention.qk import QKAlignmentResult, attention_scores, qk_alignment, qk_cosine_concat
from .cosine import (
    isotropic_cosine_baseline,
    isotropic_mean_cosine_chance,
    mean_cosine_similarity,
)
from .distributions import FAMILIES, DistributionResult, activation_distribution
from .drift import DriftResult, drift
from .intrinsic_dimension import IntrinsicDimensionResult, intrinsic_dimension
from .intrinsic_dimension.gride import GrideResult, gride
from .intrinsic_dimension.id_scales import (
    PlateauResult,
    TwoNNDecimationResult,
    id_plateau,
    twonn_decimation,
)
from .intrinsic_dimension.knn_batches import batch_indices
from .intrinsic_dimension.mle import MLEResult, mle_dimension
from .intrinsic_dimension.near_duplicates import near_duplicate_share
from .intrinsic_dimension.twonn import TwoNNResult, twonn
from .intrinsic_dimension.twonn_authors import TwoNNAuthorsResult, twonn_authors
from .isoscore import isoscore
from .linearity import linearity
from .neighbors import faiss_has_gpu, nearest_neighbors
from .powerlaw import AlphaReQResult, alpha_req
from .rank import effective_rank, pca_dimension, rankme
from .similarity import layer_pooled_similarity, pooled_similarity, token_cosine_matrix

__all__ = [
    "linearity",
    "twonn_authors",
    "TwoNNAuthorsResult",
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
    "mle_dimension",
    "MLEResult",
    "near_duplicate_share",
    "intrinsic_dimension",
    "IntrinsicDimensionResult",
    "twonn_decimation",
    "TwoNNDecimationResult",
    "id_plateau",
    "PlateauResult",
    "attention_entropy",
    "AttentionResult",
    "qk_alignment",
    "QKAlignmentResult",
    "qk_cosine_concat",
    "attention_scores",
    "activation_distribution",
    "DistributionResult",
    "FAMILIES",
    "pooled_similarity",
    "layer_pooled_similarity",
    "token_cosine_matrix",
    "effective_rank",
    "rankme",
    "alpha_req",
    "AlphaReQResult",
    "pca_dimension",
    "isoscore",
    "linear_cka",
    "linear_cka_unbiased",
    "mutual_knn",
]
