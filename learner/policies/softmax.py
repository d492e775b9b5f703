"""Softmax (Boltzmann) exploration."""

from __future__ import annotations

from typing import Any

import numpy as np

from learner.policies._counts import CountPolicy
from learner.policies.base import Block


class Softmax(CountPolicy):
    """Softmax exploration: play arms in proportion to exp(mean / temperature); ignores context.

    ::

        p_a = exp((mean_a - max_b mean_b) / temperature) / sum_b exp((mean_b - max) / temperature)

    Small temperatures approach greedy, large ones uniform. The floor is mixed in on top; the
    probability is exact.

    Parameters: ``temperature`` (> 0, in reward units); ``dim``, ``eps0``, ``gamma``,
    ``prior_mean``, ``prior_strength``, ``arm_priors``, ``seed``
    (:class:`~learner.policies.base.Policy`).

    >>> import numpy as np
    >>> from learner.policies import Softmax
    >>> policy = Softmax(dim=1, temperature=0.5, eps0=0.0, prior_strength=0.0)
    >>> _ = policy.update_batch(np.ones((2, 1)), ["a", "b"], [1.0, 0.0])
    >>> policy.probabilities(np.ones((2, 1)), ["a", "b"]).probabilities.round(4).tolist()
    [0.8808, 0.1192]

    References: R. S. Sutton, A. G. Barto (2018), "Reinforcement Learning: An Introduction",
    2nd ed., section 2.8; J. Vermorel, M. Mohri (2005), "Multi-armed bandit algorithms and
    empirical evaluation", ECML 2005.
    """

    name = "softmax"

    def __init__(self, dim: int, *, temperature: float = 0.1, **kwargs: Any) -> None:
        if not (temperature > 0.0 and np.isfinite(temperature)):
            raise ValueError(f"temperature must be finite and > 0, got {temperature!r}")
        self.temperature = float(temperature)
        super().__init__(dim, **kwargs)

    def _policy_probabilities(
        self, X: np.ndarray, slots: np.ndarray, block: Block | None, rng: np.random.Generator
    ) -> np.ndarray:
        mean, _ = self._means(slots)
        e = np.exp((mean - mean.max()) / self.temperature)
        return e / e.sum()

    @classmethod
    def _unit_test_params(cls) -> dict[str, Any]:
        return {"dim": 4, "eps0": 0.1, "seed": 0, "temperature": 0.2}
