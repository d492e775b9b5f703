"""Robust learning of the per-arm linear policies (learner/policies/_robust.py): an outlier's
row weighs ``s / |e|`` exactly; heavy-tailed noise moves the estimate far less than it moves a
plain ridge regression, Gaussian noise about as little; the scale tracks its quantile; it
starts over where the detector flags an arm; it travels with the arm's state bit for bit, and
a state written without it still loads."""

from __future__ import annotations

import numpy as np
import pytest

from learner.domain import DomainSettings
from learner.policies import Policy, make_policy
from learner.policies.base import _decode, _encode
from learner.policies._robust import WARM

ROBUST = ["lin_igw", "lin_ts", "lin_ucb"]
Q = 0.98  # the setting measured, and the default
DIM = 4
TRUTH = np.array([0.5, 1.0, -0.5, 0.25])


def stream(n: int, seed: int, noise: str):
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n), rng.normal(size=(n, DIM - 1))])
    e = rng.standard_t(2, size=n) if noise == "t2" else rng.normal(size=n)
    return X, X @ TRUTH + e


def learn(policy, X, r, batch: int = 50):
    for lo in range(0, len(r), batch):
        policy.update_batch(X[lo : lo + batch], ["a"] * len(r[lo : lo + batch]), r[lo : lo + batch])
    return policy


def errors(policy, X, r, batch: int = 50) -> list[float]:
    """The estimate's distance from the truth after each batch it learns."""
    out = []
    for lo in range(0, len(r), batch):
        learn(policy, X[lo : lo + batch], r[lo : lo + batch], batch)
        out.append(float(np.linalg.norm(policy.posterior_mean("a") - TRUTH)))
    return out


def scale(policy, side: int = 1) -> float:
    """Arm a's scale of the residuals above its model (side 1) or below it (side 0)."""
    return float(policy._arrays["robust_scale"][policy._slot["a"], side])


def rows(policy) -> int:
    return int(policy._arrays["robust_rows"][policy._slot["a"]])


@pytest.mark.parametrize("name", ROBUST)
def test_an_outlier_row_weighs_the_scale_over_its_residual(name):
    policy = learn(make_policy(name, dim=DIM, seed=0, huber_q=Q), *stream(200, seed=1, noise="normal"))
    s = scale(policy)
    theta = policy.posterior_mean("a")
    before = policy.arm_statistics("a")
    x = np.array([1.0, 0.3, -0.2, 0.1])
    r = x @ theta + 10.0 * s  # ten scales above the model: weight 1/10
    policy.update_batch(x[None, :], ["a"], [r])
    after = policy.arm_statistics("a")
    weight = s / abs(r - x @ theta)
    np.testing.assert_allclose(weight, 0.1, rtol=1e-9)
    np.testing.assert_allclose(after["A"], before["A"] + weight * np.outer(x, x), rtol=1e-12)
    np.testing.assert_allclose(after["b"], before["b"] + weight * r * x, rtol=1e-12)
    # a row within the scale is learned at its full weight
    before = policy.arm_statistics("a")
    theta = policy.posterior_mean("a")
    s = scale(policy)
    r = x @ theta + 0.5 * s
    policy.update_batch(x[None, :], ["a"], [r])
    np.testing.assert_allclose(policy.arm_statistics("a")["b"], before["b"] + r * x, rtol=1e-12)


def test_heavy_tailed_noise_moves_the_estimate_far_less_and_gaussian_noise_about_as_little():
    """The estimate's mean error over the run (what a policy deciding on it pays for), robust
    over plain, on sixteen seeds of Student-t noise of 2 degrees of freedom and of Gaussian
    noise. Measured: a median of 0.81 (0.46-1.08) on the first, 1.00 (0.94-1.05) on the second."""
    heavy, gaussian = [], []
    for seed in range(16):
        for noise, ratios in (("t2", heavy), ("normal", gaussian)):
            X, r = stream(2000, seed, noise)
            robust = np.mean(errors(make_policy("lin_ucb", dim=DIM, seed=0, huber_q=Q), X, r))
            plain = np.mean(errors(make_policy("lin_ucb", dim=DIM, seed=0, huber_q=0), X, r))
            ratios.append(robust / plain)
    assert np.median(heavy) < 0.9 and sum(x < 1.0 for x in heavy) >= 13, heavy
    assert np.median(gaussian) < 1.03 and max(gaussian) < 1.1, gaussian


