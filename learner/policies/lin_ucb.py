"""Disjoint LinUCB: one ridge regression per arm, optimism in the face of uncertainty."""

from __future__ import annotations

from typing import Any

import numpy as np

from learner.policies._detect import DriftDetection
from learner.policies._linear import LinearPolicy
from learner.policies._robust import RobustLearning
from learner.policies.base import Block, greedy_distribution


class LinUCB(RobustLearning, DriftDetection, LinearPolicy):
    """Disjoint LinUCB: each arm its own ridge regression, play the highest upper bound.

    For candidate k with row ``x_k`` and arm ``a``, with ``theta_a = A_a^-1 b_a`` and
    ``L_a L_a^T = A_a^-1``::

        score_k = x_k . theta_a + alpha * ||L_a^T x_k||          (= alpha * sqrt(x^T A^-1 x))

    The policy plays the best score (ties share evenly); the floor then gives every candidate
    ``eps0 / K``. The reported probability is exact.

    Parameters: ``alpha`` (> = 0) width of the confidence bound; ``detect``,
    ``detect_threshold``, ``detect_keep`` (change detection on each arm's residuals, on by
    default: :class:`~learner.policies._detect.DriftDetection`); ``huber_q`` (robust learning:
    0.98 by default, 0 turns it off; :class:`~learner.policies._robust.RobustLearning`);
    ``refactor_every``,
    ``intercept_index`` (see :class:`~learner.policies._linear.LinearPolicy`); ``dim``, ``eps0``,
    ``gamma``, ``prior_mean``, ``prior_strength`` (the ridge penalty), ``arm_priors``, ``seed``
    (see :class:`~learner.policies.base.Policy`).

    >>> import numpy as np
    >>> from learner.policies import LinUCB
    >>> rng = np.random.default_rng(0)
    >>> X = np.column_stack([np.ones(200), rng.normal(size=200)])
    >>> arms = np.where(rng.random(200) < 0.5, "up", "down")
    >>> rewards = np.where(arms == "up", X[:, 1], -X[:, 1])      # "up" pays x1, "down" pays -x1
    >>> policy = LinUCB(dim=2, alpha=0.5, eps0=0.1, seed=0)
    >>> sorted(policy.update_batch(X, arms, rewards))
    ['down', 'up']
    >>> choice = policy.probabilities(np.array([[1.0, 2.0], [1.0, 2.0]]), ["up", "down"])
    >>> choice.probabilities.round(6).tolist(), choice.chosen
    ([0.95, 0.05], 0)

    References: L. Li, W. Chu, J. Langford, R. E. Schapire (2010), "A contextual-bandit approach
    to personalized news article recommendation", WWW 2010, Algorithm 1.
    """

    name = "lin_ucb"

    def __init__(self, dim: int, *, alpha: float = 1.0, **kwargs: Any) -> None:
        if not (alpha >= 0.0 and np.isfinite(alpha)):
            raise ValueError(f"alpha must be finite and >= 0, got {alpha!r}")
        self.alpha = float(alpha)
        super().__init__(dim, **kwargs)

    def _policy_probabilities(
        self, X: np.ndarray, slots: np.ndarray, block: Block | None, rng: np.random.Generator
    ) -> np.ndarray:
        mean, width = self._mean_width(X, slots, block)
        return greedy_distribution(mean + self.alpha * width)

    def _compiled_rule(self, K: int, rng: np.random.Generator) -> tuple[float, None, int, float]:
        return self.alpha, None, 0, 0.0

    @classmethod
    def _unit_test_params(cls) -> dict[str, Any]:
        return {**super()._unit_test_params(), "alpha": 0.5}
