"""The residual change detector of the per-arm linear policies (learner/policies/_detect.py):
it flags an arm whose rewards change, soon, and not a stationary one; it discounts what it flags
toward the prior as documented; its state travels with the arm's, bit for bit; states written
before it still load; the compiled detector (learner._fastscore.detect) and the numpy one give
the same bits."""

from __future__ import annotations

import numpy as np
import pytest

from learner.policies import Policy, StateFormatError, _detect, make_policy
from learner.policies._detect import CALIBRATION
from learner.policies.base import _decode, _encode

DETECTING = ["lin_igw", "lin_ts", "lin_ucb"]
DIM = 4


def world(n: int, seed: int, arms=("a", "b", "c"), change_at: int | None = None, changed: str = "a"):
    """Rows (1, z), arms drawn uniformly, rewards x . theta_arm + N(0, 0.5^2); from row
    ``change_at`` on, arm ``changed`` pays with new coefficients."""
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n), rng.normal(size=(n, DIM - 1))])
    chosen = rng.choice(list(arms), size=n)
    theta = {arm: rng.normal(0.0, 0.5, size=DIM) for arm in arms}
    after = rng.normal(0.0, 0.5, size=DIM) + np.r_[2.0, np.zeros(DIM - 1)]  # a clear change
    r = np.array([X[i] @ theta[a] for i, a in enumerate(chosen)]) + rng.normal(0.0, 0.5, size=n)
    if change_at is not None:
        late = (np.arange(n) >= change_at) & (chosen == changed)
        r[late] = X[late] @ after + rng.normal(0.0, 0.5, size=int(late.sum()))
    return X, list(chosen), r


def feed(policy: Policy, X, arms, r, batch: int, on_batch=None) -> None:
    for lo in range(0, len(r), batch):
        policy.update_batch(X[lo : lo + batch], arms[lo : lo + batch], r[lo : lo + batch])
        if on_batch is not None:
            on_batch(lo + batch)


def alarms(policy: Policy) -> dict[str, int]:
    return {arm: policy.drift(arm).alarms for arm in policy.arm_ids()}


@pytest.mark.parametrize("batch", [1, 20])
@pytest.mark.parametrize("name", DETECTING)
def test_an_abrupt_change_of_one_arms_reward_is_flagged_within_a_few_dozen_of_its_rows(name, batch):
    policy = make_policy(name, dim=DIM, detect=True, seed=0)
    change_at = 3000
    X, arms, r = world(4000, seed=1, change_at=change_at)
    flagged_at = []

    def watch(rows: int) -> None:
        if alarms(policy)["a"] and not flagged_at:
            flagged_at.append(rows)

    feed(policy, X, arms, r, batch, watch)
    assert flagged_at, "the change was never flagged"
    rows_of_a_after = sum(1 for i in range(change_at, flagged_at[0]) if arms[i] == "a")
    assert 0 < rows_of_a_after <= 30 + batch  # 16 rows for this shift (3-4 sds), plus up to a batch
    assert alarms(policy)["b"] == alarms(policy)["c"] == 0


@pytest.mark.parametrize("name", DETECTING)
def test_long_stationary_streams_raise_almost_no_false_alarms(name):
    """90,000 stationary rows over three seeds and three arms (30,000 per arm): at most one
    false alarm at the default threshold (Gaussian theory: one in 1.5e9 rows), and at a
    threshold of 10 a handful (theory: one in 70,000 rows; residual mean and scale estimated
    from the arm's own rows raise that a little)."""
    for threshold, most in ((20.0, 1), (10.0, 4)):
        false_alarms = 0
        for seed in range(3):
            policy = make_policy(name, dim=DIM, detect_threshold=threshold, seed=seed)
            feed(policy, *world(30_000, seed=10 + seed), batch=50)
            false_alarms += sum(alarms(policy).values())
        assert false_alarms <= most, threshold


