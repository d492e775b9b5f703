"""The shared models' rank-one updates: exact enough, the same bits everywhere, state when in use.

``learner.linalg.rank_one_update`` (numpy) and ``learner._fastscore.rank_one`` (C) must agree
with a factorisation of the updated precision to ~1e-10 and with each other bit for bit. A
shared model that learned in place carries its factor in its state, so a model reloaded from
its bytes at any point continues bit for bit like one that never stopped, and no decision,
scoring view or save in between changes what it learns.
"""

from __future__ import annotations

import numpy as np
import pytest

from learner import _fastscore  # built by pip install; a missing build fails here
from learner.linalg import factorise, rank_one_update
from learner.policies import Policy, StateFormatError, _linear, base, make_policy
from learner.policies._linear import rank_one_rows

SHARED = ["shared_lin_ucb", "shared_lin_ts"]


@pytest.fixture
def numpy_only(monkeypatch):
    """Run as if learner._fastscore were not built."""
    for module in (base, _linear):
        monkeypatch.setattr(module, "_fastscore", None)


def stream(n: int, d: int, seed: int):
    """Rows as the learner gets them: an intercept, sparse features (exact zeros, as hashed
    contexts), rewards and weights, some of them 0."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * (rng.random((n, d)) < 0.4)
    X[:, 0] = 1.0
    w = rng.uniform(0.2, 3.0, size=n)
    w[rng.random(n) < 0.05] = 0.0
    return X, rng.normal(size=n), w


def factor_of(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    theta, LT = factorise(A[None], b[None])
    return np.vstack([theta, LT[0]])


@pytest.mark.parametrize("d", [1, 2, 3, 7, 16, 65])
def test_rank_one_updates_agree_with_refactorising_and_the_compiled_ones_give_the_same_bits(d):
    X, r, w = stream(400, d, seed=d)
    A, b = 2.0 * np.eye(d), np.zeros(d)
    b[0] = 0.6
    F_numpy = factor_of(A, b)
    F_c, A_c, b_c = F_numpy.copy(), A.copy(), b.copy()
    for x, ri, wi in zip(X, r, w):
        z, y = x * np.sqrt(wi), ri * np.sqrt(wi)
        Z = z[None]
        A += Z.T @ Z  # the learner's own product: A and b are summed as they always were
        b += Z.T @ np.array([y])
        rank_one_update(F_numpy, z, y)
        _fastscore.rank_one(F_c, np.ascontiguousarray(Z), np.array([y]), b_c)
        _fastscore.add_outer(A_c, np.ascontiguousarray(Z))
    np.testing.assert_array_equal(A_c, A)
    np.testing.assert_array_equal(b_c, b)
    A_owed = 2.0 * np.eye(d)
    Z = np.ascontiguousarray(X * np.sqrt(w)[:, None])
    for lo in range(0, len(Z), 32):  # many rows in one pass over A: the same bits
        _fastscore.add_outer(A_owed, Z[lo : lo + 32])
    np.testing.assert_array_equal(A_owed, A)
    assert F_c.tobytes() == F_numpy.tobytes()  # bit for bit, zeros' signs included
    np.testing.assert_allclose(F_numpy, factor_of(A, b), rtol=0, atol=1e-10)
    np.testing.assert_array_equal(F_numpy[1:], np.tril(F_numpy[1:]))


def test_rank_one_update_of_a_zero_weight_row_changes_nothing():
    X, r, _ = stream(20, 6, seed=1)
    F = factor_of(np.eye(6) + X.T @ X, X.T @ r)
    before = F.copy()
    rank_one_update(F, np.zeros(6), 0.0)
    _fastscore.rank_one(F, np.zeros((1, 6)), np.zeros(1), None)
    np.testing.assert_array_equal(F, before)


def test_rows_at_the_learners_magnitude_limit_keep_the_factor_finite_and_positive():
    """Features, rewards and weights just under the 1e100 the learner accepts: z z^T stays
    finite (A too), and no intermediate product of the update overflows."""
    d = 6
    A, b = np.eye(d), np.zeros(d)
    F = factor_of(A, b)
    rng = np.random.default_rng(13)
    for _ in range(5):
        x = rng.uniform(-1, 1, d) * 9e99
        z, y = x * np.sqrt(9e99), 9e99 * np.sqrt(9e99)
        F_numpy = F.copy()
        rank_one_update(F_numpy, z, y)
        _fastscore.rank_one(F, z[None], np.array([y]), None)
        assert F.tobytes() == F_numpy.tobytes()
        assert np.isfinite(F).all() and (np.diagonal(F[1:]) > 0).all()


@pytest.mark.parametrize("name", SHARED)
def test_shared_model_learning_row_by_row_agrees_with_refactorising(name):
    d = 24
    policy = make_policy(name, dim=d, prior_strength=2.0, prior_mean=0.3, seed=0)
    X, r, w = stream(600, d, seed=2)
    for i in range(len(r)):
        policy.update_batch(X[i : i + 1], ["a"], r[i : i + 1], w[i : i + 1])
    stats = policy.arm_statistics("")
    A = 2.0 * np.eye(d)
    for x, wi in zip(X, w):
        z = x[None] * np.sqrt(wi)
        A += z.T @ z
    np.testing.assert_array_equal(stats["A"], A)  # the rows owed to A summed in with the same bits
    exact = factor_of(stats["A"], stats["b"])
    view = policy.scoring_arrays("")
    np.testing.assert_allclose(view["theta"], exact[0], rtol=0, atol=1e-10)
    np.testing.assert_allclose(view["L"], exact[1:].T, rtol=0, atol=1e-10)
    ridge = np.linalg.solve(X.T @ (w[:, None] * X) + 2.0 * np.eye(d), X.T @ (w * r) + 2.0 * 0.3 * np.eye(d)[0])
    np.testing.assert_allclose(policy.posterior_mean(""), ridge, rtol=0, atol=1e-9)


def test_small_batches_learn_in_place_and_large_ones_forgetting_and_the_schedule_refactorise(monkeypatch):
    d = 16
    calls = []
    real = _linear.factorise
    monkeypatch.setattr(_linear, "factorise", lambda A, b: calls.append(1) or real(A, b))
    monkeypatch.setattr(_linear, "EXACT_EVERY", 50)
    X, r, _ = stream(200, d, seed=3)
    policy = make_policy("shared_lin_ucb", dim=d)
    k = rank_one_rows(d)
    for lo in range(0, 48, k):  # rows 0..47: in place, never factorised
        policy.update_batch(X[lo : lo + k], ["a"] * k, r[lo : lo + k])
        policy.probabilities(X[:3], ["a", "b", "c"])
    assert calls == []
    assert {"theta", "LT"} <= set(blob_arrays(policy))
    policy.update_batch(X[48:52], ["a"] * 4, r[48:52])  # crosses 50: back to a factorisation of A
    assert set(blob_arrays(policy)) == {"A", "b", "count"}
    policy.probabilities(X[:3], ["a", "b", "c"])
    assert len(calls) == 1
    policy.update_batch(X[52:53], ["a"], r[52:53])
    assert "LT" in blob_arrays(policy)
    policy.update_batch(X[53 : 54 + k], ["a"] * (k + 1), r[53 : 54 + k])  # one row too many
    assert "LT" not in blob_arrays(policy)
    forgetful = make_policy("shared_lin_ucb", dim=d, gamma=0.99)
    forgetful.update_batch(X[:1], ["a"], r[:1])
    assert "LT" not in blob_arrays(forgetful)
    per_arm = make_policy("lin_ucb", dim=d)
    per_arm.update_batch(X[:1], ["a"], r[:1])
    assert "LT" not in blob_arrays(per_arm)


def blob_arrays(policy: Policy) -> dict[str, np.ndarray]:
    return base._decode(policy.to_bytes())[1]


def batches(n: int, d: int, seed: int):
    """Batches of the sizes a learner sees: mostly single rows, some small, a few large."""
    X, r, w = stream(n, d, seed)
    rng = np.random.default_rng(seed + 1)
    lo = 0
    while lo < n:
        k = int(rng.choice([1, 1, 1, 2, rank_one_rows(d), 40]))
        yield X[lo : lo + k], ["a"] * len(r[lo : lo + k]), r[lo : lo + k], w[lo : lo + k]
        lo += k


@pytest.mark.parametrize("name", SHARED)
def test_a_model_reloaded_from_its_bytes_anywhere_continues_bit_for_bit(name, monkeypatch):
    monkeypatch.setattr(_linear, "EXACT_EVERY", 97)  # several exact refactorisations on the way
    d = 20
    todo = list(batches(500, d, seed=4))
    rng = np.random.default_rng(5)
    restarts = set(rng.choice(len(todo), size=40, replace=False).tolist())
    uninterrupted = make_policy(name, dim=d, seed=1)
    restarted = make_policy(name, dim=d, seed=1)
    cands = stream(4, d, seed=6)[0]
    for i, batch in enumerate(todo):
        if i in restarts:  # as after kill -9: only the stored bytes survive
            if i % 2:
                restarted = Policy.from_bytes(restarted.to_bytes())
            else:
                fresh = make_policy(name, dim=d, seed=1)
                fresh.load_arm_state("", restarted.arm_state_bytes(""))
                restarted = fresh
        uninterrupted.update_batch(*batch)
        restarted.update_batch(*batch)
        assert restarted.to_bytes() == uninterrupted.to_bytes(), i
        if i in restarts:
            assert restarted.scoring_view().to_bytes() == uninterrupted.scoring_view().to_bytes(), i
            got, want = (p.probabilities(cands, list("wxyz"), rng=i) for p in (restarted, uninterrupted))
            assert got.chosen == want.chosen and got.probabilities.tobytes() == want.probabilities.tobytes()


@pytest.mark.parametrize("name", SHARED)
def test_decisions_views_and_saves_in_between_do_not_change_what_is_learned(name):
    d = 20
    todo = list(batches(300, d, seed=7))
    quiet = make_policy(name, dim=d, seed=2, refactor_every=5)
    busy = make_policy(name, dim=d, seed=2, refactor_every=5)
    cands = stream(3, d, seed=8)[0]
    for batch in todo:
        quiet.update_batch(*batch)
        busy.update_batch(*batch)
        busy.probabilities(cands, ["u", "v", "w"])
        busy.scoring_view()
        assert busy.to_bytes() == quiet.to_bytes()
    assert busy.scoring_view().to_bytes() == quiet.scoring_view().to_bytes()


@pytest.mark.parametrize("name", SHARED)
def test_the_posterior_does_not_depend_on_the_compiled_extension(name, monkeypatch):
    d = 18
    todo = list(batches(200, d, seed=9))
    compiled = make_policy(name, dim=d)
    looks = {i for i in range(len(todo)) if i % 23 == 22}  # rows owed to A pile up in between
    states = {}
    for i, batch in enumerate(todo):
        compiled.update_batch(*batch)
        if i in looks:
            states[i] = compiled.to_bytes()
    with monkeypatch.context() as m:
        for module in (base, _linear):
            m.setattr(module, "_fastscore", None)
        plain = make_policy(name, dim=d)
        for i, batch in enumerate(todo):
            plain.update_batch(*batch)
            if i in looks:
                assert plain.to_bytes() == states[i], i
    assert sum("LT" in base._decode(state)[1] for state in states.values()) > len(states) // 2


def test_the_snapshot_carries_the_learners_own_factor():
    policy = make_policy("shared_lin_ts", dim=12)
    X, r, w = stream(50, 12, seed=10)
    for i in range(50):
        policy.update_batch(X[i : i + 1], ["a"], r[i : i + 1], w[i : i + 1])
    arrays = blob_arrays(policy)
    view = policy.scoring_view()
    for scorer in (view, Policy.from_bytes(policy.to_bytes()).scoring_view()):
        got = scorer.scoring_arrays("")
        np.testing.assert_array_equal(got["theta"], arrays["theta"][0])
        np.testing.assert_array_equal(np.tril(got["L"].T), got["L"].T)
        np.testing.assert_array_equal(got["L"].T, policy._arrays["factor"][0, 1:])


def test_a_state_without_a_factor_still_loads_and_is_refactorised():
    """Blobs written before in-place updates (A and b alone) load as they always did."""
    policy = make_policy("shared_lin_ucb", dim=8)
    X, r, _ = stream(30, 8, seed=11)
    policy.update_batch(X, ["a"] * 30, r)
    header, arrays = base._decode(policy.arm_state_bytes(""))
    assert set(arrays) == {"A", "b", "count"}
    loaded = make_policy("shared_lin_ucb", dim=8)
    loaded.load_arm_state("", base._encode(header, arrays))
    np.testing.assert_array_equal(loaded.posterior_mean(""), policy.posterior_mean(""))


def test_a_carried_factor_that_is_not_a_factor_is_refused_and_the_old_state_kept():
    policy = make_policy("shared_lin_ucb", dim=6)
    X, r, _ = stream(10, 6, seed=12)
    for i in range(10):
        policy.update_batch(X[i : i + 1], ["a"], r[i : i + 1])
    header, arrays = base._decode(policy.arm_state_bytes(""))
    before = policy.to_bytes()
    for broken in ({**arrays, "LT": -arrays["LT"]}, {k: v for k, v in arrays.items() if k != "theta"}):
        with pytest.raises(StateFormatError):
            policy.load_arm_state("", base._encode(header, broken))
        assert policy.to_bytes() == before
