"""Do the intervals cover the truth? 200 seeded simulations per setting, against exact values.

The environment: M = 1,000 fixed contexts x in R^3 and K = 4 actions with Bernoulli rewards of
mean ``q(x, a) = sigmoid(theta_a . x + b_a)``. A log row draws its context uniformly from the
M, so the true value of a target policy is exactly ``1/M sum_x sum_a pi(a | x) q(x, a)``, no
Monte Carlo needed. Two logging policies (uniform, and a skewed softmax with a 5% floor per
action, so weights reach 20) and three targets (greedy on the true means, a softmax of them,
"always action 1"). Every simulation logs n = 3,000 rows; DR's reward model is a cross-fitted
per-action ridge on x, deliberately misspecified (linear, while the truth is logistic), so DR's
coverage rests on the propensities, as it should.

The simulations are drawn for all runs at once (one (200, 3000) array per quantity); each
run's estimators share one cross-fitted model and one set of bootstrap resamples.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from learner.evaluation import DR, IPS, SNIPS, LowESSWarning, bootstrap_distribution, cross_fit, evaluate

RUNS, N, K, D, M = 200, 3000, 4, 3, 1000
RESAMPLES = 400
ESTIMATORS = (IPS(), SNIPS(), DR())
LOGGING = ("uniform", "skewed")
TARGETS = ("greedy", "softmax", "always_1")


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def simulations():
    env = np.random.default_rng(20240611)
    pool = env.normal(size=(M, D))
    q_true = 1.0 / (1.0 + np.exp(-(pool @ env.normal(size=(K, D)).T + env.normal(scale=0.5, size=K))))
    logging = {
        "uniform": np.full((M, K), 1.0 / K),
        "skewed": 0.8 * _softmax(2.0 * pool @ env.normal(size=(D, K))) + 0.2 / K,
    }
    targets = {
        "greedy": np.eye(K)[q_true.argmax(axis=1)],
        "softmax": _softmax(4.0 * q_true),
        "always_1": np.tile(np.eye(K)[1], (M, 1)),
    }
    truth = {name: float((policy * q_true).sum(axis=1).mean()) for name, policy in targets.items()}

    rng = np.random.default_rng(1)
    gaussian: dict[tuple[str, str, str], np.ndarray] = {}
    bootstrap: dict[tuple[str, str, str], np.ndarray] = {}
    for log_name in LOGGING:
        policy = logging[log_name]
        context = rng.integers(0, M, (RUNS, N))
        action = (rng.random((RUNS, N))[..., None] > policy.cumsum(axis=1)[context]).sum(axis=-1).clip(max=K - 1)
        reward = (rng.random((RUNS, N)) < q_true[context, action]).astype(np.float64)
        pscore = policy[context, action]
        for run in range(RUNS):
            q = cross_fit(None, pool[context[run]], action[run], reward[run], n_actions=K, random_state=run)
            keys, terms = [], []
            for target_name in TARGETS:
                log = (reward[run], action[run], pscore[run], targets[target_name][context[run]], q)
                for estimator in ESTIMATORS:
                    key = (log_name, target_name, estimator.name)
                    with warnings.catch_warnings():
                        warnings.simplefilter("error", LowESSWarning)  # every setting has ESS >= 100
                        result = evaluate(estimator, *log)
                    gaussian.setdefault(key, np.empty((RUNS, 3)))[run] = (result.estimate, result.lower, result.upper)
                    keys.append(key)
                    terms.append(estimator.terms(*log))
            values = bootstrap_distribution(terms, RESAMPLES, random_state=run)
            lower, upper = np.percentile(values, [2.5, 97.5], axis=0)
            for j, key in enumerate(keys):
                bootstrap.setdefault(key, np.empty((RUNS, 3)))[run] = (terms[j].value(), lower[j], upper[j])
    return truth, gaussian, bootstrap


CELLS = [(log, target, est.name) for log in LOGGING for target in TARGETS for est in ESTIMATORS]


def _coverage(runs: np.ndarray, truth: float) -> float:
    return float(np.mean((runs[:, 1] <= truth) & (truth <= runs[:, 2])))


@pytest.mark.parametrize("cell", CELLS, ids=["-".join(c) for c in CELLS])
def test_gaussian_95_intervals_cover_the_truth_in_90_percent_of_runs(simulations, cell):
    truth, gaussian, _ = simulations
    coverage = _coverage(gaussian[cell], truth[cell[1]])
    assert coverage >= 0.90, f"{cell}: {coverage:.3f}"


@pytest.mark.parametrize("cell", CELLS, ids=["-".join(c) for c in CELLS])
def test_bootstrap_95_intervals_cover_the_truth_in_90_percent_of_runs(simulations, cell):
    truth, _, bootstrap = simulations
    coverage = _coverage(bootstrap[cell], truth[cell[1]])
    assert coverage >= 0.90, f"{cell}: {coverage:.3f}"


@pytest.mark.parametrize(("log", "target"), [(log, target) for log in LOGGING for target in TARGETS])
def test_dr_error_variance_is_below_ips(simulations, log, target):
    truth, gaussian, _ = simulations
    dr_error = gaussian[(log, target, "dr")][:, 0] - truth[target]
    ips_error = gaussian[(log, target, "ips")][:, 0] - truth[target]
    assert dr_error.var() < ips_error.var(), (dr_error.var(), ips_error.var())


@pytest.mark.parametrize("cell", [c for c in CELLS if c[2] in ("ips", "dr")], ids=lambda c: "-".join(c))
def test_unbiased_estimators_average_to_the_truth(simulations, cell):
    """IPS and DR are unbiased with the true propensities: over 200 runs their mean error is
    within 4 standard errors of 0."""
    truth, gaussian, _ = simulations
    estimates = gaussian[cell][:, 0]
    standard_error = estimates.std(ddof=1) / np.sqrt(RUNS)
    assert abs(estimates.mean() - truth[cell[1]]) < 4 * standard_error


def test_bootstrap_and_gaussian_intervals_agree_in_width(simulations):
    """Both estimate the same sampling spread: their average widths agree within 10%."""
    _, gaussian, bootstrap = simulations
    for cell in CELLS:
        g = (gaussian[cell][:, 2] - gaussian[cell][:, 1]).mean()
        b = (bootstrap[cell][:, 2] - bootstrap[cell][:, 1]).mean()
        assert abs(b / g - 1) < 0.10, (cell, g, b)
