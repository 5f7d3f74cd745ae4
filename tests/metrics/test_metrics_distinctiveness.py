import itertools

import numpy as np
import pandas as pd
import pytest
import torch

from repgeom.metrics.distinctiveness import distinctiveness, group_cosine, pca_project


def brute_force(X, subjects, attributes):
    """The score straight from its definition: loops over every sentence pair."""
    X = np.asarray(X, dtype=np.float64)
    cells = {}
    for x, s, a in zip(X, subjects, attributes, strict=True):
        cells.setdefault((s, a), []).append(x / np.linalg.norm(x))

    def c(x, y):
        return np.mean([u @ v for u in cells[x] for v in cells[y]])

    subj, attr = list(dict.fromkeys(subjects)), list(dict.fromkeys(attributes))
    out = pd.DataFrame(0.0, index=subj, columns=attr)
    for s1, a1 in itertools.product(subj, attr):
        d = []
        for s2, a2 in itertools.product(subj, attr):
            if s2 == s1 or a2 == a1:
                continue
            d1 = c((s1, a2), (s1, a1)) - c((s1, a2), (s2, a2))
            d2 = c((s2, a1), (s2, a2)) - c((s2, a1), (s1, a1))
            d.append((d1 + d2) / 2)
        out.loc[s1, a1] = np.mean(d)
    return out


def test_hand_computed_two_by_two():
    # Rows (+-2, +-1, 0.5): norm^2 = 5.25. Same subject, other attribute: dot 4 - 1 + .25;
    # same attribute, other subject: -4 + 1 + .25. d1 = d2 = (3.25 + 2.75) / 5.25 = 8/7.
    X = np.array([[2.0, 1, 0.5], [2, -1, 0.5], [-2, 1, 0.5], [-2, -1, 0.5]])
    r = distinctiveness(X, ["cat", "cat", "dog", "dog"], ["calm", "angry", "calm", "angry"])
    assert list(r.index) == ["cat", "dog"] and list(r.columns) == ["calm", "angry"]
    np.testing.assert_allclose(r.to_numpy(), 8 / 7, rtol=1e-12)
    # swap the roles (the attribute now on the long axis): exactly the negative
    r2 = distinctiveness(X, ["cat", "dog", "cat", "dog"], ["calm", "calm", "angry", "angry"])
    np.testing.assert_allclose(r2.to_numpy(), -8 / 7, rtol=1e-12)


def test_matches_the_pairwise_definition():
    # 3 subjects x 4 attributes, uneven cell sizes (1 to 3 sentences), random vectors
    rng = np.random.default_rng(0)
    subjects, attributes = [], []
    for s, a in itertools.product("xyz", "abcd"):
        k = rng.integers(1, 4)
        subjects += [s] * k
        attributes += [a] * k
    X = rng.normal(size=(len(subjects), 8)) + 0.3
    got = distinctiveness(torch.tensor(X, dtype=torch.float32), subjects, attributes)
    # float32 input, float64 arithmetic after the cast: agreement to ~1e-7
    np.testing.assert_allclose(got.to_numpy(), brute_force(X, subjects, attributes).to_numpy(),
                               atol=1e-6)


def planted(strengths, subject_strength=1.5, n=6, d=64, noise=0.3, seed=0):
    """Sentence vectors: subject direction x subject_strength + attribute direction x its
    strength + a common offset + noise; all directions orthonormal."""
    rng = np.random.default_rng(seed)
    n_s, n_a = 4, len(strengths)
    basis = np.linalg.qr(rng.normal(size=(d, n_s + n_a + 1)))[0].T
    X, subjects, attributes = [], [], []
    for s, a in itertools.product(range(n_s), range(n_a)):
        for _ in range(n):
            X.append(subject_strength * basis[s] + strengths[a] * basis[n_s + a]
                     + 2.0 * basis[-1] + noise * rng.normal(size=d))
            subjects.append(f"s{s}")
            attributes.append(f"a{a}")
    return np.array(X), subjects, attributes


