import math

import numpy as np
import pytest
import torch

from repgeom.metrics import (
    AttentionResult,
    QKAlignmentResult,
    attention_entropy,
    attention_scores,
    qk_alignment,
    qk_cosine_concat,
)


def _causal_softmax(scores: torch.Tensor, causal: bool) -> torch.Tensor:
    T = scores.shape[-1]
    if causal:
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1)


def _loop_reference(P: np.ndarray, causal: bool, valid: np.ndarray | None):
    """Row-by-row reference with numpy (np.median: mean of the two middle values)."""
    B, H, T, _ = P.shape
    out = {k: np.zeros(H) for k in ("entropy", "norm", "max", "med", "min")}
    count = 0
    for b in range(B):
        for t in range(T):
            n_att = t + 1 if causal else T
            if n_att < 2 or (valid is not None and not valid[b, t]):
                continue
            count += 1
            for h in range(H):
                p = P[b, h, t, :n_att]
                ent = -sum(x * math.log(x) for x in p if x > 0)
                out["entropy"][h] += ent
                out["norm"][h] += ent / math.log(n_att)
                out["max"][h] += p.max()
                out["med"][h] += np.median(p)
                out["min"][h] += p.min()
    return {k: v / count for k, v in out.items()}, count


def test_uniform_over_all_positions_gives_log_T():
    T = 6
    for dtype in (torch.float64, torch.float32):
        r = attention_entropy(torch.full((2, 3, T, T), 1.0 / T, dtype=dtype), causal=False)
        assert isinstance(r, AttentionResult) and r.entropy.shape == (3,)
        # Rows are reduced in the input's dtype: six terms p log p, each rounded once, plus the
        # rounding of p = 1/6 itself: a few ulps, ~1e-15 in float64 and ~1e-7 in float32.
        tol = 8 * torch.finfo(dtype).eps
        np.testing.assert_allclose(r.entropy, math.log(T), rtol=tol)
        np.testing.assert_allclose(r.normalized_entropy, 1.0, rtol=tol)
        for field in (r.max_prob, r.median_prob, r.min_prob):
            np.testing.assert_allclose(field, 1.0 / T, rtol=tol)
        assert r.n_rows == 2 * T


def test_uniform_causal_rows():
    T = 7
    P = _causal_softmax(torch.zeros(1, 2, T, T, dtype=torch.float64), causal=True)
    r = attention_entropy(P, causal=True)
    # row t (0-based) is uniform over t + 1 keys; row 0 (one key) is not counted
    expected = np.mean([math.log(t + 1) for t in range(1, T)])
    np.testing.assert_allclose(r.entropy, expected, atol=1e-12)
    np.testing.assert_allclose(r.normalized_entropy, 1.0, atol=1e-12)
    assert r.n_rows == T - 1


def test_one_hot_gives_zero():
    T = 5
    P = torch.zeros(1, 1, T, T)
    P[..., 0] = 1.0  # every row attends to the first key (allowed under a causal mask)
    r = attention_entropy(P, causal=True)
    assert r.entropy.tolist() == [0.0] and r.normalized_entropy.tolist() == [0.0]
    assert r.max_prob.tolist() == [1.0] and r.min_prob.tolist() == [0.0]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("use_valid", [False, True])
@pytest.mark.parametrize(
    "T, ties",
    # 150: query rows span several blocks of the causal triangle (64 rows each), odd and even
    # row lengths; ties: scores on a grid of 3 values, so medians fall on repeated values
    [(9, False), (150, False), (150, True)],
)
def test_matches_row_loop(causal, use_valid, T, ties):
    g = torch.Generator().manual_seed(0)
    B, H = 2, 3
    scores = 3 * torch.randn(B, H, T, T, generator=g, dtype=torch.float64)
    if ties:
        scores = torch.randint(0, 3, (B, H, T, T), generator=g).to(torch.float64)
    P = _causal_softmax(scores, causal)
    valid = torch.rand(B, T, generator=g) > 0.3 if use_valid else None
    r = attention_entropy(P, causal=causal, valid=valid)
    ref, count = _loop_reference(P.numpy(), causal, None if valid is None else valid.numpy())
    # same float64 arithmetic, different summation order
    for ours, key in [(r.entropy, "entropy"), (r.normalized_entropy, "norm"),
                      (r.max_prob, "max"), (r.median_prob, "med"), (r.min_prob, "min")]:
        np.testing.assert_allclose(ours, ref[key], rtol=1e-10, atol=1e-12)
    assert r.n_rows == count


def test_bfloat16_probabilities_accepted():
    P = _causal_softmax(torch.randn(1, 2, 16, 16), causal=True)
    r16 = attention_entropy(P.to(torch.bfloat16), causal=True)
    r32 = attention_entropy(P, causal=True)
    # bf16 keeps 8 bits of mantissa: ~0.4% per probability, less after averaging
    np.testing.assert_allclose(r16.entropy, r32.entropy, rtol=2e-2)


