"""Off-policy estimators, intervals, diagnostics and reward models (learner.evaluation).

The fixtures are small enough to work out by hand; the arithmetic is in the comments, and every
estimate and closed-form bound is checked to 1e-12 against it.
"""

from __future__ import annotations

import doctest
import importlib
import json
import math
import warnings
from statistics import NormalDist
from typing import ClassVar

import numpy as np
import pytest

from learner.evaluation import (
    DM,
    DR,
    ESTIMATORS,
    IPS,
    SNDR,
    SNIPS,
    DRos,
    Estimate,
    InvalidInputError,
    LowESSWarning,
    PerActionModel,
    Ridge,
    SharedModel,
    SwitchDR,
    bernstein_interval,
    bootstrap_distribution,
    bootstrap_interval,
    cross_fit,
    evaluate,
    gaussian_interval,
    make_estimator,
    one_hot_features,
    reward_model_features,
    weight_diagnostics,
)
from learner.evaluation import intervals
from learner.features import FeatureConfig, FeatureEncoder

TOL = 1e-12
Z95 = NormalDist().inv_cdf(0.975)

# --- the hand-worked log ---------------------------------------------------------------------------
#
# n = 4 rows, K = 3 actions.
#   row  reward  action  pscore  action_dist (target)    w = target[action] / pscore
#   0    1.0     0       0.5     [0.5, 0.5, 0.0]         0.5 / 0.5  = 1
#   1    0.0     1       0.25    [0.0, 0.5, 0.5]         0.5 / 0.25 = 2
#   2    0.5     2       0.25    [1.0, 0.0, 0.0]         0.0 / 0.25 = 0   (target never logs action 2)
#   3    1.0     0       0.5     [0.25, 0.25, 0.5]       0.25 / 0.5 = 0.5
# sum w = 3.5, mean w = 0.875
#
# estimated rewards q        q(x, pi_e) = sum_k target[k] q[k]            q(x, a)   r - q(x, a)
#   0  [0.8, 0.2, 0.4]       0.5*0.8 + 0.5*0.2             = 0.5          0.8        0.2
#   1  [0.6, 0.1, 0.3]       0.5*0.1 + 0.5*0.3             = 0.2          0.1       -0.1
#   2  [0.5, 0.5, 0.5]       1.0*0.5                       = 0.5          0.5        0.0
#   3  [0.9, 0.3, 0.1]       0.25*0.9 + 0.25*0.3 + 0.5*0.1 = 0.35         0.9        0.1
# DM = (0.5 + 0.2 + 0.5 + 0.35) / 4 = 1.55 / 4 = 0.3875
# w (r - q(x, a)) = [0.2, -0.2, 0.0, 0.05], sum 0.05

