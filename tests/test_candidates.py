"""Counterfactual candidates on a logged bandit: what each one's action_dist must be."""

from __future__ import annotations

import random

import numpy as np
import pytest

from learner.evaluation.candidates import AlwaysArm, Fixed, Logging, Progressive, Uniform
from learner.evaluation.logged import LoggedBandit
from learner.policies import make_policy

ARMS = ("a", "b", "c")


def logged(n: int = 600, seed: int = 0) -> LoggedBandit:
    """Uniform logging over 2-3 of three arms; arm "c" pays when x1 > 0, else "a"."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        actions = ARMS if i % 4 else ("a", "b")
        chosen = rng.randrange(len(actions))
        x1 = rng.gauss(0, 1)
        best = "c" if x1 > 0 and "c" in actions else "a"
        rows.append({"event_id": f"e{i:05d}", "tenant": "default", "workspace": "main", "domain": "d",
                     "actions": list(actions), "probabilities": [1 / len(actions)] * len(actions), "arm_index": chosen,
                     "reward": float(actions[chosen] == best), "features": [1.0, x1, rng.gauss(0, 1)],
                     "decision_time": i})
    return LoggedBandit.from_updates(rows)


def test_uniform_logging_and_always_arm_give_the_distributions_they_name():
    log = logged()
    uniform = Uniform().action_dist(log)
    np.testing.assert_allclose(uniform.sum(axis=1), 1.0)
    assert (uniform[~log.candidates] == 0).all()
    np.testing.assert_array_equal(Logging().action_dist(log), log.logged_dist)
    c = AlwaysArm("c").action_dist(log)
    k = log.actions.index("c")
    assert (c[log.candidates[:, k], k] == 1.0).all()
    np.testing.assert_array_equal(c[~log.candidates[:, k]], uniform[~log.candidates[:, k]])  # where c was no candidate
    np.testing.assert_array_equal(AlwaysArm("zzz").action_dist(log), uniform)


def test_a_fixed_policy_scores_each_row_with_its_own_decide_step():
    log = logged()
    policy = make_policy("lin_ucb", dim=3, alpha=0.2, eps0=0.1, seed=1)
    policy.update_batch(log.context[:300], [log.actions[a] for a in log.action[:300]], log.reward[:300])
    dist = Fixed(policy, "trained").action_dist(log)
    for i in (0, 1, 5, 299, 599):
        columns = np.flatnonzero(log.candidates[i])
        expected = policy.probabilities(np.tile(log.context[i], (len(columns), 1)), [log.actions[k] for k in columns], 0)
        np.testing.assert_allclose(dist[i, columns], expected.probabilities, rtol=0, atol=1e-15)
    assert (dist[~log.candidates] == 0).all()


def test_thompson_probabilities_are_seeded_monte_carlo():
    log = logged(200)
    policy = make_policy("lin_ts", dim=3, v=0.5, n_draws=256, seed=3)
    a = Fixed(policy, seed=4).action_dist(log)
    b = Fixed(policy, seed=4).action_dist(log)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, Fixed(policy, seed=5).action_dist(log))


def test_a_progressive_candidate_never_scores_a_row_with_a_model_that_learned_from_it():
    log = logged(600)
    spec = Progressive("lin_ucb", {"alpha": 0.5, "eps0": 0.05}, batch_size=50)
    dist = spec.action_dist(log)
    changed = log.select(np.ones(len(log), dtype=bool))
    changed.reward[275:] = 1.0 - changed.reward[275:]  # rewards from row 275 (inside the batch 250-299) on
    again = spec.action_dist(changed)
    np.testing.assert_array_equal(again[:300], dist[:300])  # scored before the changed batch was learned
    assert not np.array_equal(again[300:], dist[300:])
    late = dist[400:]
    best = np.where((log.context[400:, 1] > 0) & log.candidates[400:, 2], 2, 0)
    assert late[np.arange(len(late)), best].mean() > 0.8  # it learned the rule


def test_a_progressive_portfolio_chooses_who_acts_from_the_log_as_the_publisher_does():
    log = logged(1200)
    poor = {"policy": "lin_ucb", "alpha": 0.5, "eps0": 0.9, "arm_priors": {"b": [2.0, 1e6]}, "label": "poor"}  # believes b, which never pays, pays 2
    sound = {"policy": "lin_ucb", "alpha": 0.5, "eps0": 0.05}
    dist = Progressive("portfolio", {"members": [poor, sound], "min_rows": 200}, batch_size=50).action_dist(log)
    alone = {name: Progressive("lin_ucb", {k: v for k, v in spec.items() if k not in ("policy", "label")}, batch_size=50).action_dist(log)
             for name, spec in (("poor", poor), ("sound", sound))}  # fmt: skip
    np.testing.assert_array_equal(dist[:200], alone["poor"][:200])  # the first member acts until the log says otherwise
    np.testing.assert_array_equal(dist[-300:], alone["sound"][-300:])  # then the sound one, whose choices pay more


def shared_log(n: int = 600, seed: int = 0) -> LoggedBandit:
    return LoggedBandit.from_updates(shared_updates(n, seed), domain="d")


def shared_updates(n: int, seed: int) -> list[dict]:
    """A shared model's log: three candidates per row (of four ids, in varying order), each
    with its own row (intercept, quality); the reward is 1 when the chosen one's quality > 0."""
    rng = np.random.default_rng(seed)
    updates = []
    for i in range(n):
        rows = np.column_stack([np.ones(3), rng.normal(size=3)])
        ids = ["a", "b", "c"] if i % 2 else ["d", "c", "b"]
        chosen = int(rng.integers(3))
        updates.append({"event_id": f"e{i}", "tenant": "default", "workspace": "main", "domain": "d", "arm": ids[chosen],
                        "arm_index": chosen, "actions": ids, "probabilities": [1 / 3] * 3, "features": rows[chosen].tolist(),
                        "reward": float(rows[chosen, 1] > 0), "decision_time": i, "candidate_features": rows.tolist()})  # fmt: skip
    return updates