def test_a_reward_of_two_values_is_learned_as_it_came():
    """A click one row in a hundred lies 0.99 above a model that predicts 0.01: an outlier to
    any quantile of the residuals, and the signal. An arm whose rewards took at most two values
    (0/1, success/failure) is never weighed; a third value makes it continuous."""
    for seed in range(4):
        rng = np.random.default_rng(seed)
        X = np.column_stack([np.ones(3000), rng.normal(size=(3000, DIM - 1))])
        r = (rng.random(3000) < 1.0 / (1.0 + np.exp(4.7 - 0.5 * X[:, 1]))).astype(float)
        robust = learn(make_policy("lin_ucb", dim=DIM, seed=0, huber_q=Q), X, r)
        plain = learn(make_policy("lin_ucb", dim=DIM, seed=0, huber_q=0), X, r)
        assert 0.005 < r.mean() < 0.02
        for stat, value in plain.arm_statistics("a").items():
            assert robust.arm_statistics("a")[stat].tobytes() == value.tobytes()
        assert int(robust._arrays["robust_kind"][robust._slot["a"]]) == 1
        learn(robust, X[:1], [0.5])  # a third value: from here on its outliers weigh less
        assert int(robust._arrays["robust_kind"][robust._slot["a"]]) == 2


def scales_over(policy, X, r, batch: int) -> np.ndarray:
    """Both sides' scales after each batch learned: (batches, 2)."""
    out = []
    for lo in range(0, len(r), batch):
        learn(policy, X[lo : lo + batch], r[lo : lo + batch], batch)
        out.append([scale(policy, 0), scale(policy, 1)])
    return np.array(out)