REWARD = np.array([1.0, 0.0, 0.5, 1.0])
ACTION = np.array([0, 1, 2, 0])
PSCORE = np.array([0.5, 0.25, 0.25, 0.5])
TARGET = np.array([[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [1.0, 0.0, 0.0], [0.25, 0.25, 0.5]])
Q = np.array([[0.8, 0.2, 0.4], [0.6, 0.1, 0.3], [0.5, 0.5, 0.5], [0.9, 0.3, 0.1]])
LOG = (REWARD, ACTION, PSCORE, TARGET, Q)
CELL = np.arange(12).reshape(4, 3)  # cell numbers, to place a bad value

HAND = [
    # IPS: w r = [1, 0, 0, 0.5] -> 1.5 / 4
    (IPS(), 0.375),
    # clip 0.4: min(w, 0.4) = [0.4, 0.4, 0, 0.4], times r = [0.4, 0, 0, 0.4] -> 0.8 / 4
    (IPS(clip=0.4), 0.2),
    # clip 1: min(w, 1) = [1, 1, 0, 0.5], times r = [1, 0, 0, 0.5] -> 1.5 / 4 (row 1 has r = 0)
    (IPS(clip=1.0), 0.375),
    # SNIPS: sum w r / sum w = 1.5 / 3.5
    (SNIPS(), 3.0 / 7.0),
    (DM(), 0.3875),
    # DR rows: q(x, pi_e) + w (r - q(x, a)) = [0.7, 0.0, 0.5, 0.4] -> 1.6 / 4
    (DR(), 0.4),
    # DR clip 1: min(w, 1) (r - q(x, a)) = [0.2, -0.1, 0, 0.05]; rows [0.7, 0.1, 0.5, 0.4] -> 1.7 / 4
    (DR(clip=1.0), 0.425),
    # SNDR: DM + sum w (r - q(x, a)) / sum w = 0.3875 + 0.05 / 3.5 = 0.3875 + 1/70
    (SNDR(), 0.3875 + 1.0 / 70.0),
    # Switch-DR tau 1: the w = 2 row falls back to DM: rows [0.7, 0.2, 0.5, 0.4] -> 1.8 / 4
    (SwitchDR(tau=1.0), 0.45),
    (SwitchDR(), 0.4),  # tau = inf: DR
    (SwitchDR(tau=0.0), 0.3875),  # only w = 0 rows keep their (zero) correction: DM
    # DRos lambda 1: w~ = w / (w^2 + 1) = [1/2, 2/5, 0, 0.5/1.25 = 2/5];
    # w~ (r - q(x, a)) = [0.1, -0.04, 0, 0.04]; rows [0.6, 0.16, 0.5, 0.39] -> 1.65 / 4
    (DRos(shrinkage=1.0), 0.4125),
    (DRos(shrinkage=0.0), 0.3875),  # DM
    (DRos(shrinkage=math.inf), 0.4),  # DR
]


@pytest.mark.parametrize(("estimator", "expected"), HAND, ids=[repr(e) for e, _ in HAND])
def test_every_estimator_matches_the_hand_computation(estimator, expected):
    assert estimator.estimate(*LOG) == pytest.approx(expected, abs=TOL)


@pytest.mark.parametrize(("estimator", "expected"), HAND, ids=[repr(e) for e, _ in HAND])
def test_per_row_terms_average_to_the_estimate(estimator, expected):
    rows = estimator.rows(*LOG)
    assert rows.shape == (4,)
    assert rows.mean() == pytest.approx(expected, abs=TOL)
    terms = estimator.terms(*LOG)
    # the documented reduction: mean(base) + mean(correction) / mean(normalizer)
    base = 0.0 if terms.base is None else terms.base.mean()
    correction = 0.0 if terms.correction is None else terms.correction.mean()
    normalizer = 1.0 if terms.normalizer is None else terms.normalizer.mean()
    assert base + correction / normalizer == pytest.approx(expected, abs=TOL)
    assert terms.self_normalized is type(estimator).self_normalized


def test_self_normalized_rows_divide_by_the_logs_mean_weight():
    # SNIPS rows: w r / mean(w) = [1, 0, 0, 0.5] / 0.875
    assert SNIPS().rows(*LOG) == pytest.approx(np.array([1.0, 0.0, 0.0, 0.5]) / 0.875, abs=TOL)
    # SNDR rows: q(x, pi_e) + w (r - q(x, a)) / mean(w)
    expected = np.array([0.5, 0.2, 0.5, 0.35]) + np.array([0.2, -0.2, 0.0, 0.05]) / 0.875
    assert SNDR().rows(*LOG) == pytest.approx(expected, abs=TOL)


def test_terms_are_read_only():
    terms = DR().terms(*LOG)
    with pytest.raises(ValueError):
        terms.base[0] = 1.0


def test_tiny_pscore_gives_the_exact_huge_weight():
    # w = [1 / 1e-6, 1 / 0.5] = [1e6, 2]
    reward, action, pscore = [1.0, 0.5], [0, 1], [1e-6, 0.5]
    target = np.eye(2)
    assert IPS().estimate(reward, action, pscore, target) == pytest.approx((1e6 * 1.0 + 2 * 0.5) / 2, rel=TOL)
    assert SNIPS().estimate(reward, action, pscore, target) == pytest.approx((1e6 + 1.0) / (1e6 + 2.0), rel=TOL)
    assert IPS(clip=10).estimate(reward, action, pscore, target) == pytest.approx((10 * 1.0 + 2 * 0.5) / 2, abs=TOL)
    q = np.full((2, 2), 0.5)
    # DR rows: 0.5 + 1e6 (1 - 0.5); 0.5 + 2 (0.5 - 0.5)
    assert DR().estimate(reward, action, pscore, target, q) == pytest.approx((0.5 + 5e5 + 0.5) / 2, rel=TOL)
    # Switch-DR with tau 100 drops the 1e6 row's correction: (0.5 + 0.5) / 2
    assert SwitchDR(tau=100).estimate(reward, action, pscore, target, q) == pytest.approx(0.5, abs=TOL)
    diagnostics = weight_diagnostics(DR().check(reward, action, pscore, target, q).weights)
    # ESS = (1e6 + 2)^2 / (1e12 + 4)
    assert diagnostics.ess == pytest.approx((1e6 + 2) ** 2 / (1e12 + 4), rel=TOL)
    assert diagnostics.max_weight == pytest.approx(1e6, rel=TOL)


def test_target_that_never_takes_a_logged_action():
    # every w = 0: IPS 0, DR = DM; the self-normalised ratios are 0/0, taken as IPS's 0 and DM
    reward, action, pscore = [1.0, 1.0], [0, 0], [0.5, 0.5]
    target = np.array([[0.0, 1.0], [0.0, 1.0]])
    q = np.array([[0.9, 0.3], [0.9, 0.5]])  # DM: (0.3 + 0.5) / 2 = 0.4
    assert IPS().estimate(reward, action, pscore, target) == 0.0
    assert SNIPS().estimate(reward, action, pscore, target) == 0.0
    assert DR().estimate(reward, action, pscore, target, q) == pytest.approx(0.4, abs=TOL)
    assert SNDR().estimate(reward, action, pscore, target, q) == pytest.approx(0.4, abs=TOL)
    assert SNDR().rows(reward, action, pscore, target, q) == pytest.approx([0.3, 0.5], abs=TOL)
    with pytest.warns(LowESSWarning, match="effective sample size 0.0 of 2 rows"):
        result = evaluate(SNIPS(), reward, action, pscore, target)
    assert (result.ess, result.zero_weight_share, result.max_weight) == (0.0, 1.0, 0.0)
    assert (result.lower, result.upper) == (0.0, 0.0)


def test_all_rewards_equal():
    # r = 0.7 everywhere: SNIPS is 0.7 whatever the weights, with a zero-width interval;
    # IPS is 0.7 mean(w) = 0.7 * 0.875; DR with a model that knows it is 0.7
    reward = np.full(4, 0.7)
    q = np.full((4, 3), 0.7)
    assert SNIPS().estimate(reward, ACTION, PSCORE, TARGET) == pytest.approx(0.7, abs=TOL)
    assert IPS().estimate(reward, ACTION, PSCORE, TARGET) == pytest.approx(0.7 * 0.875, abs=TOL)
    for estimator in (DR(), SNDR(), DM(), SwitchDR(tau=1.0), DRos(shrinkage=2.0)):
        assert estimator.estimate(reward, ACTION, PSCORE, TARGET, q) == pytest.approx(0.7, abs=TOL)
    lo, hi = gaussian_interval(SNIPS().terms(reward, ACTION, PSCORE, TARGET))
    assert (lo, hi) == pytest.approx((0.7, 0.7), abs=TOL)
    # every resample with some weight gives 0.7 again (one of only the w = 0 row, chance 1/256,
    # would give 0: none of these 50 does)
    lo, hi = bootstrap_interval(SNIPS().terms(reward, ACTION, PSCORE, TARGET), n_resamples=50, random_state=0)
    assert (lo, hi) == pytest.approx((0.7, 0.7), abs=TOL)
    lo, hi = gaussian_interval(DR().terms(reward, ACTION, PSCORE, TARGET, q))
    assert (lo, hi) == pytest.approx((0.7, 0.7), abs=TOL)


def test_a_single_action():
    # K = 1: every policy takes it, w = 1: IPS = SNIPS = DR = mean reward, DM = mean model
    reward, action, pscore, target = [1.0, 0.0, 0.5], [0, 0, 0], [1.0, 1.0, 1.0], np.ones((3, 1))
    q = np.array([[0.2], [0.4], [0.9]])
    for estimator in (IPS(), SNIPS()):
        assert estimator.estimate(reward, action, pscore, target) == pytest.approx(0.5, abs=TOL)
    for estimator in (DR(), SNDR(), SwitchDR(tau=0.5), DRos(shrinkage=3.0)):
        # Switch-DR tau 0.5 < w = 1: DM; DRos: DM + 3/(1+3) (mean r - mean q) = 0.5 + 0.75 * 0
        assert estimator.estimate(reward, action, pscore, target, q) == pytest.approx(0.5, abs=TOL)
    assert DM().estimate(reward, action, pscore, target, q) == pytest.approx(0.5, abs=TOL)
    q = np.array([[0.1], [0.1], [0.1]])
    assert SwitchDR(tau=0.5).estimate(reward, action, pscore, target, q) == pytest.approx(0.1, abs=TOL)
    # DRos lambda 3: w~ = 3 / (1 + 3) = 0.75; 0.1 + 0.75 (0.5 - 0.1) = 0.4
    assert DRos(shrinkage=3.0).estimate(reward, action, pscore, target, q) == pytest.approx(0.4, abs=TOL)
    result = evaluate(IPS(), reward, action, pscore, target, min_ess=0)
    assert (result.ess, result.max_weight, result.zero_weight_share) == (3.0, 1.0, 0.0)


# --- closed-form intervals -------------------------------------------------------------------------


def test_gaussian_interval_of_a_plain_mean_by_hand():
    # IPS rows [1, 0, 0, 0.5], mean 0.375; deviations [0.625, -0.375, -0.375, 0.125]
    # squares 0.390625 + 0.140625 + 0.140625 + 0.015625 = 0.6875; s^2 = 0.6875 / 3
    # half-width z * sqrt(s^2 / 4) = z * sqrt(0.6875 / 12)
    half = Z95 * math.sqrt(0.6875 / 12)
    assert Z95 == pytest.approx(1.959963984540054, abs=TOL)
    lo, hi = gaussian_interval(IPS().terms(*LOG))
    assert (lo, hi) == pytest.approx((0.375 - half, 0.375 + half), abs=TOL)
    result = evaluate(IPS(), *LOG, min_ess=0, min_ess_share=0)
    assert (result.estimate, result.lower, result.upper) == pytest.approx((0.375, 0.375 - half, 0.375 + half), abs=TOL)
    # another level: z at 90% = Phi^-1(0.95)
    half90 = NormalDist().inv_cdf(0.95) * math.sqrt(0.6875 / 12)
    assert gaussian_interval(IPS().terms(*LOG), 0.9) == pytest.approx((0.375 - half90, 0.375 + half90), abs=TOL)


def test_gaussian_interval_of_snips_is_the_delta_method_by_hand():
    # SNIPS = C / N with c = w r = [1, 0, 0, 0.5], w = [1, 2, 0, 0.5]; N = 0.875, C / N = 3/7
    # psi = (c - (3/7) w) / N = [4/7, -6/7, 0, 2/7] * 8/7 = [32, -48, 0, 16] / 49
    # sum psi^2 = (1024 + 2304 + 0 + 256) / 2401 = 3584 / 2401; var = that / (4 * 3)
    psi = np.array([32.0, -48.0, 0.0, 16.0]) / 49.0
    assert SNIPS().terms(*LOG).influence() == pytest.approx(psi, abs=TOL)
    half = Z95 * math.sqrt(3584.0 / 2401.0 / 12.0)
    assert gaussian_interval(SNIPS().terms(*LOG)) == pytest.approx((3 / 7 - half, 3 / 7 + half), abs=TOL)


def test_gaussian_interval_of_sndr_is_the_delta_method_by_hand():
    # SNDR = B + C / N: b = q(x, pi_e) = [0.5, 0.2, 0.5, 0.35], B = 0.3875;
    # c = w (r - q(x, a)) = [0.2, -0.2, 0, 0.05], C = 0.0125, N = 0.875, C / N = 1/70
    # c - w/70 = [13, -16, 0, 3] / 70, divided by N (times 8/7) = [52, -64, 0, 12] / 245
    psi = np.array([0.1125, -0.1875, 0.1125, -0.0375]) + np.array([52.0, -64.0, 0.0, 12.0]) / 245.0
    assert SNDR().terms(*LOG).influence() == pytest.approx(psi, abs=TOL)
    value = 0.3875 + 1 / 70
    half = Z95 * math.sqrt(float(psi @ psi) / 12.0)
    assert gaussian_interval(SNDR().terms(*LOG)) == pytest.approx((value - half, value + half), abs=TOL)


def test_gaussian_interval_of_dr_by_hand():
    # DR rows [0.7, 0.0, 0.5, 0.4], mean 0.4; deviations [0.3, -0.4, 0.1, 0.0]; squares sum 0.26
    half = Z95 * math.sqrt(0.26 / 12)
    assert gaussian_interval(DR().terms(*LOG)) == pytest.approx((0.4 - half, 0.4 + half), abs=TOL)


def test_bernstein_interval_by_hand():
    # IPS rows [1, 0, 0, 0.5] in bounds [0, 2]: mean 0.375, V = 0.6875 / 3, delta = 0.025 per side,
    # ln(2 / delta) = ln 80; half = sqrt(2 V ln 80 / 4) + 7 * 2 * ln 80 / (3 * 3)
    log80 = math.log(80.0)
    half = math.sqrt(2 * (0.6875 / 3) * log80 / 4) + 7 * 2 * log80 / 9
    lo, hi = bernstein_interval(IPS().terms(*LOG), bounds=(0.0, 2.0))
    assert (lo, hi) == pytest.approx((0.375 - half, 0.375 + half), abs=TOL)
    # without bounds: the observed range [0, 1]
    half = math.sqrt(2 * (0.6875 / 3) * log80 / 4) + 7 * 1 * log80 / 9
    result = evaluate(IPS(), *LOG, method="bernstein", min_ess=0, min_ess_share=0)
    assert (result.lower, result.upper) == pytest.approx((0.375 - half, 0.375 + half), abs=TOL)
    with pytest.raises(InvalidInputError, match="SNIPS and SNDR are ratios"):
        evaluate(SNIPS(), *LOG, method="bernstein")
    with pytest.raises(InvalidInputError, match="outside bounds"):
        bernstein_interval(IPS().terms(*LOG), bounds=(0.0, 0.9))


def test_closed_form_intervals_with_one_row_are_unbounded():
    terms = IPS().terms([1.0], [0], [0.5], [[1.0, 0.0]])
    assert gaussian_interval(terms) == (-math.inf, math.inf)
    assert bernstein_interval(terms) == (-math.inf, math.inf)


# --- bootstrap --------------------------------------------------------------------------------------


def _random_log(n, k, seed, model=True):
    rng = np.random.default_rng(seed)
    logging = rng.dirichlet(np.ones(k), n)
    action = (rng.random(n)[:, None] > logging.cumsum(axis=1)).sum(axis=1).clip(max=k - 1)
    pscore = logging[np.arange(n), action]
    target = rng.dirichlet(np.full(k, 0.5), n)
    reward = rng.random(n)
    q = rng.random((n, k)) if model else None
    return reward, action, pscore, target, q


def test_bootstrap_is_seeded():
    log = _random_log(200, 4, seed=3)
    for estimator in (IPS(), SNIPS(), DR(), SNDR()):
        terms = estimator.terms(*log)
        first = bootstrap_interval(terms, n_resamples=300, random_state=11)
        assert bootstrap_interval(terms, n_resamples=300, random_state=11) == first
        assert bootstrap_interval(terms, n_resamples=300, random_state=12) != first
        again = evaluate(estimator, *log, method="bootstrap", n_resamples=300, random_state=11, min_ess=0)
        assert (again.lower, again.upper) == first
        assert (again.n_resamples, again.random_state) == (300, 11)


ALL = [IPS(), IPS(clip=3.0), SNIPS(), DM(), DR(), SNDR(), SwitchDR(tau=2.0), DRos(shrinkage=4.0)]


@pytest.mark.parametrize("estimator", ALL, ids=repr)
def test_bootstrap_matches_a_slow_reference_loop(estimator):
    """Resample b: the same n indices the reference draws (one block of rows at this n), the
    estimator re-run on those rows."""
    n = 40
    reward, action, pscore, target, q = _random_log(n, 3, seed=5)
    rng = np.random.default_rng(99)
    reference = []
    for _ in range(200):
        idx = rng.integers(0, n, n, dtype=np.uint32)
        reference.append(estimator.estimate(reward[idx], action[idx], pscore[idx], target[idx], q[idx]))
    values = bootstrap_distribution(estimator.terms(reward, action, pscore, target, q), 200, random_state=99)
    assert values == pytest.approx(np.array(reference), abs=TOL)
    lo, hi = bootstrap_interval(estimator.terms(reward, action, pscore, target, q), 0.9, 200, random_state=99)
    assert (lo, hi) == pytest.approx(tuple(np.percentile(reference, [5.0, 95.0])), abs=TOL)


@pytest.mark.parametrize("estimator", [IPS(), SNIPS(), SNDR()], ids=repr)
def test_blocked_bootstrap_matches_a_slow_reference_loop(monkeypatch, estimator):
    """With several blocks of rows, a resample first deals its n draws to the blocks
    (multinomial over block sizes), then draws uniformly within each block."""
    monkeypatch.setattr(intervals, "_BLOCK", 16)
    n = 50  # blocks of 16, 16, 16, 2 rows
    reward, action, pscore, target, q = _random_log(n, 3, seed=6)
    starts, sizes = np.array([0, 16, 32, 48]), np.array([16, 16, 16, 2])
    rng = np.random.default_rng(7)
    reference = []
    for _ in range(100):
        per_block = rng.multinomial(n, sizes / n)
        blocks = zip(starts, sizes, per_block)
        idx = np.concatenate([start + rng.integers(0, size, k, dtype=np.uint32) for start, size, k in blocks])
        reference.append(estimator.estimate(reward[idx], action[idx], pscore[idx], target[idx], q[idx]))
    values = bootstrap_distribution(estimator.terms(reward, action, pscore, target, q), 100, random_state=7)
    assert values == pytest.approx(np.array(reference), abs=TOL)


def test_blocked_bootstrap_counts_are_multinomial(monkeypatch):
    """Each row's count over resamples has the Multinomial(n, 1/n) mean 1 and variance 1 - 1/n,
    and counts of two rows covary by -1/n, whether or not they share a block."""
    monkeypatch.setattr(intervals, "_BLOCK", 8)
    n, resamples = 20, 20_000
    # stacked indicator rows of rows 0, 1 (block 0), 9 (block 1), 19 (block 2): sums are their counts
    counts = intervals._resample_sums(np.eye(n)[[0, 1, 9, 19]], resamples, np.random.default_rng(0))
    assert (counts == np.round(counts)).all()
    assert intervals._resample_sums(np.ones((1, n)), 10, np.random.default_rng(0)) == pytest.approx(np.full((10, 1), n))
    assert counts.mean(axis=0) == pytest.approx(np.ones(4), abs=0.02)
    cov = np.cov(counts.T)
    assert np.diag(cov) == pytest.approx(np.full(4, 1 - 1 / n), abs=0.03)
    assert cov[0, 1] == pytest.approx(-1 / n, abs=0.02) and cov[0, 2] == pytest.approx(-1 / n, abs=0.02)


def test_bootstrap_of_many_estimators_shares_its_resamples():
    log = _random_log(100, 3, seed=8)
    terms = [IPS().terms(*log), SNIPS().terms(*log), DR().terms(*log)]
    together = bootstrap_distribution(terms, 50, random_state=4)
    assert together.shape == (50, 3)
    for j, t in enumerate(terms):
        assert together[:, j] == pytest.approx(bootstrap_distribution(t, 50, random_state=4), abs=TOL)


# --- diagnostics ---------------------------------------------------------------------------------


def test_weight_diagnostics_by_hand():
    # w = [1, 2, 0, 0.5]: ESS = 3.5^2 / (1 + 4 + 0 + 0.25) = 12.25 / 5.25 = 7/3
    result = evaluate(IPS(), *LOG, min_ess=0, min_ess_share=0)
    assert result.ess == pytest.approx(7 / 3, abs=TOL)
    assert (result.max_weight, result.zero_weight_share, result.n) == (2.0, 0.25, 4)
    # the diagnostics read the raw weights, not the clipped ones
    assert evaluate(IPS(clip=0.1), *LOG, min_ess=0).max_weight == 2.0


def test_low_ess_warning_fires_below_the_threshold_only():
    with pytest.warns(LowESSWarning, match=r"effective sample size 2.3 of 4 rows is below 3"):
        result = evaluate(IPS(), *LOG, min_ess=3.0)  # ESS 7/3 < 3
    assert len(result.warnings) == 1 and "below 3" in result.warnings[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert evaluate(IPS(), *LOG, min_ess=2.0, min_ess_share=0.5).warnings == ()  # threshold max(2, 2) <= 7/3
    with pytest.warns(LowESSWarning):
        evaluate(IPS(), *LOG, min_ess=0.0, min_ess_share=0.6)  # 0.6 * 4 = 2.4 > 7/3
    # defaults: below 100 rows of ESS
    with pytest.warns(LowESSWarning):
        evaluate(DR(), *LOG)
    # a large log from a close policy does not warn
    rng = np.random.default_rng(0)
    n = 20_000
    action = rng.integers(0, 2, n)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        evaluate(SNIPS(), rng.random(n), action, np.full(n, 0.5), np.tile([0.6, 0.4], (n, 1)))


def test_estimate_prints_and_round_trips_through_json():
    result = evaluate(DRos(shrinkage=2.0), *LOG, method="bootstrap", n_resamples=20, random_state=3, min_ess=0)
    data = json.loads(json.dumps(result.to_dict()))
    assert Estimate.from_dict(data) == result
    assert data["estimator"] == "dros" and data["params"] == {"shrinkage": 2.0} and data["method"] == "bootstrap"
    printed = {"estimate", "lower", "upper", "level", "method", "n", "ess", "max_weight", "zero_weight_share", "warnings"}
    assert set(data) >= printed
    assert str(result).startswith("dros ")


# --- validation ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"pscore": PSCORE[:3]}, "pscore has 3 rows, but reward has 4"),
        ({"action": ACTION[:2]}, "action has 2 rows, but reward has 4"),
        ({"action_dist": TARGET[:1]}, "action_dist has 1 rows, but reward has 4"),
        ({"pscore": np.array([0.5, 0.0, 0.25, 0.5])}, r"pscore must be in \(0, 1\]; row 1 is 0.0"),
        ({"pscore": np.array([0.5, 0.25, 1.5, 0.5])}, r"pscore must be in \(0, 1\]; row 2 is 1.5"),
        ({"pscore": np.array([0.5, -0.1, 0.25, 0.5])}, r"pscore must be in \(0, 1\]; row 1 is -0.1"),
        ({"action_dist": TARGET * 0.9}, r"action_dist rows must sum to 1 within 1e-06; row 0 sums to 0.9"),
        ({"action_dist": TARGET[:, :, None]}, r"action_dist must be 2-dimensional \(n, K\), got shape \(4, 3, 1\); for OBP"),
        ({"action_dist": np.array([[1.5, -0.5, 0.0]] * 4)}, r"action_dist must be >= 0; row 0, column 1 is -0.5"),
        ({"action": np.array([0, 1, 3, 0])}, r"action must be in \[0, 3\) \(action_dist has 3 columns\); row 2 is 3"),
        ({"action": np.array([0, -1, 2, 0])}, r"action must be in \[0, 3\) .*; row 1 is -1"),
        ({"action": np.array([0.0, 1.0, 2.0, 0.0])}, "action must hold integer action indices, got dtype float64"),
        ({"reward": np.array([1.0, np.nan, 0.5, 1.0])}, "reward must be finite; row 1 is nan"),
        ({"action_dist": np.where(CELL == 5, np.nan, TARGET)}, "action_dist must be finite; row 1, column 2 is nan"),
        ({"estimated_rewards": np.where(CELL == 3, np.inf, Q)}, "estimated_rewards must be finite; row 1, column 0 is inf"),
        ({"reward": REWARD[:, None]}, r"reward must be 1-dimensional \(n,\), got shape \(4, 1\)"),
        ({"reward": [], "action": np.array([], int), "pscore": [], "action_dist": np.zeros((0, 3))}, "reward has 0 rows"),
        ({"estimated_rewards": Q[:, :2]}, r"estimated_rewards has shape \(4, 2\), but action_dist has shape \(4, 3\)"),
        ({"estimated_rewards": None}, r"DR needs estimated_rewards of shape \(n, K\) = \(4, 3\)"),
    ],
)
def test_bad_inputs_are_refused_with_sklearn_style_messages(change, message):
    arrays = {"reward": REWARD, "action": ACTION, "pscore": PSCORE, "action_dist": TARGET, "estimated_rewards": Q, **change}
    with pytest.raises(InvalidInputError, match=message) as error:
        DR().estimate(**arrays)
    assert isinstance(error.value, ValueError)