@pytest.mark.parametrize(
    "probs, kwargs, match",
    [
        (torch.full((1, 1, 4, 3), 0.25), {}, r"probs must have shape \(B, H, T, T\)"),
        (torch.full((1, 4, 4), 0.25), {}, r"probs must have shape"),
        (torch.full((1, 1, 4, 4), float("nan")), {}, "probs contains"),
        (torch.randn(1, 1, 4, 4), {}, "sum to 1"),  # scores, not probabilities
        (torch.full((1, 1, 4, 4), 0.25), {"causal": True}, "causal=False"),  # wrong mask kind
        (torch.full((1, 1, 4, 4), 0.25), {"valid": torch.ones(1, 3, dtype=torch.bool)},
         r"valid must have shape \(B, T\)"),
        (torch.full((1, 1, 4, 4), 0.25), {"valid": torch.zeros(1, 4, dtype=torch.bool)},
         "valid marks no position"),
        (torch.full((1, 1, 4, 4), 0.25), {"valid": torch.ones(1, 4)}, "valid must be a boolean"),
    ],
)
def test_entropy_errors(probs, kwargs, match):
    kwargs = {"causal": False, **kwargs}
    with pytest.raises(ValueError, match=match):
        attention_entropy(probs, **kwargs)


def test_qk_known_means():
    # queries = q0 +/- e and keys = k0 +/- e': symmetric noise cancels exactly in the means
    q0 = torch.tensor([3.0, 0.0, 4.0, 0.0], dtype=torch.float64)
    k0 = torch.tensor([0.0, 2.0, 2.0, 0.0], dtype=torch.float64)
    e = torch.randn(1, 2, 3, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    Q = torch.cat([q0 + e, q0 - e], dim=2)  # (1, 2, 6, 4)
    K = torch.cat([k0 - e.flip(1), k0 + e.flip(1)], dim=2)
    r = qk_alignment(Q, K)
    assert isinstance(r, QKAlignmentResult) and r.cosine.shape == (2,)
    dot = float(q0 @ k0)  # 8
    cos = dot / (5.0 * math.sqrt(8.0))
    np.testing.assert_allclose(r.dot, dot, atol=1e-12)
    np.testing.assert_allclose(r.cosine, cos, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("use_valid", [False, True])
@pytest.mark.parametrize("T", [5, 140])  # 140: several blocks of the causal triangle
def test_qk_score_stats_match_loop(causal, use_valid, T):
    g = torch.Generator().manual_seed(1)
    B, H, D = 2, 2, 8
    Q = torch.randn(B, H, T, D, generator=g, dtype=torch.float64) + 0.5
    K = torch.randn(B, H, T, D, generator=g, dtype=torch.float64) - 0.2
    mask = torch.tensor([[1, 1, 0, 1, 1], [1, 0, 1, 1, 0]], dtype=torch.bool).repeat(1, T)
    valid = mask[:, :T] if use_valid else None
    r = qk_alignment(Q, K, causal=causal, valid=valid)
    for h in range(H):
        scores, qs, ks = [], [], []
        for b in range(B):
            for t in range(T):
                if valid is not None and not valid[b, t]:
                    continue
                qs.append(Q[b, h, t])
                ks.append(K[b, h, t])
                for j in range(T):
                    if (causal and j > t) or (valid is not None and not valid[b, j]):
                        continue
                    scores.append(float(Q[b, h, t] @ K[b, h, j]) / math.sqrt(D))
        s = np.array(scores)
        qm, km = torch.stack(qs).mean(0), torch.stack(ks).mean(0)
        # float64 both ways; E[s^2] - E[s]^2 for the std loses a few ulps
        assert r.score_mean[h] == pytest.approx(s.mean(), abs=1e-12)
        assert r.score_std[h] == pytest.approx(s.std(), rel=1e-9)
        assert r.score_max_abs[h] == pytest.approx(np.abs(s).max(), abs=1e-12)
        assert r.dot[h] == pytest.approx(float(qm @ km), abs=1e-12)
        assert r.cosine[h] == pytest.approx(float(qm @ km / (qm.norm() * km.norm())), abs=1e-12)


@pytest.mark.parametrize(
    "Q, K, match",
    [
        (torch.randn(2, 3, 4), torch.randn(2, 3, 4), r"queries must have shape \(B, H, T, D\)"),
        (torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 5), "keys must have the same shape"),
        (torch.full((1, 1, 2, 2), float("inf")), torch.randn(1, 1, 2, 2), "queries contains"),
        (torch.randn(1, 1, 2, 2), torch.full((1, 1, 2, 2), float("nan")), "keys contains"),
    ],
)
def test_qk_errors(Q, K, match):
    with pytest.raises(ValueError, match=match):
        qk_alignment(Q, K)


# ---------------------------------------------------------------------------------------------
# Q/K cosine with the heads concatenated (Godey et al. Fig. 23)


def _concat_cosine_numpy(Q: np.ndarray, K: np.ndarray, valid: np.ndarray | None) -> float:
    """Independent reference: (B, H, T, D) -> rows of H*D features, means, cosine."""
    B, H, T, D = Q.shape
    q = Q.transpose(0, 2, 1, 3).reshape(B, T, H * D)  # token-major, heads side by side
    k = K.transpose(0, 2, 1, 3).reshape(B, T, H * D)
    keep = np.ones((B, T), bool) if valid is None else valid
    qm, km = q[keep].mean(axis=0), k[keep].mean(axis=0)
    return float(qm @ km / (np.linalg.norm(qm) * np.linalg.norm(km)))


@pytest.mark.parametrize("use_valid", [False, True])
def test_qk_cosine_concat_matches_numpy(use_valid):
    g = torch.Generator().manual_seed(3)
    B, H, T, D = 2, 3, 5, 4
    Q = torch.randn(B, H, T, D, generator=g, dtype=torch.float64) + 0.3
    K = torch.randn(B, H, T, D, generator=g, dtype=torch.float64) - 0.4
    valid = torch.tensor([[1, 1, 0, 1, 1], [0, 1, 1, 1, 0]], dtype=torch.bool)
    v = valid if use_valid else None
    expected = _concat_cosine_numpy(Q.numpy(), K.numpy(), None if v is None else v.numpy())
    # float64 on both sides: the two sums differ in order only
    assert qk_cosine_concat(Q, K, valid=v) == pytest.approx(expected, abs=1e-12)
    # float32 input is reduced in float64: within float32 rounding of the inputs
    assert qk_cosine_concat(Q.float(), K.float(), valid=v) == pytest.approx(expected, abs=1e-6)


def test_qk_cosine_concat_known_answers():
    g = torch.Generator().manual_seed(4)
    Q = torch.randn(2, 4, 6, 8, generator=g) + 1.0
    assert qk_cosine_concat(Q, Q) == pytest.approx(1.0, abs=1e-12)  # keys equal to queries
    assert qk_cosine_concat(Q, -2.0 * Q) == pytest.approx(-1.0, abs=1e-12)
    # per-head cosines +1 and -1 (mean 0); concatenated: (1 - 3) / (sqrt(10) sqrt(2))
    q = torch.tensor([[1.0, 0.0], [0.0, 3.0]]).view(1, 2, 1, 2)
    k = torch.tensor([[1.0, 0.0], [0.0, -1.0]]).view(1, 2, 1, 2)
    np.testing.assert_allclose(qk_alignment(q, k).cosine, [1.0, -1.0], atol=1e-12)
    assert qk_cosine_concat(q, k) == pytest.approx(-2.0 / math.sqrt(20.0), abs=1e-12)
    # tokens that cancel: the mean key is zero, no direction
    assert qk_cosine_concat(q.expand(1, 2, 2, 2), torch.cat([k, -k], dim=2)) == 0.0


@pytest.mark.parametrize(
    "Q, K, kwargs, match",
    [
        (torch.randn(2, 3, 4), torch.randn(2, 3, 4), {}, r"queries must have shape \(B, H, T, D\)"),
        (torch.randn(1, 2, 3, 4), torch.randn(1, 3, 3, 4), {}, "keys must have the same shape"),
        (torch.randn(1, 1, 2, 2), torch.full((1, 1, 2, 2), float("nan")), {}, "keys contains"),
        (torch.randn(1, 1, 2, 2), torch.randn(1, 1, 2, 2),
         {"valid": torch.zeros(1, 2, dtype=torch.bool)}, "valid marks no position"),
    ],
)
def test_qk_cosine_concat_errors(Q, K, kwargs, match):
    with pytest.raises(ValueError, match=match):
        qk_cosine_concat(Q, K, **kwargs)


# ---------------------------------------------------------------------------------------------
# Pre-softmax scores (Godey et al. Figs. 7, 10)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_scores_match_a_loop_and_the_softmax(causal):
    g = torch.Generator().manual_seed(5)
    B, H, T, D = 2, 2, 4, 3
    Q = torch.randn(B, H, T, D, generator=g)
    K = torch.randn(B, H, T, D, generator=g)
    S = attention_scores(Q, K, causal=causal)
    assert S.shape == (B, H, T, T) and S.dtype == torch.float64
    for b, h, t, j in np.ndindex(B, H, T, T):
        if causal and j > t:
            assert S[b, h, t, j] == -math.inf
        else:
            expected = float(np.dot(Q[b, h, t].double().numpy(), K[b, h, j].double().numpy()))
            assert float(S[b, h, t, j]) == pytest.approx(expected / math.sqrt(D), abs=1e-12)
    # the masked scores are what the softmax of scaled dot-product attention sees
    reference = torch.nn.functional.scaled_dot_product_attention(
        Q.double(), K.double(), torch.eye(T, dtype=torch.float64).expand(B, H, T, T),
        is_causal=causal)
    torch.testing.assert_close(S.softmax(dim=-1), reference, rtol=0, atol=1e-12)


def test_attention_scores_errors():
    with pytest.raises(ValueError, match="causal must be True or False"):
        attention_scores(torch.randn(1, 1, 2, 2), torch.randn(1, 1, 2, 2), causal=1)
    with pytest.raises(ValueError, match="keys must have the same shape"):
        attention_scores(torch.randn(1, 1, 2, 2), torch.randn(1, 1, 3, 2), causal=False)
