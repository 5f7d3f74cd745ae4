import numpy as np
import pytest
import torch
from scipy import stats

from repgeom.metrics import FAMILIES, DistributionResult, activation_distribution

RNG = np.random.default_rng(0)
SAMPLES = {
    "normal": RNG.normal(size=20000),
    "laplace": RNG.laplace(size=20000),
    "t3": RNG.standard_t(3, size=20000),
    "logistic": RNG.logistic(size=20000),
    "hypsecant": stats.hypsecant.rvs(size=20000, random_state=1),
}


def test_kurtosis_matches_scipy_on_all_values():
    x = SAMPLES["t3"].reshape(100, 200)  # any shape: all entries are one sample
    r = activation_distribution(torch.tensor(x))
    assert isinstance(r, DistributionResult) and isinstance(r.kurtosis, float)
    # same moment formula (Fisher, biased) in float64
    assert r.kurtosis == pytest.approx(stats.kurtosis(x.ravel()), rel=1e-10)


def test_normal_has_no_excess_kurtosis():
    # standard error of the sample excess kurtosis is sqrt(24 / n) ~ 0.035 at n = 20000
    assert abs(activation_distribution(torch.tensor(SAMPLES["normal"])).kurtosis) < 4 * 0.035


@pytest.mark.parametrize(
    "name, criterion, family",
    [
        ("laplace", "loglik", "gennorm"),  # gennorm with beta = 1 is the Laplace law
        ("t3", "loglik", "t"),
        ("logistic", "loglik", "logistic"),
        ("hypsecant", "loglik", "hypsecant"),
        # under log-likelihood t/gennorm (which nest the normal law) tie or win; AIC's penalty
        # for the extra shape parameter picks the normal law
        ("normal", "aic", "normal"),
    ],
)
def test_best_family_recovers_the_generating_law(name, criterion, family):
    # 5000-point subsample, fixed seed: the winning margins are 2 to 60 log-likelihood units
    r = activation_distribution(torch.tensor(SAMPLES[name]), criterion=criterion)
    assert r.best_family == family
    assert set(r.log_likelihoods) == set(FAMILIES) and r.n_samples == 5000


def test_log_likelihoods_are_scipy_fits():
    x = SAMPLES["logistic"][:3000]
    r = activation_distribution(x, n_samples=5000)  # fewer values than n_samples: all used
    p = stats.logistic.fit(x)
    assert r.log_likelihoods["logistic"] == pytest.approx(stats.logistic.logpdf(x, *p).sum(),
                                                          rel=1e-9)


def test_modes():
    bimodal = np.concatenate([RNG.normal(-3, 1, 5000), RNG.normal(3, 1, 5000)])
    trimodal = np.concatenate([RNG.normal(m, 0.5, 3000) for m in (-4, 0, 4)])
    assert activation_distribution(bimodal).n_secondary_modes == 1
    assert activation_distribution(trimodal).n_secondary_modes == 2
    assert activation_distribution(SAMPLES["normal"]).n_secondary_modes == 0


@pytest.mark.parametrize(
    "x, kwargs, match",
    [
        (torch.tensor([1.0, float("nan")] * 10), {}, "X contains"),
        (torch.ones(5), {}, "at least 10 values"),
        (torch.ones(20), {}, "zero variance"),
        (torch.randn(20), {"criterion": "bic"}, "criterion"),
        (torch.randn(20), {"n_samples": 5}, "n_samples"),
        (torch.randn(20), {"mode_prominence": 1.5}, "mode_prominence"),
    ],
)
def test_errors(x, kwargs, match):
    with pytest.raises(ValueError, match=match):
        activation_distribution(x, **kwargs)