def test_row_sums_within_tolerance_are_accepted():
    target = TARGET.copy()
    target[0] = [0.5 + 5e-7, 0.5, 0.0]
    assert IPS().estimate(REWARD, ACTION, PSCORE, target) == pytest.approx((1 + 1e-6) * 1.0 / 4 + 0.5 / 4, abs=TOL)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: IPS(clip=-1.0), r"IPS clip must be >= 0 \(inf: off\), got -1.0"),
        (lambda: DR(clip=float("nan")), "DR clip must be >= 0"),
        (lambda: SwitchDR(tau=True), "SwitchDR tau must be a number, got True"),
        (lambda: DRos(shrinkage="big"), "DRos shrinkage must be a number"),
        (lambda: make_estimator("magic"), "unknown estimator 'magic'; known: dm, dr, dros, ips, sndr, snips, switch_dr"),
        (lambda: make_estimator("dros"), "estimator 'dros': .*shrinkage"),
        (lambda: evaluate(IPS(), *LOG, method="jackknife"), "method must be one of gaussian, bernstein, bootstrap"),
        (lambda: evaluate(IPS(), *LOG, level=1.0), r"level must be in \(0, 1\), got 1.0"),
        (lambda: bootstrap_distribution(IPS().terms(*LOG), 0), "n_resamples must be an int >= 1"),
    ],
)
def test_bad_parameters_are_refused(build, message):
    with pytest.raises(InvalidInputError, match=message):
        build()


