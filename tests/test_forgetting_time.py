"""Forgetting by event time (``half_life_s``): evidence halves every half-life of the domain's
own time, for every arm alike, played or not; a snapshot brings the arms nobody played to the
newest time, the learner's state waits for their next row.

Batch-equals-sequential for every policy with a half-life is in ``test_policies``; here the
arithmetic by hand, the arm nobody plays, the state format, the portfolio and the learner's
path from an UpdateEvent's ``decision_time``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from learner.domain import DomainSettings
from learner.policies import POLICIES, Policy, StateFormatError, make_policy
from learner.policies.base import NEVER
from learner.store import ArmKey, PosteriorStore
from streams._learn_shard import DomainModel, ShardLearner, Update

HOUR_MS = 3_600_000


def intercept_rows(n: int) -> np.ndarray:
    return np.ones((n, 1))


def test_a_half_life_halves_an_arms_evidence_toward_its_prior_checked_by_hand():
    policy = make_policy("lin_ucb", dim=1, half_life_s=3600.0, prior_strength=2.0, prior_mean=0.5, eps0=0.0)
    policy.update_batch(intercept_rows(4), ["a"] * 4, [1.0, 1.0, 0.0, 1.0], times=[0, 0, 0, 0])
    stats = policy.arm_statistics("a")
    np.testing.assert_allclose(stats["A"], [[2.0 + 4.0]])  # A0 = 2, four rows
    np.testing.assert_allclose(stats["b"], [2.0 * 0.5 + 3.0])
    assert policy.age(HOUR_MS) == ["a"]  # one half-life later: S0 + (S - S0) / 2
    stats = policy.arm_statistics("a")
    np.testing.assert_allclose(stats["A"], [[2.0 + 4.0 / 2]], rtol=1e-15)
    np.testing.assert_allclose(stats["b"], [1.0 + 3.0 / 2], rtol=1e-15)
    assert policy.clock == HOUR_MS
    # a row two half-lives old, learned now, weighs a quarter; the arm's clock does not go back
    policy.update_batch(intercept_rows(1), ["a"], [1.0], times=[-HOUR_MS])
    np.testing.assert_allclose(policy.arm_statistics("a")["A"], [[2.0 + 2.0 + 0.25]], rtol=1e-15)
    assert policy.clock == HOUR_MS
    assert policy.update_count("a") == 5  # forgetting never lowers the count


def test_an_arm_nobody_plays_relaxes_to_its_prior_in_the_snapshot_and_is_explored_again():
    """Arm b earned 0 early on; the world moved on without it. Counted in b's own updates
    (``gamma``), b would keep those 100 zeros forever and LinUCB would never try it again; by
    event time, a snapshot eight half-lives later scores b nearly at its prior, whose optimism
    beats a's known 0.5, while the learner's own state of b is untouched."""
    by_time = make_policy("lin_ucb", dim=1, alpha=1.0, eps0=0.0, half_life_s=300.0)
    by_count = make_policy("lin_ucb", dim=1, alpha=1.0, eps0=0.0, gamma=0.999)
    early = np.arange(100) * 1000
    late = 100_000 + np.arange(2400) * 1000  # 40 minutes of a only
    held_b = {}
    for policy in (by_time, by_count):
        policy.update_batch(intercept_rows(200), ["a"] * 100 + ["b"] * 100, [1.0] * 100 + [0.0] * 100,
                            times=np.r_[early, early])  # fmt: skip
        held_b[policy.name, policy.half_life_s] = policy.arm_statistics("b")["A"]
        policy.update_batch(intercept_rows(2400), ["a"] * 2400, np.full(2400, 0.5), times=late)
    snapshot = by_time.scoring_view()
    context = intercept_rows(2)
    assert snapshot.probabilities(context, ["a", "b"], 0).probabilities.tolist() == [0.0, 1.0]
    assert by_count.scoring_view().probabilities(context, ["a", "b"], 0).probabilities.tolist() == [1.0, 0.0]
    # the learner's state still holds b as it left it (one writer: b's); the snapshot aged a copy
    for policy in (by_time, by_count):
        np.testing.assert_array_equal(policy.arm_statistics("b")["A"], held_b[policy.name, policy.half_life_s])
    loaded = Policy.from_bytes(snapshot.to_bytes())
    assert loaded.to_bytes() == snapshot.to_bytes()


def test_a_policy_forgetting_by_time_needs_whole_millisecond_times():
    policy = make_policy("lin_igw", dim=2, half_life_s=60.0)
    X = np.ones((2, 2))
    with pytest.raises(ValueError, match="needs the rows' times"):
        policy.update_batch(X, ["a", "b"], [1.0, 0.0])
    with pytest.raises(ValueError, match="times has shape"):
        policy.update_batch(X, ["a", "b"], [1.0, 0.0], times=[1])
    with pytest.raises(ValueError, match="whole epoch milliseconds"):
        policy.update_batch(X, ["a", "b"], [1.0, 0.0], times=[1.5, 2.0])
    assert policy.arm_ids() == []  # refused before anything was learned
    for bad in (0, -1.0, float("inf"), True, "60"):
        with pytest.raises(ValueError, match="half_life_s"):
            make_policy("lin_igw", dim=2, half_life_s=bad)
    steady = make_policy("lin_igw", dim=2)
    steady.update_batch(X, ["a", "b"], [1.0, 0.0], times=[1.5, 2.0])  # no half-life: times are not read
    assert steady.clock is None and steady.age(10**12) == []


def test_the_clock_travels_with_the_state_and_older_blobs_load_with_no_clock():
    policy = make_policy("lin_ts", dim=3, half_life_s=30.0, seed=1)
    rng = np.random.default_rng(0)
    policy.update_batch(rng.normal(size=(6, 3)), list("abcabc"), rng.random(6), times=[5, 9, 7, 1_000, 8, 2])
    blob = policy.to_bytes()
    assert blob[5] == 2  # state format minor 2
    loaded = Policy.from_bytes(blob)
    assert loaded.to_bytes() == blob and loaded.clock == 1_000
    fresh = make_policy("lin_ts", dim=3, half_life_s=30.0, seed=1)
    fresh.load_arm_state("a", policy.arm_state_bytes("a"))
    assert fresh.clock == 1_000  # arm a's own clock
    old = make_policy("lin_ts", dim=3, seed=1)  # written before the domain forgot by time
    old.update_batch(np.ones((1, 3)), ["a"], [1.0])
    fresh.load_arm_state("a", old.arm_state_bytes("a"))
    assert fresh.clock is None  # its clock starts with its next timed row
    fresh.update_batch(np.ones((1, 3)), ["a"], [1.0], times=[50])
    assert fresh.clock == 50
    with pytest.raises(StateFormatError, match="clock"):
        old.load_arm_state("a", policy.arm_state_bytes("a"))  # a reader without half_life_s refuses a clock


def test_a_portfolio_passes_times_to_members_that_forget_by_time():
    portfolio = make_policy("portfolio", dim=2, seed=0, members=[{"policy": "lin_igw"}, {"policy": "lin_ucb", "half_life_s": 60.0}])
    X = np.ones((2, 2))
    with pytest.raises(ValueError, match="needs the rows' times"):
        portfolio.update_batch(X, ["a", "b"], [1.0, 0.0])
    assert portfolio.arm_ids() == []
    portfolio.update_batch(X, ["a", "b"], [1.0, 0.0], times=[0, 60_000])
    assert portfolio.clock == 60_000 and portfolio.members[0].clock is None
    assert portfolio.age() == ["a"]  # the forgetting member's arm a, a minute behind
    aged = portfolio.members[1].arm_statistics("a")["A"]
    np.testing.assert_allclose(aged, np.eye(2) + 0.5 * np.ones((2, 2)), rtol=1e-15)
    assert Policy.from_bytes(portfolio.to_bytes()).to_bytes() == portfolio.to_bytes()


def test_the_learner_forgets_by_the_decisions_event_time(tmp_path: Path):
    """A shard folds UpdateEvents with their ``decision_time``: the stored arm is what a policy
    fed the same rows and times holds, bit for bit, whatever the machine's clock says."""
    settings = DomainSettings.model_validate({"policy": "lin_ucb", "params": {"half_life_s": 120.0}})
    domains = {"route": DomainModel.of(settings)}
    rng = np.random.default_rng(3)
    dim = settings.features.dimension
    X = rng.normal(size=(40, dim))
    arms = [f"m{i % 3}" for i in range(40)]
    rewards = rng.random(40)
    times = 1_700_000_000_000 + np.sort(rng.integers(0, 600_000, 40))
    updates = [Update(i, f"e{i}", ArmKey("default", "main", "route", arms[i]), X[i].tolist(), float(rewards[i]), 1.0, "live",
                      int(times[i])) for i in range(40)]  # fmt: skip
    with PosteriorStore(tmp_path) as store:
        shard = ShardLearner(0, "u", domains, store.shard(0), block_size=8, window_blocks=4, start=0)
        shard.load_stored()
        for update in updates:
            shard.feed(update.offset, update)
        published = {m.key.arm: m.state.state for m in shard.snapshot(shard.keys())}
    expected = settings.make_policy()
    for lo in range(0, 40, 8):  # the shard's blocks of 8
        expected.update_batch(X[lo : lo + 8], arms[lo : lo + 8], rewards[lo : lo + 8], times=times[lo : lo + 8])
    for arm in sorted(set(arms)):
        assert published[arm] == expected.arm_state_bytes(arm)
    assert expected.clock == int(times[-1]) and expected.clock != NEVER


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_forgetting_by_time_round_trips_its_state_and_snapshot(name):
    cls = POLICIES[name]
    policy = cls(**{**cls._unit_test_params(), "half_life_s": 45.0})
    rng = np.random.default_rng(7)
    X = np.column_stack([np.ones(60), rng.normal(size=(60, policy.dim - 1))])
    arms = list(rng.choice(["a", "b", "c"], 60))
    policy.update_batch(X, arms, rng.random(60), times=np.sort(rng.integers(0, 300_000, 60)))
    blob = policy.to_bytes()
    assert Policy.from_bytes(blob).to_bytes() == blob
    restored = cls(**{**cls._unit_test_params(), "half_life_s": 45.0})
    for arm in policy.arm_ids():
        restored.load_arm_state(arm, policy.arm_state_bytes(arm))
    assert restored.to_bytes() == blob
    view = policy.scoring_view()
    assert Policy.from_bytes(view.to_bytes()).to_bytes() == view.to_bytes()
    assert policy.to_bytes() == blob  # the snapshot aged a copy
