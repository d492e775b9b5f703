"""One suite every registered policy passes, plus the linear policies' closed forms.

Each policy's ``_unit_test_params()`` builds it; every test below runs for every name in
``POLICIES`` unless it proves something only some policies promise (ridge solution, drift of a
precision matrix, Beta segments).
"""

from __future__ import annotations

import doctest
import importlib
import itertools
import math
import struct
import zlib

import numpy as np
import pytest

from learner.policies import (
    POLICIES,
    SHARED_ARM,
    Policy,
    Portfolio,
    ScoringOnlyError,
    StateFormatError,
    make_policy,
)
from learner.policies._robust import RobustLearning

NAMES = sorted(POLICIES)
LINEAR = ["lin_igw", "lin_ts", "lin_ucb", "shared_lin_ts", "shared_lin_ucb"]
ARMS = ["a", "b", "c"]


def build(name: str, **overrides) -> Policy:
    cls = POLICIES[name]
    return cls(**{**cls._unit_test_params(), **overrides})


def rows(policy: Policy, n: int, rng: np.random.Generator) -> np.ndarray:
    """Rows with an intercept and features; columns 1 and 2 are zero half the time each, so
    beta_ts (segment_slots [1, 2]) sees every segment."""
    X = np.column_stack([np.ones(n), rng.normal(size=(n, policy.dim - 1))])
    X[:, 1:3] *= rng.random((n, 2)) < 0.5
    return X


def labelled(policy: Policy, n: int, seed: int, arms=ARMS):
    rng = np.random.default_rng(seed)
    X = rows(policy, n, rng)
    return X, list(rng.choice(arms, size=n)), rng.random(n), rng.uniform(0.2, 2.0, size=n)


def statistics(policy: Policy) -> dict[str, dict[str, np.ndarray]]:
    return {arm: policy.arm_statistics(arm) for arm in policy.arm_ids()}


def assert_same_statistics(left: Policy, right: Policy, rtol: float = 0.0, atol: float = 0.0) -> None:
    assert left.arm_ids() == right.arm_ids()
    for arm in left.arm_ids():
        assert left.update_count(arm) == right.update_count(arm)
        a, b = left.arm_statistics(arm), right.arm_statistics(arm)
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_allclose(a[name], b[name], rtol=rtol, atol=atol, err_msg=f"{arm}/{name}")


def decisions(policy: Policy, seed: int, n: int = 200, rng=None) -> list[tuple[int, tuple[float, ...]]]:
    gen = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        X = np.broadcast_to(rows(policy, 1, gen)[0], (len(ARMS), policy.dim))
        choice = policy.probabilities(X, ARMS, rng)
        out.append((choice.chosen, tuple(choice.probabilities.tolist())))
    return out


def trained(name: str, **overrides) -> Policy:
    policy = build(name, **overrides)
    X, arms, r, w = labelled(policy, 300, seed=1)
    policy.update_batch(X, arms, r, w)
    return policy


# --- the distribution ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_probabilities_form_a_distribution_above_the_floor(name):
    policy = trained(name)
    rng = np.random.default_rng(5)
    for trial in range(60):
        K = 1 + trial % 6
        arms = [f"arm{(trial + k) % 8}" for k in range(K)]  # known and brand-new arms mixed
        choice = policy.probabilities(rows(policy, K, rng), arms, rng)
        p = choice.probabilities
        assert p.shape == (K,)
        assert abs(p.sum() - 1.0) <= 1e-12
        assert (p >= 0).all()
        assert (p >= policy.eps0 / K - 1e-15).all()
        assert 0 <= choice.chosen < K
        assert choice.probability == p[choice.chosen] > 0


@pytest.mark.parametrize("name", NAMES)
def test_choice_is_drawn_from_the_reported_distribution(name):
    """Over many decisions on a fixed state, each candidate is chosen as often as the reported
    probabilities say (for Thompson sampling: the estimated distribution the choice is drawn from)."""
    policy = trained(name, eps0=0.05)
    X = np.broadcast_to(rows(policy, 1, np.random.default_rng(3))[0], (len(ARMS), policy.dim))
    rng = np.random.default_rng(11)
    n = 6000
    chosen = np.zeros(len(ARMS))
    reported = np.zeros(len(ARMS))
    for _ in range(n):
        choice = policy.probabilities(X, ARMS, rng)
        chosen[choice.chosen] += 1
        reported += choice.probabilities
    freq, p = chosen / n, reported / n
    tolerance = 5 * np.sqrt(p * (1 - p) / n) + 1e-3
    assert (np.abs(freq - p) <= tolerance).all(), (freq, p)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_gives_the_same_choices_and_different_seeds_differ(name):
    assert decisions(trained(name, seed=1), 9) == decisions(trained(name, seed=1), 9)
    assert decisions(trained(name, seed=1), 9) != decisions(trained(name, seed=2), 9)
    assert [c for c, _ in decisions(build(name, seed=1), 9)] != [c for c, _ in decisions(build(name, seed=2), 9)]
    # an explicit rng (seed or Generator) overrides the policy's own generator
    assert decisions(trained(name, seed=1), 4, 50, rng=np.random.default_rng(3)) == decisions(
        trained(name, seed=2), 4, 50, rng=np.random.default_rng(3)
    )