def test_registry_builds_every_estimator_by_name():
    assert sorted(ESTIMATORS) == ["dm", "dr", "dros", "ips", "sndr", "snips", "switch_dr"]
    assert make_estimator("switch_dr", tau=2) == SwitchDR(tau=2.0)
    assert all(ESTIMATORS[name].name == name for name in ESTIMATORS)


def test_estimators_without_a_model_ignore_estimated_rewards():
    assert IPS().estimate(REWARD, ACTION, PSCORE, TARGET, np.zeros((7, 7))) == pytest.approx(0.375, abs=TOL)


# --- reward models -------------------------------------------------------------------------------


def test_ridge_matches_scikit_learn():
    from sklearn.linear_model import Ridge as SkRidge

    rng = np.random.default_rng(2)
    for n, d in ((50, 5), (8, 20)):  # the primal and the dual solve
        X, y = rng.normal(size=(n, d)), rng.normal(size=n)
        for fit_intercept in (True, False):
            ours = Ridge(alpha=0.7, fit_intercept=fit_intercept).fit(X, y)
            theirs = SkRidge(alpha=0.7, fit_intercept=fit_intercept).fit(X, y)
            assert ours.coef_ == pytest.approx(theirs.coef_, abs=1e-10)
            assert ours.intercept_ == pytest.approx(theirs.intercept_, abs=1e-10)
            assert ours.predict(X) == pytest.approx(theirs.predict(X), abs=1e-10)


