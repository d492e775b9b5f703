"""Epsilon-greedy with a decaying exploration rate."""

from __future__ import annotations

from typing import Any

import numpy as np

from learner.policies._counts import CountPolicy
from learner.policies.base import Block, greedy_distribution


class EpsilonGreedy(CountPolicy):
    """Epsilon-greedy: the best mean with probability 1 - eps_t, uniform otherwise; ignores context.

    The rate decays geometrically with ``t``, the number of rows learned over every arm the
    policy holds (so all replicas of one snapshot explore alike)::

        eps_t = max(eps_min, eps_start * decay^t)

    and the policy's distribution is ``(1 - eps_t) * greedy + eps_t / K`` (ties in the greedy
    part share evenly), with the floor ``eps0`` mixed in on top; the probability is exact.

    Parameters: ``eps_start`` in [0, 1]; ``decay`` in (0, 1]; ``eps_min`` in [0, eps_start];
    ``dim``, ``eps0``, ``gamma``, ``prior_mean``, ``prior_strength``, ``arm_priors``, ``seed``
    (:class:`~learner.policies.base.Policy`).

    >>> import numpy as np
    >>> from learner.policies import EpsilonGreedy
    >>> policy = EpsilonGreedy(dim=1, eps_start=0.5, decay=0.99, eps_min=0.1, eps0=0.0)
    >>> _ = policy.update_batch(np.ones((4, 1)), ["a", "b"] * 2, [1.0, 0.0] * 2)
    >>> round(policy.epsilon(), 4)        # 0.5 * 0.99 ** 4
    0.4803
    >>> policy.probabilities(np.ones((2, 1)), ["a", "b"]).probabilities.round(4).tolist()
    [0.7599, 0.2401]

    References: R. S. Sutton, A. G. Barto (2018), "Reinforcement Learning: An Introduction",
    2nd ed., section 2.2; P. Auer, N. Cesa-Bianchi, P. Fischer (2002), "Finite-time analysis of
    the multiarmed bandit problem" (decaying epsilon_n-greedy).
    """

    name = "epsilon_greedy"

    def __init__(
        self, dim: int, *, eps_start: float = 0.5, decay: float = 0.999, eps_min: float = 0.01, **kwargs: Any
    ) -> None:
        if not 0.0 <= eps_start <= 1.0:
            raise ValueError(f"eps_start must be in [0, 1], got {eps_start!r}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        if not 0.0 <= eps_min <= eps_start:
            raise ValueError(f"eps_min must be in [0, eps_start={eps_start}], got {eps_min!r}")
        self.eps_start = float(eps_start)
        self.decay = float(decay)
        self.eps_min = float(eps_min)
        super().__init__(dim, **kwargs)

    def epsilon(self) -> float:
        """The current exploration rate ``eps_t``."""
        t = int(self._arrays["count"][: len(self._arms)].sum())
        return max(self.eps_min, self.eps_start * self.decay**t)

    def _policy_probabilities(
        self, X: np.ndarray, slots: np.ndarray, block: Block | None, rng: np.random.Generator
    ) -> np.ndarray:
        mean, _ = self._means(slots)
        eps = self.epsilon()
        p = greedy_distribution(mean)
        p *= 1.0 - eps
        p += eps / len(slots)
        return p

    @classmethod
    def _unit_test_params(cls) -> dict[str, Any]:
        return {"dim": 4, "eps0": 0.1, "seed": 0, "eps_start": 0.5, "decay": 0.99, "eps_min": 0.05}