@pytest.mark.parametrize("name", ["epsilon_greedy", "lin_ucb", "shared_lin_ucb", "softmax", "ucb1"])
def test_candidate_order_does_not_change_the_distribution(name):
    """Deterministic policies score each candidate on its own: permuting the candidates permutes
    the distribution."""
    policy = trained(name, eps0=0.0)
    X = np.tile(rows(policy, 1, np.random.default_rng(2))[0], (3, 1))
    if policy.shared:
        X[:, 1:] += np.arange(3)[:, None] * 0.3  # shared models tell candidates apart by their rows
    full = policy.probabilities(X, ARMS).probabilities
    for order in itertools.permutations(range(3)):
        got = policy.probabilities(X[list(order)], [ARMS[i] for i in order]).probabilities
        np.testing.assert_allclose(got, full[list(order)], rtol=0, atol=1e-12)


def test_lin_ucb_scores_any_subset_or_order_of_its_arms_from_theta_and_L():
    """Whether the candidates' arms are adjacent in memory or not, each is scored with its own
    theta and L: the choice is the argmax of x . theta + alpha ||L^T x||."""
    policy = build("lin_ucb", eps0=0.0, alpha=0.7)
    arms = ["w", "x", "y", "z"]
    X, _, r, _ = labelled(policy, 400, seed=6)
    policy.update_batch(X, [arms[i % 4] for i in range(400)], r + np.repeat([0.0, 0.3, -0.2, 0.1], 100))
    rng = np.random.default_rng(9)
    for size in (2, 3, 4):
        for subset in itertools.permutations(arms, size):
            x = rows(policy, 1, rng)[0]
            view = {a: policy.scoring_arrays(a) for a in subset}
            scores = [x @ view[a]["theta"] + 0.7 * np.linalg.norm(view[a]["L"].T @ x) for a in subset]
            choice = policy.probabilities(np.tile(x, (size, 1)), list(subset))
            assert choice.chosen == int(np.argmax(scores))
            assert choice.probability == 1.0


@pytest.mark.parametrize("name", NAMES)
def test_arm_first_seen_among_candidates_enters_at_its_prior(name):
    prior = (0.3, 2.5)
    policy = trained(name, arm_priors={"newcomer": prior})
    fresh = build(name, prior_mean=prior[0], prior_strength=prior[1])
    X = rows(policy, 2, np.random.default_rng(0))
    policy.probabilities(X, ["a", "newcomer"])
    if policy.shared:
        assert policy.arm_ids() == [SHARED_ARM]  # one model: a new action needs no state
        return
    assert "newcomer" in policy.arm_ids()
    assert policy.update_count("newcomer") == 0
    fresh.probabilities(X[:1], ["newcomer"])
    for stat, value in fresh.arm_statistics("newcomer").items():
        np.testing.assert_array_equal(policy.arm_statistics("newcomer")[stat], value)