def test_per_action_model_fits_each_action_on_its_own_rows():
    # action 0 rows: y = 1 + 2x; action 1 rows: y = 3 (x ignored): an exact fit with alpha 0
    X = np.array([[0.0], [1.0], [2.0], [5.0], [7.0]])
    action = np.array([0, 0, 0, 1, 1])
    reward = np.array([1.0, 3.0, 5.0, 3.0, 3.0])
    model = PerActionModel(2, Ridge(alpha=0.0)).fit(X, action, reward)
    assert model.predict(np.array([[10.0]])) == pytest.approx(np.array([[21.0, 3.0]]), abs=1e-9)


def test_shared_model_with_one_hot_features():
    # q(x, k) = x + k on 2 actions: the one-hot model [x, 1{k=0}, 1{k=1}] fits it exactly
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 1))
    action = rng.integers(0, 2, 30)
    features = one_hot_features(x, 2)
    assert features.shape == (30, 2, 3)
    model = SharedModel(Ridge(alpha=0.0)).fit(features, action, x[:, 0] + action)
    assert model.predict(features) == pytest.approx(x + np.array([0.0, 1.0]), abs=1e-9)
    assert one_hot_features(np.array([[2.0, 3.0]]), 2, interactions=True).tolist() == [
        [[2.0, 3.0, 1.0, 0.0, 2.0, 3.0, 0.0, 0.0], [2.0, 3.0, 0.0, 1.0, 0.0, 0.0, 2.0, 3.0]]
    ]


