"""Subject/attribute distinctiveness of sentence representations, and PCA to a variance share.

Our reading of the score in "Beyond Gaussian" (papers/004, section "Representational Vector
Similarities"); the post gives it in words only, so the formula below is an interpretation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from ._validation import check_fraction, check_matrix

__all__ = ["distinctiveness", "group_cosine", "pca_project"]


def distinctiveness(pooled, subjects: Sequence, attributes: Sequence) -> pd.DataFrame:
    r"""Whether sentences attract more by sharing their subject or by sharing their attribute.

    The post (papers/004, "Representational Vector Similarities"): "I took a subject, call it
    s1, and an attribute, a1. Then across all pairs of subjects including s1 and all pairs of
    attributes including a1, I measured the cosine similarity of the post residual vector at
    each layer for sentences with the subject:attribute pair s1a2 versus those for s1a1
    sentences and s2a2 sentences. I did likewise for s2a1 sentences. [...] I took the average
    difference [...]. Positive numbers mean the subject was more attracting". Our reading:

    .. math::

        c(x, y) &= \text{mean cosine over all pairs } (i \in x, j \in y) \\
        d_1 &= c(s_1a_2, s_1a_1) - c(s_1a_2, s_2a_2) \\
        d_2 &= c(s_2a_1, s_2a_2) - c(s_2a_1, s_1a_1) \\
        \text{score}(s_1, a_1) &= \operatorname{mean}_{s_2 \ne s_1,\, a_2 \ne a_1}
            \tfrac12 (d_1 + d_2)

    :math:`d_1` asks whether an s1a2 sentence is closer to s1a1 (same subject) than to s2a2
    (same attribute); :math:`d_2` asks whether s2a1 is closer to s2a2 (same subject) than to
    s1a1 (same attribute). Positive: subjects attract more than attributes around the cell
    (s1, a1). The two groups of a cosine always differ, so no sentence is compared with
    itself; c(x, y) is computed exactly as the dot product of the groups' mean unit vectors.

    Parameters
    ----------
    pooled : Tensor or ndarray, shape (N, D)
        One vector per sentence (mean- or last-token-pooled state at one layer).
    subjects, attributes : sequences of N labels (any hashable)
        Every (subject, attribute) cell needs at least one sentence; at least 2 subjects and
        2 attributes.

    Returns
    -------
    DataFrame, subjects x attributes (index named ``subject``, columns ``attribute``), float64,
    in the order the labels first appear.

    Raises
    ------
    ValueError
        Shape mismatch, fewer than 2 subjects or attributes, an empty cell, a zero vector.

    Examples
    --------
    Subjects along one axis (length 2), attributes along another (length 1): subjects attract.
    Every row has norm sqrt(5.25); same subject: cos = 3.25/5.25, same attribute:
    -2.75/5.25, so d1 = d2 = 6/5.25 = 1.143.

    >>> import numpy as np
    >>> X = np.array([[2., 1., 0.], [2., -1., 0.], [-2., 1., 0.], [-2., -1., 0.]])
    >>> X[:, 2] = 0.5  # a shared offset, as in real hidden states
    >>> s = ["cat", "cat", "dog", "dog"]
    >>> a = ["calm", "angry", "calm", "angry"]
    >>> distinctiveness(X, s, a).round(3)
    attribute   calm  angry
    subject
    cat        1.143  1.143
    dog        1.143  1.143
    """
    X = check_matrix(pooled, "pooled", min_rows=4)
    n = X.shape[0]
    subjects, attributes = list(subjects), list(attributes)
    for name, labels in (("subjects", subjects), ("attributes", attributes)):
        if len(labels) != n:
            raise ValueError(f"{name} has {len(labels)} labels, pooled has {n} rows")
    subj = list(dict.fromkeys(subjects))
    attr = list(dict.fromkeys(attributes))
    if len(subj) < 2 or len(attr) < 2:
        raise ValueError(
            f"need at least 2 subjects and 2 attributes, got {len(subj)} and {len(attr)}"
        )
    norms = X.to(torch.float64).norm(dim=1)
    if bool((norms == 0).any()):
        raise ValueError(f"pooled has {int((norms == 0).sum())} zero row(s); cosine undefined")
    cells = pd.crosstab(pd.Series(subjects, name="subject"),
                        pd.Series(attributes, name="attribute"))
    empty = [(s, a) for s in subj for a in attr if cells.get(a, {}).get(s, 0) == 0]
    if empty:
        raise ValueError(f"every (subject, attribute) cell needs a sentence; empty: {empty[:5]}")
    return _distinctiveness(X, subjects, attributes, subj, attr)


def _distinctiveness(X, subjects, attributes, subj, attr) -> pd.DataFrame:
    U = X.to(torch.float64)
    U = (U / U.norm(dim=1, keepdim=True)).cpu().numpy()
    si = {s: i for i, s in enumerate(subj)}
    ai = {a: i for i, a in enumerate(attr)}
    S, A = len(subj), len(attr)
    means = np.zeros((S, A, U.shape[1]))
    counts = np.zeros((S, A))
    for u, s, a in zip(U, subjects, attributes, strict=True):
        means[si[s], ai[a]] += u
        counts[si[s], ai[a]] += 1
    means /= counts[..., None]
    # C[s, a, t, b] = c(sa, tb): mean cosine over all sentence pairs of the two cells
    C = np.einsum("sad,tbd->satb", means, means)
    score = np.zeros((S, A))
    for s1 in range(S):
        for a1 in range(A):
            d = []
            for s2 in range(S):
                for a2 in range(A):
                    if s2 == s1 or a2 == a1:
                        continue
                    d1 = C[s1, a2, s1, a1] - C[s1, a2, s2, a2]
                    d2 = C[s2, a1, s2, a2] - C[s2, a1, s1, a1]
                    d.append(0.5 * (d1 + d2))
            score[s1, a1] = np.mean(d)
    return pd.DataFrame(score, index=pd.Index(subj, name="subject"),
                        columns=pd.Index(attr, name="attribute"))


def group_cosine(pooled, labels: Sequence) -> pd.DataFrame:
    """Mean cosine over all pairs of rows between every two label groups (c(x, y) above).

    Within a group (the diagonal) pairs of distinct rows only; a one-row group's diagonal is NaN.

    Examples
    --------
    >>> group_cosine([[1., 0.], [1., 0.], [0., 1.]], ["a", "a", "b"]).round(2)
         a    b
    a  1.0  0.0
    b  0.0  NaN
    """
    X = check_matrix(pooled, "pooled", min_rows=2)
    labels = list(labels)
    if len(labels) != X.shape[0]:
        raise ValueError(f"labels has {len(labels)} entries, pooled has {X.shape[0]} rows")
    U = X.to(torch.float64)
    U = (U / U.norm(dim=1, keepdim=True).clamp_min(1e-300)).cpu().numpy()
    names = list(dict.fromkeys(labels))
    lab = np.array([names.index(x) for x in labels])
    sums = np.stack([U[lab == g].sum(0) for g in range(len(names))])
    cnt = np.bincount(lab, minlength=len(names)).astype(float)
    total = sums @ sums.T
    out = total / np.outer(cnt, cnt)
    # the diagonal without self-pairs: (|sum|^2 - n) / (n (n - 1))
    with np.errstate(invalid="ignore", divide="ignore"):
        diag = (np.diag(total) - cnt) / (cnt * (cnt - 1))
    out[np.diag_indices_from(out)] = np.where(cnt > 1, diag, np.nan)
    return pd.DataFrame(out, index=names, columns=names)


def pca_project(X, *, variance: float = 0.9) -> torch.Tensor:
    """Centre the rows and keep the fewest principal components explaining ``variance``.

    The post repeats the distinctiveness score on states "reduced in dimension via PCA to
    represent 90% of the variance" (papers/004); as in scikit-learn's ``PCA`` the data are
    centred first, so cosines afterwards are between *centred* vectors (the common offset of
    the states, the drift, is gone): expect smaller raw cosines and larger differences.

    Parameters
    ----------
    X : Tensor or ndarray, shape (N, D), N >= 2
    variance : float in (0, 1], keyword-only

    Returns
    -------
    (N, k) float64 tensor, the scores on the first k components.

    Examples
    --------
    >>> import torch
    >>> X = torch.tensor([[1., 0., 0.], [-1., 0., 0.], [0., .1, 0.], [0., -.1, 0.]])
    >>> pca_project(X, variance=0.9).shape
    torch.Size([4, 1])
    """
    t = check_matrix(X, "X", min_rows=2)
    v = check_fraction(variance, "variance", include_low=False, include_high=True)
    c = t.to(torch.float64)
    c = c - c.mean(0, keepdim=True)
    _, s, vh = torch.linalg.svd(c, full_matrices=False)
    ev = s**2
    if float(ev.sum()) == 0:
        raise ValueError("X has zero variance; no principal component to keep")
    share = torch.cumsum(ev, 0) / ev.sum()
    k = int(torch.searchsorted(share, torch.tensor(v, dtype=share.dtype) - 1e-12)) + 1
    k = min(k, s.numel())
    return c @ vh[:k].T