@pytest.mark.parametrize("batch", [20, 1000])
def test_the_scale_tracks_its_quantile_of_the_absolute_residuals(batch):
    """On either side, |N(0, 1)|'s 0.98 quantile, 2.326: small batches step toward it (the log
    scale jitters by about 9 % around it at ETA 0.1), a batch of 50 rows or more moves toward
    its own quantile."""
    X, r = stream(20000, seed=3, noise="normal")
    policy = make_policy("lin_ucb", dim=DIM, seed=0, huber_q=Q)
    seen = scales_over(policy, X, r, batch)
    late = np.exp(np.log(seen[len(seen) // 2 :]).mean(axis=0))  # over the second half of the run
    np.testing.assert_allclose(late, 2.326, rtol=0.06)
    assert (np.abs(np.log(seen[len(seen) // 2 :] / 2.326)) < 0.35).all()
    assert rows(policy) == 20000


def test_blocks_of_a_thousand_rows_find_the_quantile_from_a_first_block_far_from_the_model():
    """The learner folds blocks of up to 1,024 rows. An arm's first block is learned against the
    prior's mean, 0, here 2.5 below the mean reward, so about 19 residuals in 20 lie above the
    model. Its scales are its rows' quantile on both sides together: an arm set from the few
    rows below the model (before, in the demo: 0.08 against 1.4 above) weighed 20-60 % of its
    rows, and a step of at most MAX_STEP a block left it there. Each block of 50 rows or more on
    a side moves that side toward the block's own quantile."""
    X, r = stream(8000, seed=6, noise="normal")
    r = r + 2.0
    assert 20 < (r[:1000] < 0).sum() < 100
    policy = make_policy("lin_ucb", dim=DIM, seed=0, huber_q=Q)
    learn(policy, X[:1000], r[:1000], batch=1000)
    first = np.quantile(np.abs(r[:1000]), Q)  # the prior's mean is 0: the residuals are the rewards
    np.testing.assert_allclose([scale(policy, 0), scale(policy, 1)], first, rtol=1e-12)
    seen = scales_over(policy, X[1000:], r[1000:], batch=1000)
    assert (np.diff(np.log(seen[:4]), axis=0) < 0).all()  # down from the lenient start, block by block
    np.testing.assert_allclose(seen[-1], 2.326, rtol=0.15)
    # the last block weighs about 2 % of its rows on each side, as the quantile says
    before = policy.arm_statistics("a")["A"][0, 0]
    learn(policy, X[-1000:], r[-1000:], batch=1000)
    assert 1000 * 0.95 < policy.arm_statistics("a")["A"][0, 0] - before < 1000


def test_an_arm_learns_its_first_rows_unweighted():
    X, r = stream(WARM, seed=4, noise="t2")
    robust = learn(make_policy("lin_ucb", dim=DIM, seed=0, huber_q=Q), X, r, batch=1)
    plain = learn(make_policy("lin_ucb", dim=DIM, seed=0, huber_q=0), X, r, batch=1)
    for stat, value in plain.arm_statistics("a").items():
        assert robust.arm_statistics("a")[stat].tobytes() == value.tobytes()


def test_one_row_at_a_time_an_arm_warms_up_to_the_greatest_of_its_first_residuals():
    """At one update per event each batch is one row. Until its WARM-th row an arm's scales,
    both sides, are the greatest absolute residual so far: from its first row's alone, a small
    one weighed most of the arm's next rows down (many_arms at B = 1: +16 % regret)."""
    X, r = stream(WARM + 40, seed=9, noise="normal")
    r[0] = 0.01  # the prior's mean is 0: a first residual of 0.01
    policy = make_policy("lin_ucb", dim=DIM, seed=0, huber_q=Q)
    residuals = []
    for i in range(WARM):
        residuals.append(abs(r[i] - X[i] @ policy.posterior_mean("a")) if i else abs(r[0]))
        learn(policy, X[i : i + 1], r[i : i + 1], batch=1)
        np.testing.assert_allclose([scale(policy, 0), scale(policy, 1)], max(residuals), rtol=1e-9)
    assert scale(policy, 1) > 10 * residuals[0]
    before = policy.arm_statistics("a")["A"][0, 0]
    learn(policy, X[WARM:], r[WARM:], batch=1)  # from here rows are weighed: a few, not most
    assert 40 * 0.8 < policy.arm_statistics("a")["A"][0, 0] - before <= 40


def test_an_arm_the_detector_flags_starts_its_scale_over():
    X, r = stream(4000, seed=5, noise="normal")
    r[2000:] += 8.0  # a change of eight noise sds
    policy = make_policy("lin_ucb", dim=DIM, seed=0, huber_q=Q)
    for lo in range(0, len(r), 20):
        alarms = policy.drift("a").alarms if lo else 0
        policy.update_batch(X[lo : lo + 20], ["a"] * 20, r[lo : lo + 20])
        if policy.drift("a").alarms > alarms:
            assert rows(policy) == 0
            assert scale(policy, 0) == scale(policy, 1) == 0.0
            break
    else:
        pytest.fail("never flagged")


@pytest.mark.parametrize("name", ROBUST)
def test_the_scale_travels_with_the_arm_state_bit_for_bit(name):
    X, r = stream(3000, seed=6, noise="t2")
    whole = learn(make_policy(name, dim=DIM, seed=0, huber_q=Q), X, r)
    first = learn(make_policy(name, dim=DIM, seed=0, huber_q=Q), X[:1500], r[:1500])
    resumed = make_policy(name, dim=DIM, seed=0, huber_q=Q)
    resumed.load_arm_state("a", first.arm_state_bytes("a"))
    learn(resumed, X[1500:], r[1500:])
    assert resumed.arm_state_bytes("a") == whole.arm_state_bytes("a")


def test_a_state_written_without_robust_learning_loads_with_its_scale_starting_over():
    X, r = stream(500, seed=7, noise="normal")
    old = learn(make_policy("lin_ucb", dim=DIM, seed=0, huber_q=0), X, r)
    new = make_policy("lin_ucb", dim=DIM, seed=0, huber_q=Q)
    new.load_arm_state("a", old.arm_state_bytes("a"))
    assert scale(new, 0) == scale(new, 1) == 0.0
    for stat, value in old.arm_statistics("a").items():
        assert new.arm_statistics("a")[stat].tobytes() == value.tobytes()
    learn(new, X, r)  # and learns on: its first batch sets the scale
    assert scale(new, 0) > 0.0 and scale(new, 1) > 0.0


@pytest.mark.parametrize("value", [0.5, 1.0, -0.1, True, 1.5])
def test_a_bad_huber_q_is_refused_naming_the_parameter(value):
    with pytest.raises(ValueError, match="huber_q"):
        make_policy("lin_igw", dim=DIM, huber_q=value)


def test_a_domain_sets_robust_learning_for_every_linear_member_in_one_setting():
    """A default domain's ``lin_igw`` members learn robustly, its Fourier member does not
    (``FOURIER_HUBER_Q``); ``params = { huber_q = 0 }`` turns it off in each of them (``0.9``
    sets another quantile in all three); in a portfolio it goes only to the members that learn
    robustly, and a member's own value wins."""
    assert [m.huber_q for m in DomainSettings().make_policy().members] == [Q, Q, 0.0]
    fourier = {"policy": "lin_igw", "alpha": 0, "fourier": 16}
    own = make_policy("portfolio", dim=DIM, members=[{"policy": "lin_igw"}, {**fourier, "huber_q": Q}])
    assert [m.huber_q for m in own.members] == [Q, Q]
    members = [m.huber_q for m in DomainSettings.model_validate({"params": {"huber_q": 0}}).make_policy().members]
    assert members == [0.0, 0.0, 0.0]
    members = [m.huber_q for m in DomainSettings.model_validate({"params": {"huber_q": 0.9}}).make_policy().members]
    assert members == [0.9, 0.9, 0.9]
    mixed = make_policy("portfolio", dim=DIM, huber_q=0, members=[{"policy": "lin_igw"}, {"policy": "ucb1"}, {"policy": "lin_ucb", "huber_q": Q}])
    assert [getattr(m, "huber_q", None) for m in mixed.members] == [0.0, None, Q]
    assert mixed.get_params()["huber_q"] == 0
    with pytest.raises(ValueError, match=r"members\[0\] \(lin_igw\): huber_q must be 0 \(off\) or in \(0.5, 1\), got 2"):
        DomainSettings.model_validate({"params": {"huber_q": 2}})


@pytest.mark.parametrize("name", ROBUST)
def test_at_the_default_the_parameters_read_as_before_so_an_older_reader_loads_them(name):
    """The default quantile is left out of the parameters (an SDK from before robust learning
    builds the policy from them); any other value is written, and each clones."""
    default = make_policy(name, dim=DIM)
    assert "huber_q" not in default.get_params() and type(default)(**default.get_params()).huber_q == Q
    for value in (0.0, 0.9):
        other = make_policy(name, dim=DIM, huber_q=value)
        assert other.get_params()["huber_q"] == value and type(other)(**other.get_params()).huber_q == value



@pytest.mark.parametrize("name", ROBUST)
def test_a_scoring_view_leaves_the_scales_out_and_decides_as_the_policy(name):
    """A snapshot carries no scales (deciding never reads them; an SDK from before robust
    learning refuses arrays it does not know); a scoring blob that still holds them loads."""
    X, r = stream(600, seed=8, noise="t2")
    arms = ["a", "b"] * 300
    policy = make_policy(name, dim=DIM, seed=0, huber_q=Q)
    for lo in range(0, 600, 50):
        policy.update_batch(X[lo : lo + 50], arms[lo : lo + 50], r[lo : lo + 50] + np.where(np.array(arms[lo : lo + 50]) == "b", 0.3, 0))
    robust = {k: v for k, v in _decode(policy.to_bytes())[1].items() if k.startswith("robust_")}
    assert len(robust) == 4 and (robust["robust_scale"] > 0).all()
    header, arrays = _decode(policy.scoring_view().to_bytes())
    assert not [k for k in arrays if k.startswith("robust_")]
    older = _encode(header, {**arrays, **robust})  # as a scoring view was written with them
    for blob in (_encode(header, arrays), older):
        view = Policy.from_bytes(blob)
        for seed in range(3):
            got, want = view.probabilities(X[:2], ["a", "b"], rng=seed), policy.probabilities(X[:2], ["a", "b"], rng=seed)
            assert got.chosen == want.chosen and got.probabilities.tobytes() == want.probabilities.tobytes()