# --- learning --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "forgetting",
    [{"gamma": 1.0}, {"gamma": 0.9}, {"half_life_s": 20.0}, {"gamma": 0.95, "half_life_s": 20.0}],
    ids=["none", "gamma", "half_life", "both"],
)
@pytest.mark.parametrize("name", NAMES)
def test_batch_update_equals_sequential_updates(name, forgetting):
    """Robust learning (on by default) weighs a row by its model as the batch finds it, so it is
    off here (a portfolio passes it to its members); tests/test_robust.py checks how it cuts."""
    off = {"huber_q": 0.0} if issubclass(POLICIES[name], (RobustLearning, Portfolio)) else {}
    batched, sequential, chunked = (build(name, **forgetting, **off) for _ in range(3))
    X, arms, r, w = labelled(batched, 120, seed=2)
    # event times a little out of order, as a join emits them: each row ages by its own time
    t = np.arange(120) * 1_000 + np.random.default_rng(4).integers(-3_000, 3_000, 120)
    touched = batched.update_batch(X, arms, r, w, t)
    assert sorted(touched) == ([SHARED_ARM] if batched.shared else sorted(set(arms)))
    for i in range(len(r)):
        sequential.update_batch(X[i : i + 1], arms[i : i + 1], r[i : i + 1], w[i : i + 1], t[i : i + 1])
    for lo in range(0, len(r), 25):
        chunked.update_batch(X[lo : lo + 25], arms[lo : lo + 25], r[lo : lo + 25], w[lo : lo + 25], t[lo : lo + 25])
    assert_same_statistics(batched, sequential, rtol=1e-10, atol=1e-10)
    assert_same_statistics(batched, chunked, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_forgetting_tracks_a_change_of_rewards(name):
    """With gamma < 1 the estimate follows a reward that changes; with gamma = 1 it averages."""
    forgetful, steadfast = build(name, gamma=0.95, eps0=0.0), build(name, gamma=1.0, eps0=0.0)
    X = np.zeros((400, forgetful.dim))
    X[:, 0] = 1.0
    r = np.r_[np.full(200, 1.0), np.full(200, 0.0)]
    arms = ["a"] * 200 + ["a"] * 200
    for policy in (forgetful, steadfast):
        policy.update_batch(X[:200], arms[:200], r[:200])
        policy.update_batch(X[200:], arms[200:], r[200:])
    cand = X[:2]

    def mean_of_a(policy):
        stats = policy.arm_statistics(SHARED_ARM if policy.shared else "a")
        if "A" in stats:
            return float(np.linalg.solve(stats["A"], stats["b"]) @ cand[0])
        if "alpha" in stats:
            return float(stats["alpha"][-1] / (stats["alpha"][-1] + stats["beta"][-1]))
        return float(stats["s"] / stats["n"])

    assert mean_of_a(forgetful) < 0.1
    assert mean_of_a(steadfast) > 0.3
    policy_rows = build(name).probabilities(cand, ["a", "b"])  # still a distribution afterwards
    assert abs(policy_rows.probabilities.sum() - 1) < 1e-12


@pytest.mark.parametrize("name", LINEAR)
def test_posterior_mean_is_the_closed_form_ridge_solution(name):
    lam = 2.5
    policy = build(name, dim=6, prior_strength=lam, prior_mean=0.0)
    rng = np.random.default_rng(7)
    n = 400
    X = np.column_stack([np.ones(n), rng.normal(size=(n, 5))])
    y = X @ rng.normal(size=6) + rng.normal(scale=0.3, size=n)
    w = rng.uniform(0.5, 2.0, size=n)
    arms = list(rng.choice(ARMS, size=n))
    for lo in range(0, n, 64):
        policy.update_batch(X[lo : lo + 64], arms[lo : lo + 64], y[lo : lo + 64], w[lo : lo + 64])
    groups = {SHARED_ARM: np.ones(n, bool)} if policy.shared else {a: np.array(arms) == a for a in ARMS}
    for arm, mask in groups.items():
        Xa, ya, wa = X[mask], y[mask], w[mask]
        ridge = np.linalg.solve(Xa.T @ (wa[:, None] * Xa) + lam * np.eye(6), Xa.T @ (wa * ya))
        np.testing.assert_allclose(policy.posterior_mean(arm), ridge, rtol=0, atol=1e-8)
        np.testing.assert_allclose(policy.scoring_arrays(arm)["theta"], ridge, rtol=0, atol=1e-8)
        L = policy.scoring_arrays(arm)["L"]
        cov = np.linalg.inv(Xa.T @ (wa[:, None] * Xa) + lam * np.eye(6))
        np.testing.assert_allclose(L @ L.T, cov, rtol=0, atol=1e-10)
        np.testing.assert_array_equal(L, np.triu(L))


@pytest.mark.parametrize("name", NAMES)
def test_expected_rewards_score_each_row_with_its_own_arm_and_nan_for_an_unknown_one(name):
    policy = trained(name, refactor_every=50) if name in LINEAR else trained(name)
    X, arms, *_ = labelled(policy, 40, seed=2, arms=[*ARMS, "new"])
    got = policy.expected_rewards(X, arms)
    for i, arm in enumerate(arms):
        if policy.shared:
            assert got[i] == pytest.approx(X[i] @ policy.posterior_mean(SHARED_ARM), abs=1e-9)
        elif arm == "new":
            assert math.isnan(got[i])
        elif name in LINEAR:  # the posterior mean as of the last row, whatever refactor_every
            assert got[i] == pytest.approx(X[i] @ policy.posterior_mean(arm), abs=1e-9)
        elif name == "portfolio":  # its acting member's posterior mean
            assert got[i] == pytest.approx(X[i] @ policy.acting_member.posterior_mean(arm), abs=1e-9)
        elif name == "beta_ts":  # the Beta posterior's mean in the row's segment
            stats, seg = policy.arm_statistics(arm), policy.segments(X[i : i + 1])[0]
            assert got[i] == pytest.approx(stats["alpha"][seg] / (stats["alpha"][seg] + stats["beta"][seg]))
        else:  # the arm's weighted mean reward
            stats = policy.arm_statistics(arm)
            assert got[i] == pytest.approx(stats["s"] / stats["n"])
    np.testing.assert_array_equal(policy.scoring_view().expected_rewards(X, arms), got)


def test_lin_igw_gives_the_inverse_gap_closed_form_checked_by_hand():
    """theta = r / 2 (one row each, ridge 1): 0.8, 0.5, 0; gamma_t = 2 * sqrt(3 rows) = 3.4641;
    p_b = 1 / (3 + 3.4641 * 0.3) = 0.247572, p_c = 1 / (3 + 3.4641 * 0.8) = 0.173272,
    p_a = 1 - p_b - p_c = 0.579156; with the floor 0.1: p * 0.9 + 0.1 / 3."""
    from learner.policies import LinIGW

    policy = LinIGW(dim=1, gamma_scale=2.0, gamma_exponent=0.5, eps0=0.1, prior_strength=1.0)
    policy.update_batch(np.ones((3, 1)), ["a", "b", "c"], [1.6, 1.0, 0.0])
    choice = policy.probabilities(np.ones((3, 1)), ["a", "b", "c"], rng=0)
    np.testing.assert_allclose(choice.probabilities, [0.554574, 0.256148, 0.189278], atol=1e-6)
    again = policy.scoring_view().probabilities(np.ones((3, 1)), ["a", "b", "c"], rng=99)
    np.testing.assert_array_equal(again.probabilities, choice.probabilities)  # deterministic: no draws


def test_optimistic_igw_takes_its_gaps_between_ucb_scores_checked_by_hand():
    """Ridge 1, x = 1: arm a (rewards 1, 1) has A = 3, theta = 2/3, width sqrt(1/3), score
    1.244017; b (0.5) A = 2, theta = 0.25, width sqrt(1/2), score 0.957107; c never played: the
    prior, score 0 + 1 = 1. gamma = 2: p_b = 1 / (3 + 2 * 0.286910) = 0.279813,
    p_c = 1 / (3 + 2 * 0.244017) = 0.286694, p_a = 1 - p_b - p_c = 0.433493. The untried arm
    gets more than the tried, worse-scoring one: optimism, where plain SquareCB (alpha 0) would
    give c the least (its prediction, 0, is the lowest)."""
    from learner.policies import LinIGW

    policy = LinIGW(dim=1, alpha=1.0, gamma_scale=2.0, gamma_exponent=0.0, eps0=0.0, prior_strength=1.0)
    policy.update_batch(np.ones((3, 1)), ["a", "a", "b"], [1.0, 1.0, 0.5])
    choice = policy.probabilities(np.ones((3, 1)), ["a", "b", "c"], rng=0)
    np.testing.assert_allclose(choice.probabilities, [0.433493, 0.279813, 0.286694], atol=1e-6)
    assert choice.probabilities.min() > 0  # without a floor, every candidate > 0 all the same
    assert LinIGW(dim=1).eps0 == 0.01  # the default floor, for off-policy evaluation
    plain = LinIGW(dim=1, alpha=0.0, gamma_scale=2.0, gamma_exponent=0.0, eps0=0.0, prior_strength=1.0)
    plain.update_batch(np.ones((3, 1)), ["a", "a", "b"], [1.0, 1.0, 0.5])
    p = plain.probabilities(np.ones((3, 1)), ["a", "b", "c"], rng=0).probabilities
    assert p[2] < p[1] < p[0]


def test_lin_igw_raises_a_new_arm_to_its_posterior_chance_checked_by_hand():
    """Ridge 1, x = 1, alpha 0, gamma 1,000: arm a (ten rows of 1) has theta = 10/11 = 0.909091;
    c, never played, is the prior N(0, 1). Inverse-gap weighting gives c 1 / (2 + 1000 * 0.909091)
    = 0.001098; c is new (0 rows < 5), and its chance of beating a's score is
    Phi(-0.909091) = 0.181651, so it gets 0.1 * 0.181651 = 0.018165 (under the cap 1/2). With
    five rows of 0 (theta 0) c is no longer new: back to inverse-gap weighting,
    1 / (2 + 1000 * 0.909091). A share of 1 is capped at a uniform choice's: with a at theta
    0.25 (one row of 0.5), Phi(-0.25) = 0.401 for each of two new arms, 1/3 each."""
    from learner.policies import LinIGW

    settings = dict(dim=1, alpha=0.0, gamma_scale=1000.0, gamma_exponent=0.0, eps0=0.0, prior_strength=1.0)
    policy = LinIGW(**settings)
    policy.update_batch(np.ones((10, 1)), ["a"] * 10, [1.0] * 10)
    p = policy.probabilities(np.ones((2, 1)), ["a", "c"], rng=0).probabilities
    np.testing.assert_allclose(p, [0.981835, 0.018165], atol=1e-6)
    off = LinIGW(**settings, new_arm_share=0.0)
    off.update_batch(np.ones((10, 1)), ["a"] * 10, [1.0] * 10)
    np.testing.assert_allclose(off.probabilities(np.ones((2, 1)), ["a", "c"], rng=0).probabilities,
                               [0.998902, 0.001098], atol=1e-6)
    np.testing.assert_array_equal(policy.scoring_view().probabilities(np.ones((2, 1)), ["a", "c"], rng=5).probabilities, p)
    policy.update_batch(np.ones((4, 1)), ["c"] * 4, [0.0] * 4)  # four rows: still new
    assert policy.probabilities(np.ones((2, 1)), ["a", "c"], rng=0).probabilities[1] > 0.002
    policy.update_batch(np.ones((1, 1)), ["c"], [0.0])  # the fifth: inverse-gap weighting alone
    np.testing.assert_allclose(policy.probabilities(np.ones((2, 1)), ["a", "c"], rng=0).probabilities,
                               [1 - 1 / (2 + 1000 / 1.1), 1 / (2 + 1000 / 1.1)], rtol=1e-9)
    capped = LinIGW(**settings, new_arm_share=1.0)
    capped.update_batch(np.ones((1, 1)), ["a"], [0.5])  # theta 0.25: Phi(-0.25) = 0.401 for c and d
    q = capped.probabilities(np.ones((3, 1)), ["a", "c", "d"], rng=0).probabilities
    np.testing.assert_allclose(q, [1 / 3, 1 / 3, 1 / 3], atol=1e-12)
    assert LinIGW(dim=1).new_arm_rows == 5 and LinIGW(dim=1).new_arm_share == 0.1
    # the defaults stay out of the parameters (an SDK from before them loads the snapshot); others round-trip
    assert not {"new_arm_rows", "new_arm_share"} & set(LinIGW(dim=1).get_params())
    assert LinIGW(**LinIGW(dim=1, new_arm_rows=3, new_arm_share=0.0).get_params()).get_params()["new_arm_rows"] == 3
    for bad in ({"new_arm_rows": -1}, {"new_arm_rows": 2.5}, {"new_arm_share": 1.5}, {"new_arm_share": True}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            LinIGW(dim=1, **bad)


def test_lin_igw_without_alpha_grows_its_optimism_with_the_candidates_as_documented():
    """0.3 up to ten candidates, 0.3 log10 K above, 0.6 from a hundred: the same probabilities
    as that alpha given (tests/test_fastscore.py checks the compiled path against numpy's, K up
    to 70); a given alpha holds at any K."""
    from learner.policies import LinIGW
    from learner.policies.lin_igw import ALPHA, ALPHA_GROWTH

    assert (ALPHA, ALPHA_GROWTH) == (0.3, 2.0)
    unset = LinIGW(dim=3, seed=1)
    assert unset.get_params()["alpha"] is None and LinIGW(**unset.get_params()).alpha is None
    expected = {1: 0.3, 3: 0.3, 10: 0.3, 20: 0.3 * math.log10(20), 50: 0.3 * math.log10(50), 100: 0.6, 1000: 0.6}
    assert {K: unset.alpha_for(K) for K in expected} == pytest.approx(expected, abs=1e-15)
    assert {LinIGW(dim=3, alpha=0.45).alpha_for(K) for K in expected} == {0.45}
    rng = np.random.default_rng(4)
    arms = [f"arm{i}" for i in range(150)]
    X = np.column_stack([np.ones(3000), rng.normal(size=(3000, 2))])
    played = rng.integers(0, len(arms), 3000)
    rewards = X[:, 1] * (played % 7) + rng.normal(size=3000)
    for K in (3, 20, 150):
        pair = [LinIGW(dim=3, seed=1), LinIGW(dim=3, seed=1, alpha=unset.alpha_for(K))]
        for policy in pair:
            policy.update_batch(X, [arms[i] for i in played], rewards)
        rows = np.column_stack([np.ones(K), rng.normal(size=(K, 2))])
        mine, given = (policy.probabilities(rows, arms[:K], rng=2).probabilities for policy in pair)
        assert mine.tolist() == given.tolist(), K
    for bad in (-0.1, float("nan"), float("inf"), True, "0.3"):
        with pytest.raises(ValueError, match="alpha must be a finite number >= 0"):
            LinIGW(dim=3, alpha=bad)


@pytest.mark.parametrize("name", LINEAR)
def test_drift_is_covariance_trace_and_spectral_norm_of_A(name):
    policy = trained(name)
    view = policy.scoring_view()
    for arm in policy.arm_ids():
        A = policy.arm_statistics(arm)["A"]
        trace, norm, alarms = policy.drift(arm)
        assert trace == pytest.approx(np.trace(np.linalg.inv(A)), rel=1e-10)
        assert norm == pytest.approx(np.linalg.eigvalsh(A).max(), rel=1e-10)
        assert alarms == 0  # no change detector runs
        assert view.drift(arm) == pytest.approx((trace, norm, alarms), rel=1e-8)


@pytest.mark.parametrize("name", ["lin_ucb", "shared_lin_ts"])
def test_deciding_refactorises_only_arms_that_are_due(name, monkeypatch):
    import learner.policies._linear as linear

    calls = []
    real = linear.factorise
    monkeypatch.setattr(linear, "factorise", lambda A, b: calls.append(len(A)) or real(A, b))
    policy = build(name, refactor_every=3)
    X, arms, r, _ = labelled(policy, 30, seed=3)
    cand = rows(policy, len(ARMS), np.random.default_rng(1))
    policy.update_batch(X, arms, r)
    policy.probabilities(cand, ARMS)
    first = len(calls)
    assert first >= 1
    for _ in range(20):
        policy.probabilities(cand, ARMS)
    assert len(calls) == first  # nothing changed: no re-factorisation however often we decide
    policy.update_batch(X[:2], ["a", "a"], r[:2])  # two rows < refactor_every
    policy.probabilities(cand, ARMS)
    assert len(calls) == first
    policy.update_batch(X[:1], ["a"], r[:1])  # third row: due
    policy.probabilities(cand, ARMS)
    assert len(calls) == first + 1


def test_thompson_probability_estimates_the_chance_a_posterior_draw_wins():
    """Two disjoint arms: a draw of arm k's score is N(mu_k, v^2 s_k^2), so P(a beats b) is
    Phi((mu_a - mu_b) / v sqrt(s_a^2 + s_b^2)); the estimate from n_draws draws is within its error."""
    policy = trained("lin_ts", eps0=0.0, n_draws=20_000, v=0.8)
    x = np.array([1.0, 0.4, -0.3, 0.2])
    view = {arm: policy.scoring_arrays(arm) for arm in ("a", "b")}
    mu = {arm: x @ view[arm]["theta"] for arm in view}
    sd = {arm: 0.8 * np.linalg.norm(view[arm]["L"].T @ x) for arm in view}
    exact = 0.5 * (1 + math.erf((mu["a"] - mu["b"]) / math.sqrt(2 * (sd["a"] ** 2 + sd["b"] ** 2))))
    estimate = policy.probabilities(np.tile(x, (2, 1)), ["a", "b"], rng=1).probabilities[0]
    assert abs(estimate - exact) < 4 * 0.5 / math.sqrt(20_000)


def test_thompson_default_n_draws_estimates_within_the_documented_standard_error():
    """At the default n_draws each estimate is unbiased and its root-mean-square error against a
    large-draw reference stays within the documented 0.5 / sqrt(n_draws)."""
    cls = POLICIES["lin_ts"]
    params = {k: v for k, v in cls._unit_test_params().items() if k != "n_draws"}
    policy = cls(**{**params, "eps0": 0.0, "v": 0.8})
    policy.update_batch(*labelled(policy, 300, seed=1))  # the same state as trained() below
    bound = 0.5 / math.sqrt(policy.n_draws)
    X = np.tile([1.0, 0.4, -0.3, 0.2], (3, 1))
    reference = trained("lin_ts", eps0=0.0, v=0.8, n_draws=400_000).probabilities(X, ARMS, rng=0).probabilities
    assert (reference > 0.05).all()  # every arm has a probability worth estimating
    rng = np.random.default_rng(2)
    n = 1000
    estimates = np.array([policy.probabilities(X, ARMS, rng).probabilities for _ in range(n)])
    assert (np.abs(estimates.mean(axis=0) - reference) <= 4 * bound / math.sqrt(n)).all()
    assert (np.sqrt(((estimates - reference) ** 2).mean(axis=0)) <= bound).all()


def test_beta_ts_learns_each_segment_separately():
    policy = make_policy("beta_ts", dim=4, segment_slots=[1, 2], eps0=0.0, n_draws=400, seed=0)
    seg0, seg1, other = [1.0, 1.0, 0.0, 0.3], [1.0, 0.0, -1.0, 0.3], [1.0, 0.0, 0.0, 0.3]
    assert policy.segments(np.array([seg0, seg1, other])).tolist() == [0, 1, 2]
    X = np.array([seg0, seg0, seg1, seg1] * 40)
    policy.update_batch(X, ["x", "y", "x", "y"] * 40, [0.9, 0.1, 0.1, 0.9] * 40)
    assert policy.probabilities(np.array([seg0, seg0]), ["x", "y"]).probabilities[0] > 0.99
    assert policy.probabilities(np.array([seg1, seg1]), ["x", "y"]).probabilities[1] > 0.99
    stats = policy.arm_statistics("x")
    np.testing.assert_allclose(stats["alpha"], [1 + 40 * 0.9, 1 + 40 * 0.1, 1])
    np.testing.assert_allclose(stats["beta"], [1 + 40 * 0.1, 1 + 40 * 0.9, 1])


def test_epsilon_decays_with_the_rows_learned():
    policy = make_policy("epsilon_greedy", dim=1, eps_start=0.8, decay=0.9, eps_min=0.1)
    assert policy.epsilon() == 0.8
    policy.update_batch(np.ones((3, 1)), ["a", "b", "a"], [1.0, 0.0, 1.0])
    assert policy.epsilon() == pytest.approx(0.8 * 0.9**3)
    policy.update_batch(np.ones((100, 1)), ["a"] * 100, np.ones(100))
    assert policy.epsilon() == 0.1


# --- state -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_whole_policy_round_trips_through_bytes(name):
    policy = trained(name, gamma=0.97, arm_priors={"b": (0.4, 3.0)})
    blob = policy.to_bytes()
    for loaded in (type(policy).from_bytes(blob), Policy.from_bytes(blob)):
        assert type(loaded) is type(policy)
        assert loaded.get_params() == policy.get_params()
        assert_same_statistics(loaded, policy)
        assert decisions(loaded, 5, 30, rng=np.random.default_rng(8)) == decisions(policy, 5, 30, rng=np.random.default_rng(8))
        assert loaded.to_bytes() == blob


@pytest.mark.parametrize("name", NAMES)
def test_each_arm_round_trips_through_its_own_blob(name):
    policy = trained(name)
    restored = build(name)
    for arm in policy.arm_ids():
        restored.load_arm_state(arm, policy.arm_state_bytes(arm))
    assert_same_statistics(restored, policy)
    assert decisions(restored, 5, 30, rng=np.random.default_rng(8)) == decisions(policy, 5, 30, rng=np.random.default_rng(8))


@pytest.mark.parametrize("name", NAMES)
def test_many_arms_encode_in_one_pass_to_each_arms_own_blob(name):
    """``arm_states_bytes`` (the learner's write of a block's arms) is each arm's blob as the
    frame encoder writes it from that arm's arrays alone, in the order asked, in both views;
    an id JSON must escape is set into the header as any other."""
    from learner.policies.base import _encode

    policy = trained(name)
    if not policy.shared:
        policy.update_batch(np.ones((2, policy.dim)), ['q"\\é', "z"], [1.0, 0.0])
    for view in (policy, policy.scoring_view()):
        arms = view.arm_ids()[::-1]
        blobs = view.arm_states_bytes(arms)
        assert len(blobs) == len(arms) and len(set(blobs)) == len(arms)
        for arm, blob in zip(arms, blobs):
            header = {"policy": view.name, "kind": "arm", "view": view._view(), "dim": view.dim, "arm": arm}
            if name == "portfolio":  # every member's arrays, prefixed m<i>.
                header["members"] = view.labels
                parts = [(f"m{m}.", member, member._existing_slot(arm)) for m, member in view._learners()]
            else:
                parts = [("", view, view._existing_slot(arm))]
            arrays = {prefix + key: value[0] for prefix, of, slot in parts for key, value in of._view_arrays(np.array([slot])).items()}
            assert blob == _encode(header, arrays) == view.arm_state_bytes(arm)


@pytest.mark.parametrize("name", NAMES)
def test_scoring_view_decides_like_the_policy_and_refuses_to_learn(name):
    policy = trained(name)
    expected = decisions(policy, 5, 40, rng=np.random.default_rng(8))
    view = policy.scoring_view()
    from_arrays = type(policy).from_scoring(
        policy.get_params(),
        {arm: {**policy.scoring_arrays(arm), "count": policy.update_count(arm)} for arm in policy.arm_ids()},
    )
    for scorer in (view, Policy.from_bytes(view.to_bytes()), from_arrays):
        assert scorer.scoring_only
        got = decisions(scorer, 5, 40, rng=np.random.default_rng(8))
        assert [c for c, _ in got] == [c for c, _ in expected]
        np.testing.assert_allclose([p for _, p in got], [p for _, p in expected], rtol=0, atol=1e-12)
        X, arms, r, _ = labelled(policy, 3, seed=0)
        with pytest.raises(ScoringOnlyError):
            scorer.update_batch(X, arms, r)
    arm = policy.arm_ids()[0]
    restored = type(policy).from_bytes(view.to_bytes())
    restored.load_arm_state(arm, view.arm_state_bytes(arm))  # per-arm scoring blobs too
    with pytest.raises(StateFormatError):
        build(name).load_arm_state(arm, view.arm_state_bytes(arm))  # a view is not learning state


def _reframe(blob: bytes, major: int) -> bytes:
    """The same blob claiming another format major version, with a valid checksum."""
    body = bytearray(blob[:-4])
    body[4] = major
    return bytes(body) + struct.pack("<I", zlib.crc32(bytes(body)))


@pytest.mark.parametrize("name", NAMES)
def test_foreign_or_corrupt_state_raises_state_format_error(name):
    policy = trained(name)
    arm = policy.arm_ids()[0]
    blob, arm_blob = policy.to_bytes(), policy.arm_state_bytes(arm)
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 0x40
    other_name = "softmax" if name != "softmax" else "ucb1"
    other = trained(other_name)
    bad_blobs = [
        b"",
        b"not a policy at all",
        b"\x00" * 64,
        bytes(flipped),
        blob[:-9],
        b"XXXX" + blob[4:],
        _reframe(blob, 2),
        other.to_bytes(),
    ]
    for bad in bad_blobs:
        with pytest.raises(StateFormatError):
            type(policy).from_bytes(bad)
    with pytest.raises(StateFormatError):
        Policy.from_bytes(bytes(flipped))
    fresh = build(name)
    for bad in [
        blob,  # a whole policy is not one arm
        arm_blob[:-1],
        _reframe(arm_blob, 0),
        other.arm_state_bytes(other.arm_ids()[0]),
        trained(name, dim=6).arm_state_bytes(arm),  # another dimension
    ]:
        with pytest.raises(StateFormatError):
            fresh.load_arm_state(arm, bad)
    if not policy.shared:
        with pytest.raises(StateFormatError):
            fresh.load_arm_state("somebody-else", arm_blob)


def test_non_positive_definite_precision_is_refused_on_load():
    policy = trained("lin_ucb")
    stats = policy.arm_statistics("a")
    broken = build("lin_ucb")
    broken.load_arm_state("a", policy.arm_state_bytes("a"))
    from learner.policies import base

    header = {"policy": "lin_ucb", "kind": "arm", "view": "full", "dim": policy.dim, "arm": "a"}
    arrays = {"A": -stats["A"][np.triu_indices(policy.dim)], "b": stats["b"], "count": np.array(3)}
    with pytest.raises(StateFormatError, match="positive definite"):
        broken.load_arm_state("a", base._encode(header, arrays))


# --- boundaries ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_inputs_are_validated_at_the_boundary(name):
    policy = build(name)
    X = rows(policy, 3, np.random.default_rng(0))
    with pytest.raises(ValueError, match=rf"expects \(n, {policy.dim}\)"):
        policy.probabilities(X[:, :-1], ARMS)
    with pytest.raises(ValueError, match="3 rows"):
        policy.update_batch(X, ARMS[:2], [1.0, 0.0])
    with pytest.raises(ValueError, match="finite"):
        policy.update_batch(X, ARMS, [1.0, np.nan, 0.0])
    with pytest.raises(ValueError, match=">= 0"):
        policy.update_batch(X, ARMS, [1.0, 1.0, 0.0], [1.0, -1.0, 1.0])
    if not policy.shared:
        with pytest.raises(ValueError, match="distinct"):
            policy.probabilities(X, ["a", "b", "a"])
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("no_such_policy", dim=3)


def test_int_arm_ids_are_aliases_of_their_decimal_strings():
    policy = make_policy("lin_ucb", dim=2, seed=0)
    X = np.array([[1.0, 0.5], [1.0, -0.5], [1.0, 0.1]])
    assert policy.update_batch(X, np.array([3, 7, 3]), [1.0, 0.0, 0.5]) == ["3", "7"]
    assert policy.arm_ids() == ["3", "7"]
    assert policy.update_count(3) == policy.update_count("3") == 2
    assert policy.arm_state_bytes(np.int64(7)) == policy.arm_state_bytes("7")
    policy.probabilities(X[:2], ["3", 7])
    assert policy.arm_ids() == ["3", "7"]


# --- learning in a simulated environment -----------------------------------------------------------

SIM_ARMS, SIM_DIM, SIM_STEPS, SIM_BATCH = 5, 8, 20_000, 50
SIM_PARAMS = {
    "lin_ucb": {"alpha": 0.3},
    "lin_ts": {"v": 0.2},
    "shared_lin_ucb": {"alpha": 0.3},
    "shared_lin_ts": {"v": 0.2},
    "softmax": {"temperature": 0.05},
}


@pytest.fixture(scope="module")
def environment():
    """5 arms, x = (1, z), z ~ N(0, I_7): mu_k(x) = bias_k + x . beta_k, noise sd 0.1.

    The biases make a clear best arm on average (what context-free policies can find); the
    context terms (sd about 0.26) make the best arm change with x (what linear policies exploit).
    """
    rng = np.random.default_rng(2024)
    theta = np.column_stack([[0.2, 0.35, 0.5, 0.65, 0.8], rng.normal(scale=0.1, size=(SIM_ARMS, SIM_DIM - 1))])
    contexts = np.column_stack([np.ones(SIM_STEPS), rng.normal(size=(SIM_STEPS, SIM_DIM - 1))])
    means = contexts @ theta.T
    return contexts, means, rng.normal(scale=0.1, size=(SIM_STEPS, SIM_ARMS))


@pytest.mark.parametrize("name", NAMES)
def test_every_policy_beats_uniform_random_in_a_linear_environment(name, environment):
    contexts, means, noise = environment
    cls = POLICIES[name]
    # Shared models see the arm through its rows: block k of row k holds x (one-hot arm x context).
    dim = SIM_ARMS * SIM_DIM if cls.shared else SIM_DIM
    policy = cls(**{**cls._unit_test_params(), "eps0": 0.05, "dim": dim, **SIM_PARAMS.get(name, {})})
    arms = [f"arm{k}" for k in range(SIM_ARMS)]
    blocks = np.eye(SIM_ARMS)
    rng = np.random.default_rng(0)
    regret = 0.0
    for start in range(0, SIM_STEPS, SIM_BATCH):
        acted, chosen = [], []
        for t in range(start, start + SIM_BATCH):
            X = np.kron(blocks, contexts[t]) if cls.shared else np.broadcast_to(contexts[t], (SIM_ARMS, SIM_DIM))
            k = policy.probabilities(X, arms, rng).chosen
            acted.append(X[k])
            chosen.append(k)
        idx = np.arange(start, start + SIM_BATCH)
        chosen = np.array(chosen)
        policy.update_batch(np.array(acted), [arms[k] for k in chosen], means[idx, chosen] + noise[idx, chosen])
        regret += float((means[idx].max(axis=1) - means[idx, chosen]).sum())
    uniform = float((means.max(axis=1) - means.mean(axis=1)).sum())
    best_fixed = float((means.max(axis=1) - means[:, means.mean(axis=0).argmax()]).sum())
    assert regret < 0.35 * uniform, (regret, uniform)
    if name in LINEAR:  # contextual: better than any single arm could ever be
        assert regret < 0.5 * best_fixed, (regret, best_fixed)


# --- documentation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "module",
    ["learner.policies", "learner.policies.base", "learner.linalg"]
    + sorted({POLICIES[name].__module__ for name in NAMES}),
)
def test_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


def test_thompson_acts_as_thompson_sampling_whatever_n_draws():
    """The estimate is unbiased and the choice is drawn from it, so even with two draws per
    decision each arm is chosen as often as a single posterior draw would choose it."""
    exact = trained("lin_ts", eps0=0.0, n_draws=50_000, v=0.8)
    coarse = trained("lin_ts", eps0=0.0, n_draws=2, v=0.8)
    X = np.tile([1.0, 0.4, -0.3, 0.2], (3, 1))
    p = exact.probabilities(X, ARMS, rng=0).probabilities
    rng = np.random.default_rng(1)
    n = 8000
    freq = np.bincount([coarse.probabilities(X, ARMS, rng).chosen for _ in range(n)], minlength=3) / n
    assert (np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / n) + 0.005).all(), (freq, p)