@pytest.mark.parametrize("name", DETECTING)
def test_the_detector_changes_nothing_until_it_flags(name):
    X, arms, r = world(2000, seed=3)
    plain, watched = make_policy(name, dim=DIM, detect=False, seed=0), make_policy(name, dim=DIM, detect=True, seed=0)
    feed(plain, X, arms, r, batch=25)
    feed(watched, X, arms, r, batch=25)
    assert sum(alarms(watched).values()) == 0
    for arm in plain.arm_ids():
        for stat, value in plain.arm_statistics(arm).items():
            assert watched.arm_statistics(arm)[stat].tobytes() == value.tobytes()
    cands = X[:3]
    for seed in range(5):
        got, want = watched.probabilities(cands, ["a", "b", "c"], rng=seed), plain.probabilities(cands, ["a", "b", "c"], rng=seed)
        assert got.chosen == want.chosen and got.probabilities.tobytes() == want.probabilities.tobytes()


@pytest.mark.parametrize("keep", [0.0, 0.25, 1.0])  # 1: alarms are counted, nothing is forgotten
def test_a_flagged_arm_is_discounted_toward_its_prior_before_the_batch_is_added(keep):
    strength, mean = 2.0, 0.3
    # robust learning off: the batch then adds X'X and X'r unweighted, as written below
    policy = make_policy("lin_ucb", dim=DIM, detect=True, detect_keep=keep, prior_strength=strength, prior_mean=mean, huber_q=0)
    policy.add_arm("a")
    X, arms, r = world(3000, seed=4, arms=("a",), change_at=2000)
    batch = 10
    for lo in range(0, len(r), batch):
        before = policy.arm_statistics("a")
        Xb, rb = X[lo : lo + batch], r[lo : lo + batch]
        policy.update_batch(Xb, arms[lo : lo + batch], rb)
        if alarms(policy)["a"]:
            break
    else:
        pytest.fail("never flagged")
    A0, b0 = strength * np.eye(DIM), strength * mean * np.eye(DIM)[0]
    after = policy.arm_statistics("a")
    np.testing.assert_allclose(after["A"], A0 + keep * (before["A"] - A0) + Xb.T @ Xb, rtol=1e-12)
    np.testing.assert_allclose(after["b"], b0 + keep * (before["b"] - b0) + Xb.T @ rb, rtol=1e-12, atol=1e-12)
    assert policy.update_count("a") == lo + batch  # forgetting never lowers the count


@pytest.mark.parametrize("name", DETECTING)
def test_a_learner_reloaded_from_its_bytes_anywhere_continues_bit_for_bit(name):
    X, arms, r = world(6000, seed=5, change_at=2500, changed="b")
    rng = np.random.default_rng(6)
    batches = []
    lo = 0
    while lo < len(r):
        k = int(rng.choice([1, 3, 40, 200]))
        batches.append((X[lo : lo + k], arms[lo : lo + k], r[lo : lo + k]))
        lo += k
    restarts = set(rng.choice(len(batches), size=25, replace=False).tolist())
    uninterrupted = make_policy(name, dim=DIM, detect=True, seed=1)
    restarted = make_policy(name, dim=DIM, detect=True, seed=1)
    for i, batch in enumerate(batches):
        if i in restarts:  # only the stored bytes survive: the whole policy, or one blob per arm
            if i % 2:
                restarted = Policy.from_bytes(restarted.to_bytes())
            else:
                fresh = make_policy(name, dim=DIM, detect=True, seed=1)
                for arm in restarted.arm_ids():
                    fresh.load_arm_state(arm, restarted.arm_state_bytes(arm))
                restarted = fresh
        uninterrupted.update_batch(*batch)
        restarted.update_batch(*batch)
        assert restarted.to_bytes() == uninterrupted.to_bytes(), i
    assert alarms(uninterrupted)["b"] >= 1
    view = Policy.from_bytes(uninterrupted.scoring_view().to_bytes())  # what the SDK holds
    assert alarms(view) == alarms(uninterrupted)


