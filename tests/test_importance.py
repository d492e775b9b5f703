"""Permutation importance (:mod:`learner.evaluation.importance`): the feature that drives the
reward ranks first, noise scores near 0, a categorical block counts as one feature, and the
same seed gives the same answer."""

from __future__ import annotations

import numpy as np
import pytest

from learner.evaluation import InvalidInputError, permutation_importance


def _log(n: int = 3000, seed: int = 4):
    """Column 0 drives the reward of action 0 and, reversed, of action 1; columns 1-3 are a
    one-hot category that lifts action 2 in its first value; column 4 is noise."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    category = rng.integers(0, 3, n)
    noise = rng.normal(size=n)
    X = np.column_stack([x, np.eye(3)[category], noise])
    action = rng.integers(0, 3, n)
    mean = np.select([action == 0, action == 1], [0.5 + 0.3 * x, 0.5 - 0.3 * x], 0.3 + 0.2 * (category == 0))
    return X, action, mean + rng.normal(scale=0.2, size=n)


GROUPS = [slice(0, 1), slice(1, 4), slice(4, 5)]


def test_the_driving_feature_ranks_first_and_noise_scores_near_zero():
    X, action, reward = _log()
    result = permutation_importance(X, GROUPS, action, reward, n_actions=3, random_state=0)
    scores = result.scores()
    assert scores[0] == 1.0 and scores[0] > scores[1] > scores[2]
    assert scores[1] > 0.02 and scores[2] < 0.01  # the category matters for one action in three (about 0.05); noise not
    assert result.drop[2] < 3 * result.stderr[2] + 1e-3
    assert result.rows == len(X) and 0.03 < result.loss < 0.06  # about the noise's variance, 0.04


def test_the_same_seed_gives_the_same_importance():
    X, action, reward = _log(n=500)
    a = permutation_importance(X, GROUPS, action, reward, n_actions=3, random_state=7)
    b = permutation_importance(X, GROUPS, action, reward, n_actions=3, random_state=7)
    assert a.drop.tolist() == b.drop.tolist() and a.loss == b.loss


def test_groups_must_be_contiguous_slices_of_the_columns():
    X, action, reward = _log(n=100)
    with pytest.raises(InvalidInputError, match="slice"):
        permutation_importance(X, [slice(4, 6)], action, reward, n_actions=3)
    with pytest.raises(InvalidInputError, match="n_folds"):
        permutation_importance(X, GROUPS, action, reward, n_actions=3, n_folds=1)
