"""Attention entropy: how spread one layer's attention rows are, per head (Godey et al. 2024,
figs. 9, 10, 15). Query/key alignment and the pre-softmax scores are in
`repgeom.metrics.attention.qk`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from repgeom.metrics._validation import as_tensor, check_finite, check_valid_mask

__all__ = ["AttentionResult", "attention_entropy"]


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