@pytest.mark.parametrize("keep", [0.0, 0.5])
@pytest.mark.parametrize("name", DETECTING)
def test_the_compiled_detector_and_the_numpy_one_give_the_same_bits(name, keep, monkeypatch):
    """Seeded batches of uneven size, arms of uneven share (one arriving late, so rows before
    calibration come mid-stream), zero weights (whole arms of a batch among them) and a real
    shift, through learner._fastscore.detect and through the numpy fallback: every arm's state,
    after every batch, byte for byte."""
    assert _detect._fastscore is not None, "learner._fastscore is not built (pip install builds it)"
    arms_of = ("a", "b", "c", "d")
    X, arms, r = world(5000, seed=11, arms=arms_of, change_at=2500, changed="b")
    rng = np.random.default_rng(12)
    arms = [a if a != "d" or i >= 1500 else "c" for i, a in enumerate(arms)]  # d arrives at row 1500
    w = rng.choice([0.0, 0.3, 1.0, 2.5], size=len(r), p=[0.15, 0.15, 0.55, 0.15])
    w[[i for i, a in enumerate(arms) if a == "a" and 1000 <= i < 1100]] = 0.0  # a batch or two where a learns nothing
    batches, lo = [], 0
    while lo < len(r):
        k = int(rng.choice([1, 2, 3, 7, 10, 40, 150]))
        batches.append(slice(lo, lo + k))
        lo += k

    def run(compiled: bool) -> list[dict[str, bytes]]:
        calls = []
        real = _detect._fastscore

        class Spy:  # the compiled module, counting its detector's calls
            @staticmethod
            def detect(*args):
                calls.append(1)
                return real.detect(*args)

        monkeypatch.setattr(_detect, "_fastscore", Spy if compiled else None)
        policy = make_policy(name, dim=DIM, detect=True, detect_keep=keep, detect_threshold=12.0, seed=1)
        states = []
        for b in batches:
            policy.update_batch(X[b], arms[b], r[b], w[b])
            states.append({arm: policy.arm_state_bytes(arm) for arm in policy.arm_ids()})
        monkeypatch.undo()
        assert alarms(policy)["b"] >= 1 and alarms(policy)["a"] == 0
        assert len(calls) == (len(batches) if compiled else 0)
        return states

    compiled, fallback = run(True), run(False)
    for i, (got, want) in enumerate(zip(compiled, fallback)):
        assert got == want, f"batch {i}"


@pytest.mark.parametrize("name", DETECTING)
def test_a_state_written_before_the_detector_loads_with_the_detector_fresh(name):
    X, arms, r = world(500, seed=7)
    old = make_policy(name, dim=DIM, detect=False, seed=0)  # the layout of states from before the detector
    feed(old, X, arms, r, batch=50)
    assert not any(n.startswith("detect") for n in _decode(old.to_bytes())[1])
    watched = make_policy(name, dim=DIM, detect=True, seed=0)
    for arm in old.arm_ids():
        watched.load_arm_state(arm, old.arm_state_bytes(arm))
    arrays = _decode(watched.arm_state_bytes("a"))[1]
    assert arrays["detect_rows"] == 0 and arrays["detect_alarms"] == 0 and not arrays["detect_stats"].any()
    assert {k: v.tobytes() for k, v in watched.arm_statistics("a").items()} == {
        k: v.tobytes() for k, v in old.arm_statistics("a").items()
    }
    view = type(watched).from_scoring(watched.get_params(), {arm: old.scoring_arrays(arm) for arm in old.arm_ids()})
    assert alarms(view) == {"a": 0, "b": 0, "c": 0}
    watched.update_batch(X[:50], arms[:50], r[:50])  # and it learns on, watching from here
    assert _decode(watched.arm_state_bytes("a"))[1]["detect_rows"] > 0