def test_planted_directions_give_sign_and_order():
    # attribute strengths 0.5 < 1 < 2 < 3 against a subject strength of 1.5: the score of a
    # column falls with its attribute's strength (about const - beta^2 / 2 in this model), so
    # weak attributes give positive scores (the subject attracts) and strong ones negative
    X, s, a = planted([0.5, 1.0, 2.0, 3.0])
    r = distinctiveness(X, s, a)
    col = r.mean(axis=0)
    assert list(col.sort_values(ascending=False).index) == ["a0", "a1", "a2", "a3"]
    assert (r["a0"] > 0).all() and (r["a3"] < 0).all()
    # rows are exchangeable (every subject has the same strength): spread across subjects
    # is noise, far below the column differences
    assert r.std(axis=0).max() < 0.1 * (col["a0"] - col["a3"])


@pytest.mark.parametrize("strength, sign", [(0.3, 1), (4.0, -1)])
def test_all_weak_or_all_strong_attributes(strength, sign):
    X, s, a = planted([strength] * 3)
    assert (np.sign(distinctiveness(X, s, a).to_numpy()) == sign).all()


def test_pca_keeps_the_planted_structure():
    # after centring, the common offset is gone; the planted subject/attribute directions
    # carry 87% of the variance at noise 0.1 (noise variance 64 x 0.01 against ~4.4), so 90%
    # keeps them and a few noise directions, and the ordering stays
    X, s, a = planted([0.5, 1.0, 2.0, 3.0], noise=0.1)
    Z = pca_project(X, variance=0.9)
    assert Z.shape[1] < X.shape[1] // 4
    col = distinctiveness(Z, s, a).mean(axis=0)
    assert list(col.sort_values(ascending=False).index) == ["a0", "a1", "a2", "a3"]


def test_pca_component_count_and_scores():
    # variances 100, 10, 1 along three axes (sample variances exactly so: +-10, +-sqrt(10), +-1)
    X = np.zeros((6, 3))
    X[0, 0], X[1, 0] = 10, -10
    X[2, 1], X[3, 1] = 10**0.5, -(10**0.5)
    X[4, 2], X[5, 2] = 1, -1
    shares = np.cumsum([200, 20, 2]) / 222  # 0.90, 0.99, 1
    assert pca_project(X, variance=0.9).shape == (6, 1)  # 0.9009 >= 0.9
    assert pca_project(X, variance=0.95).shape == (6, 2)
    assert pca_project(X, variance=1.0).shape == (6, 3)
    Z = pca_project(X, variance=shares[1])
    np.testing.assert_allclose(np.abs(Z[:2, 0]), 10, rtol=1e-12)


def test_group_cosine_against_loops():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(7, 5))
    labels = list("aabbbcc")
    g = group_cosine(X, labels)
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    idx = {k: [i for i, x in enumerate(labels) if x == k] for k in "abc"}
    for x, y in itertools.product("abc", repeat=2):
        pairs = [U[i] @ U[j] for i in idx[x] for j in idx[y] if i != j]
        assert g.loc[x, y] == pytest.approx(np.mean(pairs), rel=1e-12)


@pytest.mark.parametrize(
    "X, s, a, match",
    [
        (np.ones((4, 3)), list("xxyy"), list("abab")[:3], "attributes has 3"),
        (np.ones((4, 3)), list("xxxx"), list("abab"), "at least 2 subjects"),
        (np.eye(4), list("xxyy"), list("aabb"), "empty"),
        (np.array([[1.0, 0], [0, 0], [1, 1], [0, 1]]), list("xxyy"), list("abab"), "zero row"),
    ],
)
def test_errors(X, s, a, match):
    with pytest.raises(ValueError, match=match):
        distinctiveness(X, s, a)


def test_docstring_examples():
    import doctest

    import repgeom.metrics.distinctiveness as module

    assert doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE).failed == 0
