"""LinUCB over action-dependent features: one model shared by every arm."""

from __future__ import annotations

from typing import Any

import numpy as np

from learner.policies._linear import LinearPolicy
from learner.policies.base import Block, greedy_distribution


class SharedLinUCB(LinearPolicy):
    """LinUCB with one ridge regression over action-dependent rows, shared by every arm.

    Candidate k is described by its own row ``x_k`` (context x action interactions plus action
    features, see :class:`learner.features.FeatureEncoder`); the arm id is not part of the key,
    so new actions are scored from their features at once and all arms share what is learned::

        score_k = x_k . theta + alpha * ||L^T x_k||

    The state is one arm, ``""`` (:data:`~learner.policies.base.SHARED_ARM`); ``arm_priors``
    does not apply (the prior is ``prior_mean`` / ``prior_strength``) and forgetting counts every
    row. The reported probability is exact.

    Parameters: ``alpha`` as in :class:`~learner.policies.lin_ucb.LinUCB`; the rest as there.

    >>> import numpy as np
    >>> from learner.policies import SharedLinUCB
    >>> rng = np.random.default_rng(0)
    >>> X = np.column_stack([np.ones(300), rng.normal(size=(300, 2))])   # (1, quality, cost)
    >>> rewards = X @ [0.0, 1.0, -0.5]
    >>> policy = SharedLinUCB(dim=3, alpha=0.1, eps0=0.0, seed=0)
    >>> policy.update_batch(X, ["any"] * 300, rewards)
    ['']
    >>> candidates = np.array([[1.0, 0.9, 0.1], [1.0, 0.2, 0.0], [1.0, 0.9, 2.0]])
    >>> policy.probabilities(candidates, ["new-a", "new-b", "new-c"]).chosen
    0

    References: L. Li, W. Chu, J. Langford, R. E. Schapire (2010), "A contextual-bandit approach
    to personalized news article recommendation", WWW 2010 (Algorithm 2, hybrid features);
    W. Chu, L. Li, L. Reyzin, R. E. Schapire (2011), "Contextual bandits with linear payoff
    functions", AISTATS 2011.
    """

    name = "shared_lin_ucb"
    shared = True

    def __init__(self, dim: int, *, alpha: float = 1.0, **kwargs: Any) -> None:
        if not (alpha >= 0.0 and np.isfinite(alpha)):
            raise ValueError(f"alpha must be finite and >= 0, got {alpha!r}")
        self.alpha = float(alpha)
        super().__init__(dim, **kwargs)

    def _policy_probabilities(
        self, X: np.ndarray, slots: np.ndarray, block: Block | None, rng: np.random.Generator
    ) -> np.ndarray:
        mean, M = self._shared_terms(X)
        return greedy_distribution(mean + self.alpha * np.sqrt(np.einsum("kd,kd->k", M, M)))

    @classmethod
    def _unit_test_params(cls) -> dict[str, Any]:
        return {**super()._unit_test_params(), "alpha": 0.5}