def test_a_state_with_only_part_of_the_detector_is_refused():
    policy = make_policy("lin_ucb", dim=DIM, detect=True)
    policy.update_batch(*world(100, seed=8))
    blob = policy.to_bytes()
    header, arrays = _decode(blob)
    del arrays["detect_ph"]
    header.pop("arrays")
    with pytest.raises(StateFormatError, match="all or none"):
        Policy.from_bytes(_encode(header, arrays))


def test_a_state_with_a_negative_detector_count_is_refused():
    policy = make_policy("lin_ucb", dim=DIM)
    policy.update_batch(*world(100, seed=8))
    header, arrays = _decode(policy.arm_state_bytes("a"))
    arrays["detect_rows"] = np.array(-1)
    header.pop("arrays")
    with pytest.raises(StateFormatError, match="detect_rows"):
        make_policy("lin_ucb", dim=DIM).load_arm_state("a", _encode(header, arrays))


@pytest.mark.parametrize("compiled", [True, False])
def test_the_residual_baseline_holds_while_the_statistic_is_half_way_to_an_alarm(compiled, monkeypatch):
    """A shift under test must not become the baseline it is tested against: once g+ or g-
    passes HOLD x threshold, the arm's residual mean and scale stay as they were (its rows still
    count) until the statistic falls back or alarms."""
    if not compiled:
        monkeypatch.setattr(_detect, "_fastscore", None)
    policy = make_policy("lin_ucb", dim=DIM, detect=True, huber_q=0, seed=0)
    X, arms, r = world(600, seed=13, arms=("a",))
    feed(policy, X, arms, r, batch=1)
    assert alarms(policy) == {"a": 0}

    def detector() -> dict[str, np.ndarray]:
        arrays = _decode(policy.arm_state_bytes("a"))[1]
        return {name: arrays[name].copy() for name in ("detect_stats", "detect_ph", "detect_rows")}

    hold = _detect.HOLD * policy.detect_threshold
    x = X[:1]
    held = moved = 0
    for _ in range(40):  # each row 1.5 above the model: g+ climbs toward the threshold
        before = detector()
        policy.update_batch(x, ["a"], _means(policy, x) + 1.5)
        after = detector()
        if alarms(policy)["a"]:
            break
        assert after["detect_rows"] == before["detect_rows"] + 1
        if after["detect_ph"].max() > hold:
            assert after["detect_stats"].tobytes() == before["detect_stats"].tobytes()
            held += 1
        else:
            assert after["detect_stats"].tobytes() != before["detect_stats"].tobytes()
            moved += 1
    assert alarms(policy)["a"] == 1 and held >= 3 and moved >= 3, (held, moved)


def _means(policy: Policy, x: np.ndarray) -> np.ndarray:
    """The arm's posterior mean prediction for rows ``x``."""
    stats = policy.arm_statistics("a")
    return x @ np.linalg.solve(stats["A"], stats["b"])


def test_detection_is_watched_only_after_the_model_and_the_scale_have_settled():
    policy = make_policy("lin_ucb", dim=DIM, detect=True)
    X, arms, r = world(DIM + CALIBRATION, seed=9, arms=("a",))
    r[DIM:] += 100.0  # wild, but before the scale is set: nothing to compare with yet
    feed(policy, X, arms, r, batch=1)
    assert alarms(policy) == {"a": 0}


@pytest.mark.parametrize(
    ("params", "field"),
    [({"detect": "yes"}, "detect"), ({"detect_threshold": 0.0}, "detect_threshold"),
     ({"detect_threshold": float("inf")}, "detect_threshold"), ({"detect_keep": 1.5}, "detect_keep")],
)  # fmt: skip
def test_detector_parameters_are_validated_naming_the_field(params, field):
    with pytest.raises(ValueError, match=f"^{field} must"):
        make_policy("lin_igw", dim=DIM, **params)


def test_the_shared_models_take_no_detector():
    with pytest.raises(TypeError):
        make_policy("shared_lin_ucb", dim=DIM, detect=True)
