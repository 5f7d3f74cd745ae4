"""Attention metrics: entropy of attention rows, query/key alignment, pre-softmax scores."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ._validation import as_tensor, check_finite, check_valid_mask

__all__ = [
    "AttentionResult",
    "QKAlignmentResult",
    "attention_entropy",
    "attention_scores",
    "qk_alignment",
    "qk_cosine_concat",
]


@dataclass(frozen=True, eq=False)
class AttentionResult:
    """Per-head means over the counted attention rows; every field an ndarray (H,), float64.

    entropy : mean Shannon entropy (nats) of a row over its attendable positions.
    normalized_entropy : mean of entropy / log(number of attendable positions), in [0, 1].
    max_prob, median_prob, min_prob : mean over rows of the row's max / median / min
        probability over its attendable positions.
    n_rows : int, rows counted per head (the same for every head).
    """

    entropy: np.ndarray
    normalized_entropy: np.ndarray
    max_prob: np.ndarray
    median_prob: np.ndarray
    min_prob: np.ndarray
    n_rows: int


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


def attention_entropy(probs, *, causal: bool, valid=None, tol: float = 1e-2) -> AttentionResult:
    r"""Entropy and peakedness of one layer's attention rows, per head.

    For query row t with attendable key set :math:`A_t` (all T keys, or :math:`j \le t` when
    ``causal``) and probabilities :math:`p_{tj}`:

    .. math:: H_t = -\sum_{j \in A_t} p_{tj} \log p_{tj}, \qquad
              \tilde H_t = H_t / \log |A_t|

    averaged over batch and query positions per head, together with the mean of each row's
    max, median and min of :math:`p_{tj}, j \in A_t` (Godey et al. 2024, figs. 9, 10, 15).
    Uniform attention over k positions gives :math:`\log k` and :math:`\tilde H = 1`; one-hot
    attention gives 0.

    Rows with a single attendable position (the first query under a causal mask) are not
    counted: their entropy is 0 by construction and the normalised entropy undefined.

    Parameters
    ----------
    probs : Tensor, shape (B, H, T, T)
        Softmax probabilities (query dim -2, key dim -1); any float dtype and device. Each
        row is reduced in the input's precision (float32 at least: ~1e-7 relative for a row of
        512) and the means over rows in float64.
    causal : bool, keyword-only
        Whether query t may attend only to keys ``j <= t``.
    valid : Tensor of bool, shape (B, T), optional, keyword-only
        Query positions to include (e.g. not padding). Keys are not masked.
    tol : float, keyword-only
        Allowed deviation of a counted row's attendable mass from 1 (1e-2 accepts bf16 rows);
        larger deviations raise, as they mean scores instead of probabilities, or the wrong
        ``causal``.

    Returns
    -------
    AttentionResult

    Examples
    --------
    >>> import torch
    >>> p = torch.full((1, 2, 4, 4), 0.25)  # uniform over 4 keys
    >>> r = attention_entropy(p, causal=False)
    >>> r.entropy.round(4).tolist(), r.normalized_entropy.round(6).tolist()
    ([1.3863, 1.3863], [1.0, 1.0])
    """
    P = as_tensor(probs, "probs")
    if P.ndim != 4 or P.shape[-1] != P.shape[-2]:
        raise ValueError(f"probs must have shape (B, H, T, T), got {tuple(P.shape)}")
    B, H, T, _ = P.shape
    if T < 2:
        raise ValueError(f"probs needs at least T = 2 positions, got T = {T}")
    check_finite(P, "probs")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    v = check_valid_mask(valid, "valid", B, T, P.device)
    return _attention_entropy(P, causal, v, tol)


def _blocked(t0: int, t1: int, width: int, causal: bool, device) -> torch.Tensor:
    """(t1 - t0, width) bool: True where query t0 + i may not attend to key j."""
    if not causal:
        return torch.zeros(t1 - t0, width, dtype=torch.bool, device=device)
    t = torch.arange(t0, t1, device=device)[:, None]
    return torch.arange(width, device=device)[None, :] > t


def _attendable(T: int, causal: bool, device) -> torch.Tensor:
    if causal:
        return torch.ones(T, T, dtype=torch.bool, device=device).tril()  # (T, T)
    return torch.ones(T, T, dtype=torch.bool, device=device)


_ROW_BLOCK = 64
"""Query rows reduced at a time: under a causal mask rows t0..t0+63 read only keys 0..t0+63, so
the triangle is reduced block by block (about half the work of the full square at T = 512)."""


def _attention_entropy(P, causal, valid, tol) -> AttentionResult:
    B, H, T, _ = P.shape
    n_att = torch.arange(1, T + 1, device=P.device) if causal else torch.full(
        (T,), T, device=P.device
    )  # (T,) attendable keys per query row
    rows = (n_att > 1)[None, :].expand(B, T)  # (B, T) rows counted
    if valid is not None:
        rows = rows & valid
    n_rows = int(rows.sum())
    if n_rows == 0:
        raise ValueError("no query row has more than one attendable position among valid ones")
    if P.dtype not in (torch.float32, torch.float64):
        P = P.float()  # half-precision rows: the sums below need float32's 24 bits
    stats = torch.empty(5, B, H, T, dtype=torch.float64, device=P.device)
    block = _ROW_BLOCK if causal else T
    # two scratch tensors for every block (fresh ones per operation cost more than the work)
    scratch = torch.empty(2, B * H * min(block, T) * T, dtype=P.dtype, device=P.device)
    for t0 in range(0, T, block):
        t1 = min(t0 + block, T)
        width = t1 if causal else T  # keys any row of the block may attend to
        stats[:, :, :, t0:t1] = _row_block_stats(P[:, :, t0:t1, :width], t0, causal, scratch)
    mass, ent, pmax, pmin, pmed = stats
    bad = ((mass - 1).abs() > tol) & rows[:, None, :]
    if bool(bad.any()):
        raise ValueError(
            f"probs rows must sum to 1 over attendable positions (within tol={tol}); "
            f"{int(bad.sum())} rows do not (max deviation {float((mass - 1).abs()[bad].max()):.3g})"
            f". Pass softmax probabilities, and causal={not causal} if the mask is the other kind"
        )
    norm_ent = ent / torch.log(n_att.clamp(min=2).to(torch.float64))  # (B, H, T)
    w = rows[:, None, :].to(torch.float64)  # (B, 1, T)

    def mean(x):  # per-head mean over counted rows
        return ((x * w).sum(dim=(0, 2)) / n_rows).cpu().numpy()

    return AttentionResult(
        entropy=mean(ent), normalized_entropy=mean(norm_ent), max_prob=mean(pmax),
        median_prob=mean(pmed), min_prob=mean(pmin), n_rows=n_rows,
    )


def _row_block_stats(P: torch.Tensor, t0: int, causal: bool, scratch: torch.Tensor):
    """Attendable mass, entropy, max, min and median of rows t0.. of `P` (B, H, b, W), as a
    (5, B, H, b) float64 tensor; `scratch` holds two buffers of at least P.numel() values.

    Each row is summed in float32 (pairwise summation: relative error ~1e-7 for W = 512, far
    below the 1e-5 the probe promises) and only the per-row results are promoted. The max is
    taken with blocked keys at 0: a counted row sums to ~1, so its largest attendable
    probability is positive and wins. The median comes from one selection instead of a sort: of
    the m keys a row may not attend to, ``a`` are set to -inf and the rest to +inf, with ``a``
    chosen so that the lower median of the row's n attendable keys sits at rank
    ``K = (W - 1) // 2`` of the filled row (`torch.median`'s lower median); for even n the upper
    one is the next value up.
    """
    B, H, b, W = P.shape
    first, second = (buf[: P.numel()].view(P.shape) for buf in scratch)
    K = (W - 1) // 2
    if causal:
        t = torch.arange(t0, t0 + b, device=P.device)[:, None]  # (b, 1) query positions
        j = torch.arange(W, device=P.device)[None, :]  # (1, W) key positions
        blocked = j > t  # (b, W)
        below = K - t // 2  # (b, 1) blocked keys set below every attendable one (n = t + 1)
        keep, zero, high = (torch.zeros(b, W, dtype=P.dtype, device=P.device) for _ in range(3))
        keep.masked_fill_(~blocked, 1.0)
        high.masked_fill_(blocked, math.inf)  # P + high: +inf where blocked
        zero.masked_fill_(blocked & (j - t <= below), -math.inf).masked_fill_(
            blocked & (j - t > below), math.inf
        )
        Pm = torch.mul(P, keep, out=first)  # blocked keys 0 (P is finite)
    else:
        Pm = P
    mass = Pm.sum(dim=-1).to(torch.float64)
    pmax = Pm.amax(dim=-1).to(torch.float64)
    ent = -torch.special.xlogy(Pm, Pm, out=second).sum(dim=-1).to(torch.float64)
    if causal:
        pmin = torch.add(P, high, out=second).amin(dim=-1).to(torch.float64)
        filled = torch.add(P, zero, out=first)  # the median's fill
    else:
        pmin = P.amin(dim=-1).to(torch.float64)
        filled = P
    lower = filled.median(dim=-1).values  # (B, H, b): rank K
    median = lower.to(torch.float64)
    # rows with an even number of attendable keys take the mean of the two middle values: every
    # second row of a causal block (n = t + 1), all rows or none without a mask
    even = slice((t0 + 1) % 2, None, 2) if causal else slice(0, b if W % 2 == 0 else 0)
    rows, low_even = filled[:, :, even], lower[:, :, even, None]
    if rows.shape[2]:
        # rank K + 1: the lower median again if it is repeated there, else the next larger value
        at_or_below = rows <= low_even
        repeated = at_or_below.sum(dim=-1) >= K + 2
        above = scratch[1][: rows.numel()].view(rows.shape)
        inf = torch.tensor(math.inf, dtype=P.dtype, device=P.device)
        torch.where(at_or_below, inf, rows, out=above)
        upper = torch.where(repeated, low_even[..., 0], above.amin(dim=-1))
        median[:, :, even] = (median[:, :, even] + upper.to(torch.float64)) / 2
    return torch.stack([mass, ent, pmax, pmin, median])


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
    rows = _ROW_BLOCK * 2 if causal else T
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