class _Recorder:
    """A regressor that remembers, per fitted copy, the row ids (column 0) it saw."""

    copies: ClassVar[list[_Recorder]] = []

    def __init__(self) -> None:
        self.fitted: set[int] = set()
        self.predicted: set[int] = set()

    def fit(self, X, y):
        self.fitted = set(X[:, 0].astype(int).tolist())
        _Recorder.copies.append(self)
        return self

    def predict(self, X):
        self.predicted |= set(X[:, 0].astype(int).tolist())
        return np.zeros(X.shape[0])


@pytest.mark.parametrize("layout", ["per_action", "shared"])
def test_cross_fitting_never_predicts_a_row_with_a_model_that_saw_it(layout):
    _Recorder.copies = []
    n, k = 23, 3
    rng = np.random.default_rng(0)
    ids = np.arange(n, dtype=float)
    action = rng.integers(0, k, n)
    reward = rng.random(n)
    if layout == "per_action":
        features = np.column_stack([ids, rng.normal(size=n)])
        q = cross_fit(_Recorder(), features, action, reward, n_actions=k, n_folds=4, random_state=5)
        assert len(_Recorder.copies) == 4 * k  # one regressor per fold and action
    else:
        features = np.concatenate([np.repeat(ids[:, None, None], k, axis=1), rng.normal(size=(n, k, 2))], axis=2)
        q = cross_fit(_Recorder(), features, action, reward, n_folds=4, random_state=5)
        assert len(_Recorder.copies) == 4
    assert q.shape == (n, k)
    predicted = set()
    for copy in _Recorder.copies:
        assert copy.fitted and copy.predicted
        assert not copy.fitted & copy.predicted  # never its own rows
        predicted |= copy.predicted
    assert predicted == set(range(n))
    # every fold's models saw every row outside the fold: the folds partition the rows
    for copy in _Recorder.copies:
        assert copy.fitted | copy.predicted == set(range(n)) or layout == "per_action"
    # seeded: the same seed deals the same folds
    _Recorder.copies = []
    again = cross_fit(_Recorder(), features, action, reward, n_actions=k, n_folds=4, random_state=5)
    assert again == pytest.approx(q)


