"""The simulated workloads: seeded, with exact expected rewards and a real gap to learn."""

from __future__ import annotations

import numpy as np
import pytest

from banditstream.simulate import ENVIRONMENTS, make_environment


@pytest.mark.parametrize("name", sorted(ENVIRONMENTS))
def test_expected_reward_matches_the_empirical_mean(name):
    env = make_environment(name)
    rng = np.random.default_rng(1)
    context = env.sample_context(rng)
    for action in env.actions:
        draws = [env.outcome(context, action, rng).reward for _ in range(4000)]
        assert abs(np.mean(draws) - env.expected_reward(context, action)) < 0.04


@pytest.mark.parametrize("name", sorted(ENVIRONMENTS))
def test_the_oracle_beats_random_and_no_action_is_best_everywhere(name):
    env = make_environment(name)
    rng = np.random.default_rng(2)
    contexts = [env.sample_context(rng) for _ in range(300)]
    oracle = np.mean([env.oracle(c)[1] for c in contexts])
    random = np.mean([env.random_value(c) for c in contexts])
    assert oracle - random > 0.2
    best = {env.oracle(c)[0] for c in contexts}
    assert len(best) >= 3  # the best action depends on the context: there is something to learn


def test_same_seed_same_workload():
    a, b = make_environment("llm_routing"), make_environment("llm_routing")
    ra, rb = np.random.default_rng(7), np.random.default_rng(7)
    for _ in range(50):
        ca, cb = a.sample_context(ra), b.sample_context(rb)
        assert ca == cb
        assert a.outcome(ca, "gpt-large", ra) == b.outcome(cb, "gpt-large", rb)
