"""Query/key metrics of one layer: alignment of the mean query and mean key, per head and heads
concatenated, the statistics of the pre-softmax scores, and the scores themselves (Godey et al.
2024, figs. 7, 10, 13, 14, 23). The entropy of the attention rows is in
`repgeom.metrics.attention.entropy`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from repgeom.metrics._validation import as_tensor, check_finite, check_valid_mask

__all__ = ["QKAlignmentResult", "attention_scores", "qk_alignment", "qk_cosine_concat"]


@dataclass(frozen=True, eq=False)
class QKAlignmentResult:
    """Per-head query/key statistics; every field an ndarray (H,), float64.

    cosine, dot : cosine and scalar product of the mean query and the mean key.
    score_mean, score_std, score_max_abs : statistics of ``Q K^T / sqrt(D)`` over the
        (query, key) pairs counted (causal pairs only when ``causal=True``).
    """

    cosine: np.ndarray
    dot: np.ndarray
    score_mean: np.ndarray
    score_std: np.ndarray
    score_max_abs: np.ndarray


def _blocked(t0: int, t1: int, width: int, causal: bool, device) -> torch.Tensor:
    """(t1 - t0, width) bool: True where query t0 + i may not attend to key j."""
    if not causal:
        return torch.zeros(t1 - t0, width, dtype=torch.bool, device=device)
    t = torch.arange(t0, t1, device=device)[:, None]
    return torch.arange(width, device=device)[None, :] > t


def _attendable(T: int, causal: bool, device) -> torch.Tensor:
    """(T, T) bool: True where query t may attend to key j."""
    if causal:
        return torch.ones(T, T, dtype=torch.bool, device=device).tril()  # (T, T)
    return torch.ones(T, T, dtype=torch.bool, device=device)


def qk_alignment(queries, keys, *, causal: bool = True, valid=None) -> QKAlignmentResult:
    r"""Alignment of the mean query and mean key, and pre-softmax score statistics, per head.

    .. math:: \bar q = \frac{1}{N}\sum_{b,t} q_{bt}, \quad \bar k = \frac{1}{N}\sum_{b,t} k_{bt},
              \quad \cos(\bar q, \bar k), \quad \bar q^\top \bar k

    over all (valid) tokens (Godey et al. 2024, figs. 13, 14: a shared drift of queries and
    keys makes every score large and attention degenerate), and mean, standard deviation and
    max absolute value of the scores :math:`s_{tj} = q_t^\top k_j / \sqrt{D}` over the pairs a
    query may attend to (``j <= t`` when ``causal``, same sequence only).

    Parameters
    ----------
    queries, keys : Tensor, shape (B, H, T, D)
        Per-head queries and keys as they enter ``softmax(Q K^T / sqrt(D))`` (after any rotary
        embedding); any float dtype and device. The means and the score mean in float64 (the
        mean score from a cumulative sum of the keys); the score spread and extreme from
        float32 products (float64 input: float64) centred on that mean, ~1e-7 relative.
    causal : bool, keyword-only
        Count only ``j <= t`` pairs in the score statistics (default True, the project's GPT).
    valid : Tensor of bool, shape (B, T), optional, keyword-only
        Positions to include; invalid positions are dropped as queries *and* keys.

    Returns
    -------
    QKAlignmentResult

    Examples
    --------
    >>> import torch
    >>> q = torch.tensor([1.0, 0.0]).expand(1, 1, 3, 2)
    >>> k = torch.tensor([1.0, 1.0]).expand(1, 1, 3, 2)
    >>> r = qk_alignment(q, k)
    >>> round(float(r.cosine[0]), 4), float(r.dot[0])
    (0.7071, 1.0)
    """
    Q, K = _check_qk(queries, keys)
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    B, H, T, D = Q.shape
    v = check_valid_mask(valid, "valid", B, T, Q.device)
    return _qk_alignment(Q, K, causal, v)


def _check_qk(queries, keys) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head queries and keys of one layer as two finite (B, H, T, D) tensors on Q's device."""
    Q = as_tensor(queries, "queries")
    K = as_tensor(keys, "keys")
    if Q.ndim != 4:
        raise ValueError(f"queries must have shape (B, H, T, D), got {tuple(Q.shape)}")
    if K.shape != Q.shape:
        raise ValueError(
            f"keys must have the same shape as queries {tuple(Q.shape)}, got {tuple(K.shape)}"
        )
    B, H, T, D = Q.shape
    if B * T < 1 or D < 1:
        raise ValueError(f"queries is empty: shape {tuple(Q.shape)}")
    check_finite(Q, "queries")
    check_finite(K, "keys")
    return Q, K.to(Q.device)


_SCORE_ROWS = 128
"""Query rows whose scores are made at a time under a causal mask: rows t0..t0+127 need keys
0..t0+127 only, so the triangle is covered block by block."""

_SCORE_CHUNK = 1 << 24
"""Scores materialised at a time (64 MB of float32): whole sequences, as many as fit."""


def _qk_alignment(Q, K, causal, valid) -> QKAlignmentResult:
    B, H, T, D = Q.shape
    if valid is None:
        valid = torch.ones(B, T, dtype=torch.bool, device=Q.device)
    w = valid[:, None, :, None].to(torch.float64)  # (B, 1, T, 1)
    n_tok = w.sum()
    Qw = Q.to(torch.float64) * w  # (B, H, T, D), invalid positions zero
    Kw = K.to(torch.float64) * w
    q_mean = Qw.sum(dim=(0, 2)) / n_tok  # (H, D)
    k_mean = Kw.sum(dim=(0, 2)) / n_tok  # (H, D)
    dot = (q_mean * k_mean).sum(dim=-1)  # (H,)
    denom = torch.linalg.vector_norm(q_mean, dim=-1) * torch.linalg.vector_norm(k_mean, dim=-1)
    cos = torch.where(denom > 0, dot / denom.clamp(min=1e-300), torch.zeros_like(dot))

    # The sum of the scores over the counted pairs without the scores: sum_t q_t . sum_{j<=t} k_j
    # (a cumulative sum of the keys), exact in float64 at O(T D) per head instead of O(T^2 D).
    v = valid.to(torch.float64)  # (B, T)
    if causal:
        k_seen = Kw.cumsum(dim=2)  # (B, H, T, D): sum of the valid keys up to t
        n_pairs = (v * v.cumsum(dim=1)).sum()
    else:
        k_seen = Kw.sum(dim=2, keepdim=True)
        n_pairs = (v.sum(dim=1) ** 2).sum()
    mean = (Qw * k_seen).sum(dim=(0, 2, 3)) / math.sqrt(D) / n_pairs  # (H,)
    # The spread and the extreme need every score: float32 products (float64 input stays
    # float64), centred on the exact mean before squaring so no cancellation is left; the
    # deviations are summed per sequence and head in the products' dtype (pairwise summation,
    # ~1e-7 relative) and accumulated in float64. Under a causal mask rows t0..t1 need keys up
    # to t1 only, so the scores are made block by block over the triangle. Blocked pairs are
    # set to the mean's deviation 0, which lies between the smallest and largest counted score,
    # so the extremes of the deviations are those of the counted pairs.
    work = Q.dtype if Q.dtype in (torch.float32, torch.float64) else torch.float32
    Qs, Ks = Q.to(work) / math.sqrt(D), K.to(work)
    centre = mean.to(work)[None, :, None, None]  # (1, H, 1, 1)
    all_valid = bool(valid.all())
    s2 = torch.zeros(H, dtype=torch.float64, device=Q.device)
    hi = torch.full((H,), -math.inf, dtype=torch.float64, device=Q.device)
    lo = torch.full((H,), math.inf, dtype=torch.float64, device=Q.device)
    rows = _SCORE_ROWS if causal else T
    for t0 in range(0, T, rows):
        t1 = min(t0 + rows, T)
        width = t1 if causal else T
        step = max(1, _SCORE_CHUNK // (H * (t1 - t0) * width))
        for b0 in range(0, B, step):
            b1 = min(b0 + step, B)
            dev = Qs[b0:b1, :, t0:t1] @ Ks[b0:b1, :, :width].transpose(-1, -2)  # (b, H, r, W)
            dev -= centre
            off = _blocked(t0, t1, width, causal, Q.device)  # (r, W)
            if not all_valid:
                off = off | ~(valid[b0:b1, t0:t1, None] & valid[b0:b1, None, :width])[:, None]
            dev.masked_fill_(off, 0.0)
            s2 += (dev * dev).sum(dim=(2, 3)).to(torch.float64).sum(dim=0)
            hi = torch.maximum(hi, dev.amax(dim=(0, 2, 3)).to(torch.float64))
            lo = torch.minimum(lo, dev.amin(dim=(0, 2, 3)).to(torch.float64))
    smax = torch.maximum((hi + mean).abs(), (lo + mean).abs())
    std = torch.sqrt(s2 / n_pairs)

    def np_(x):
        return x.cpu().numpy()

    return QKAlignmentResult(cosine=np_(cos), dot=np_(dot), score_mean=np_(mean),
                             score_std=np_(std), score_max_abs=np_(smax))


def qk_cosine_concat(queries, keys, *, valid=None) -> float:
    r"""Cosine of the mean query and the mean key of one layer, heads concatenated.

    .. math:: \bar q = \frac{1}{N}\sum_{b,t} [q^1_{bt}; \dots; q^H_{bt}], \quad
              \bar k = \frac{1}{N}\sum_{b,t} [k^1_{bt}; \dots; k^H_{bt}], \quad
              \cos(\bar q, \bar k) = \frac{\sum_h \bar q_h^\top \bar k_h}
                                     {\lVert \bar q \rVert\, \lVert \bar k \rVert}

    over all (valid) tokens: Godey et al. 2024, appendix C, Fig. 23 ("representations are
    concatenated across heads"), the per-layer companion of the per-head cosine of their Fig. 13
    (`qk_alignment`'s ``cosine``). It is the per-head cosines weighted by
    :math:`\lVert \bar q_h \rVert \lVert \bar k_h \rVert`, so heads with a large common
    drift dominate it, and it is *not* the mean of the per-head cosines: head 1 aligned (+1)
    and head 2 opposed (-1) average to 0, but concatenate to the sign of the stronger drift.

    Parameters
    ----------
    queries, keys : Tensor, shape (B, H, T, D)
        Per-head queries and keys as they enter ``softmax(Q K^T / sqrt(D))`` (as for
        `qk_alignment`); any float dtype and device (reduced in float64).
    valid : Tensor of bool, shape (B, T), optional, keyword-only
        Token positions to average over (e.g. not padding); all when None.

    Returns
    -------
    float in [-1, 1]; 0 when the mean query or the mean key is the zero vector (no direction).

    Raises
    ------
    ValueError
        If the inputs are not (B, H, T, D) of one shape, are empty or not finite, or ``valid``
        has the wrong shape or marks no position.

    Examples
    --------
    >>> import torch
    >>> q = torch.tensor([[1.0, 0.0], [0.0, 3.0]]).view(1, 2, 1, 2)  # heads (1, 0) and (0, 3)
    >>> k = torch.tensor([[1.0, 0.0], [0.0, -1.0]]).view(1, 2, 1, 2)  # per-head cos +1 and -1
    >>> round(qk_cosine_concat(q, k), 4)  # (1 - 3) / (sqrt(10) sqrt(2))
    -0.4472
    """
    Q, K = _check_qk(queries, keys)
    B, H, T, D = Q.shape
    v = check_valid_mask(valid, "valid", B, T, Q.device)
    return _qk_cosine_concat(Q, K, v)


def _qk_cosine_concat(Q: torch.Tensor, K: torch.Tensor, valid: torch.Tensor | None) -> float:
    B, H, T, D = Q.shape
    w = (torch.ones(B, T, device=Q.device) if valid is None else valid).to(torch.float64)
    w = w[:, None, :, None]  # (B, 1, T, 1)
    q_mean = ((Q.to(torch.float64) * w).sum(dim=(0, 2)) / w.sum()).reshape(H * D)  # (H D,)
    k_mean = ((K.to(torch.float64) * w).sum(dim=(0, 2)) / w.sum()).reshape(H * D)
    denom = float(torch.linalg.vector_norm(q_mean) * torch.linalg.vector_norm(k_mean))
    return float(q_mean @ k_mean) / denom if denom > 0 else 0.0


def attention_scores(queries, keys, *, causal: bool) -> torch.Tensor:
    r"""Pre-softmax attention scores :math:`s_{tj} = q_t^\top k_j / \sqrt{D}`, per head.

    The scores whose histograms Godey et al. 2024 draw in Fig. 7 (section 4.3,
    :math:`QK^T/\sqrt{d_k}`) and whose extremes over whole sequences they compare in Fig. 10.
    Positions a query may not attend to (``j > t`` when ``causal``) are ``-inf``, so
    ``scores.softmax(-1)`` is the model's attention (``output_attentions``) when ``queries`` and
    ``keys`` are what the model multiplies (`repgeom.models.capture.Capture`) and it adds no
    position bias to the scores (T5's relative bias and BLOOM's ALiBi are not part of Q K^T:
    `repgeom.models.hf`), and a row's maximum is its largest attendable score.

    Parameters
    ----------
    queries, keys : Tensor, shape (B, H, T, D)
        Any float dtype and device; the scores are computed in float64 on that device.
    causal : bool, keyword-only
        Whether query t may attend only to keys ``j <= t`` (decoders).

    Returns
    -------
    Tensor, shape (B, H, T, T), float64: query dim -2, key dim -1.

    Raises
    ------
    ValueError
        If the inputs are not finite (B, H, T, D) tensors of one shape, or ``causal`` is not
        a bool.

    Examples
    --------
    >>> import torch
    >>> q = torch.tensor([[2.0, 0.0], [0.0, 2.0]]).view(1, 1, 2, 2)
    >>> attention_scores(q, q, causal=True)[0, 0]  # D = 2: q.k / sqrt(2)
    tensor([[2.8284,   -inf],
            [0.0000, 2.8284]], dtype=torch.float64)
    """
    Q, K = _check_qk(queries, keys)
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    D = Q.shape[-1]
    S = Q.to(torch.float64) @ K.to(torch.float64).transpose(-1, -2) / math.sqrt(D)  # (B,H,T,T)
    if causal:
        S = S.masked_fill(~_attendable(S.shape[-1], True, S.device), -math.inf)
    return S