def test_cross_fit_with_ridge_recovers_a_linear_reward():
    rng = np.random.default_rng(1)
    n = 2000
    x = np.column_stack([np.ones(n), rng.normal(size=n)])
    action = rng.integers(0, 2, n)
    truth = np.column_stack([0.2 + 0.5 * x[:, 1], 0.6 - 0.1 * x[:, 1]])
    reward = truth[np.arange(n), action] + rng.normal(scale=0.05, size=n)
    q = cross_fit(Ridge(alpha=1.0), x, action, reward, n_actions=2, random_state=0)
    assert np.abs(q - truth).max() < 0.02
    # any fit/predict regressor works: scikit-learn's linear regression, shared layout
    from sklearn.linear_model import LinearRegression

    shared = one_hot_features(x[:, 1:], 2, interactions=True)
    q_sk = cross_fit(LinearRegression(), shared, action, reward, random_state=0)
    assert np.abs(q_sk - truth).max() < 0.02


def test_cross_fit_refuses_bad_arguments():
    X = np.zeros((10, 2))
    action = np.zeros(10, dtype=int)
    with pytest.raises(InvalidInputError, match="need n_actions"):
        cross_fit(Ridge(), X, action, np.zeros(10))
    with pytest.raises(InvalidInputError, match=r"n_folds must be an int in \[2, n=10\], got 1"):
        cross_fit(Ridge(), X, action, np.zeros(10), n_actions=2, n_folds=1)
    with pytest.raises(InvalidInputError, match=r"action must be in \[0, 2\)"):
        cross_fit(Ridge(), X, action + 2, np.zeros(10), n_actions=2)
    with pytest.raises(InvalidInputError, match="a regressor needs fit"):
        cross_fit(object(), X, action, np.zeros(10), n_actions=2)
    with pytest.raises(InvalidInputError, match=r"reward has shape \(9,\), but features have 10 rows"):
        cross_fit(Ridge(), X, action, np.zeros(9), n_actions=2)


