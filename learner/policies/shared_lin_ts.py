"""Linear Thompson sampling over action-dependent features: one model shared by every arm."""

from __future__ import annotations

from typing import Any

import numpy as np

from learner.policies._linear import LinearPolicy, ThompsonParams
from learner.policies.base import Block, gaussian_argmax_frequencies


class SharedLinTS(ThompsonParams, LinearPolicy):
    """Linear Thompson sampling with one Gaussian posterior over action-dependent rows.

    One draw ``theta~ = theta + v L z`` (z ~ N(0, I_d)) scores every candidate, so the sampled
    scores are correlated: ``X theta~ = X theta + v (X L) z``. The probability of each candidate
    is **estimated** as the share of ``n_draws`` posterior draws (antithetic pairs) it wins, and
    the choice is drawn from that estimated distribution with the floor mixed in, exactly as in
    :class:`~learner.policies.lin_ts.LinTS`. State and priors as in
    :class:`~learner.policies.shared_lin_ucb.SharedLinUCB` (one arm, ``""``).

    Parameters: ``v``, ``n_draws`` as in :class:`~learner.policies.lin_ts.LinTS`; the rest as there.

    >>> import numpy as np
    >>> from learner.policies import SharedLinTS
    >>> rng = np.random.default_rng(0)
    >>> X = np.column_stack([np.ones(300), rng.normal(size=(300, 2))])   # (1, quality, cost)
    >>> rewards = X @ [0.0, 1.0, -0.5]
    >>> policy = SharedLinTS(dim=3, v=0.1, eps0=0.0, seed=0)
    >>> policy.update_batch(X, ["any"] * 300, rewards)
    ['']
    >>> candidates = np.array([[1.0, 0.9, 0.1], [1.0, 0.2, 0.0], [1.0, 0.9, 2.0]])
    >>> policy.probabilities(candidates, ["new-a", "new-b", "new-c"]).probabilities.tolist()
    [1.0, 0.0, 0.0]

    References: S. Agrawal, N. Goyal (2013), "Thompson sampling for contextual bandits with
    linear payoffs", ICML 2013.
    """

    name = "shared_lin_ts"
    shared = True

    def _policy_probabilities(
        self, X: np.ndarray, slots: np.ndarray, block: Block | None, rng: np.random.Generator
    ) -> np.ndarray:
        mean, M = self._shared_terms(X)
        scaled = self.v * M.T  # (d, K): a block of normals z (m, d) maps to score noise z @ scaled
        return gaussian_argmax_frequencies(mean, lambda z: z @ scaled, self.n_draws, rng, self.dim)

    @classmethod
    def _unit_test_params(cls) -> dict[str, Any]:
        return {**super()._unit_test_params(), "v": 0.5, "n_draws": 64}
