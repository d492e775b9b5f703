"""UCB1: the context-free upper confidence bound."""

from __future__ import annotations

from typing import Any

import numpy as np

from learner.policies._counts import CountPolicy
from learner.policies.base import Block, greedy_distribution


class UCB1(CountPolicy):
    """UCB1: play the arm with the highest mean plus confidence bonus; ignores the context.

    With ``n_a`` and ``mean_a`` the arm's (prior-smoothed, possibly discounted) weighted count
    and mean, and ``T`` the sum of ``n_a`` over the candidates::

        score_a = mean_a + c * sqrt(2 ln(max(T, 1)) / n_a)        (n_a = 0: +inf, tried first)

    The best score is played (ties share evenly), the floor mixed in; the probability is exact.
    Auer's guarantee assumes rewards in [0, 1]; ``c`` rescales the bonus for other ranges.

    Parameters: ``c`` (>= 0) bonus scale; ``dim``, ``eps0``, ``gamma``, ``prior_mean``,
    ``prior_strength`` (pseudo-observations, may be 0), ``arm_priors``, ``seed``
    (:class:`~learner.policies.base.Policy`).

    >>> import numpy as np
    >>> from learner.policies import UCB1
    >>> policy = UCB1(dim=1, c=0.5, eps0=0.0, prior_strength=0.0)
    >>> X = np.ones((3, 1))
    >>> policy.probabilities(X, ["a", "b", "c"]).probabilities.tolist()   # nothing tried yet
    [0.3333333333333333, 0.3333333333333333, 0.3333333333333333]
    >>> _ = policy.update_batch(np.ones((6, 1)), ["a", "b", "c"] * 2, [0.9, 0.1, 0.2] * 2)
    >>> policy.probabilities(X, ["a", "b", "c"]).chosen
    0

    References: P. Auer, N. Cesa-Bianchi, P. Fischer (2002), "Finite-time analysis of the
    multiarmed bandit problem", Machine Learning 47; A. Garivier, E. Moulines (2011), "On
    upper-confidence bound policies for switching bandit problems", ALT 2011 (discounting).
    """

    name = "ucb1"

    def __init__(self, dim: int, *, c: float = 1.0, **kwargs: Any) -> None:
        if not (c >= 0.0 and np.isfinite(c)):
            raise ValueError(f"c must be finite and >= 0, got {c!r}")
        self.c = float(c)
        super().__init__(dim, **kwargs)

    def _policy_probabilities(
        self, X: np.ndarray, slots: np.ndarray, block: Block | None, rng: np.random.Generator
    ) -> np.ndarray:
        mean, n = self._means(slots)
        log_t = np.log(max(float(n.sum()), 1.0))
        with np.errstate(divide="ignore"):
            bonus = np.where(n > 0, self.c * np.sqrt(2.0 * log_t / np.where(n > 0, n, 1.0)), np.inf)
        return greedy_distribution(mean + bonus)

    @classmethod
    def _unit_test_params(cls) -> dict[str, Any]:
        return {"dim": 4, "eps0": 0.1, "seed": 0, "c": 0.5}