def test_reward_model_features_are_the_encoders_own():
    events = [
        {"context": {"numeric": {"tokens": float(i)}, "categorical": {"intent": "billing" if i % 2 else "sales"}},
         "actions": [{"id": "gpt"}, {"id": "small", "features": {"numeric": {"cost": 0.1}}}]}
        for i in range(5)
    ]  # fmt: skip
    per_arm = FeatureEncoder(FeatureConfig(dimension=16, normalize=False))
    assert reward_model_features(per_arm, events) == pytest.approx(per_arm.context_matrix(e["context"] for e in events))
    shared = FeatureEncoder(FeatureConfig(dimension=16, shared=True, interactions=True, normalize=False))
    rows = reward_model_features(shared, events)
    assert rows.shape == (5, 2, 16)
    for i, event in enumerate(events):
        assert rows[i] == pytest.approx(shared.action_matrix(event["context"], event["actions"]))
    with pytest.raises(InvalidInputError, match="event 1 has 1 candidate actions, but the first has 2"):
        reward_model_features(shared, [events[0], {**events[1], "actions": events[1]["actions"][:1]}])


# --- documentation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "module",
    [
        "learner.evaluation",
        "learner.evaluation._inputs",
        "learner.evaluation.estimators",
        "learner.evaluation.importance",
        "learner.evaluation.intervals",
        "learner.evaluation.reward_models",
    ],
)
def test_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