def test_a_shared_model_is_scored_on_every_candidate_s_own_row_of_a_shared_log():
    updates = shared_updates(600, 0)
    log = LoggedBandit.from_updates(updates, domain="d")
    assert log.actions == ["d", "c", "b", "a"] and log.candidate_rows[1].shape == (3, 2)
    # row 1 logged a, b, c: its rows are put in the log's column order (c, b, a)
    np.testing.assert_array_equal(log.candidate_rows[1], np.array(updates[1]["candidate_features"])[[2, 1, 0]])
    assert log.select(np.arange(600) % 2 == 1).candidate_rows[0] is log.candidate_rows[1]
    dist = Progressive("shared_lin_ucb", {"alpha": 0.0, "eps0": 0.0}, batch_size=50).action_dist(log)
    np.testing.assert_allclose(dist.sum(axis=1), 1.0)
    assert np.all(dist[~log.candidates] == 0.0)
    late = range(300, len(log))
    best = [np.flatnonzero(log.candidates[i])[np.argmax(log.candidate_rows[i][:, 1])] for i in late]
    assert dist[list(late), best].mean() > 0.95  # it learned "the higher quality" from each candidate's own row


def test_dr_on_a_shared_log_models_every_candidate_s_own_row_and_covers_the_truth():
    from learner.evaluation.run import evaluate_candidates

    log = shared_log(3000, seed=3)
    fixed = Progressive("shared_lin_ucb", {"alpha": 0.0, "eps0": 0.0}, batch_size=100)
    run = evaluate_candidates(log, [fixed], estimators=("dr", "snips"), seed=0)
    dist = fixed.action_dist(log)
    truth = np.mean([dist[i, np.flatnonzero(log.candidates[i])] @ (log.candidate_rows[i][:, 1] > 0) for i in range(len(log))])
    for name in ("dr", "snips"):
        e = run.results[0].estimates[name]
        assert e.lower <= truth <= e.upper, (name, e, truth)
    assert run.results[0].estimates["dr"].upper - run.results[0].estimates["dr"].lower < 0.1


def test_shared_models_and_bad_specs_are_refused_by_name():
    with pytest.raises(ValueError, match="shared model"):
        Progressive("shared_lin_ucb").action_dist(logged())
    with pytest.raises(ValueError, match="per-arm model"):
        Progressive("lin_ucb").action_dist(shared_log(60))
    with pytest.raises(ValueError, match="unknown policy"):
        Progressive("lin_nonsense")
    with pytest.raises(ValueError, match="batch_size"):
        Progressive("lin_ucb", batch_size=0)
