"""Disjoint linear models explored by inverse-gap weighting (SquareCB)."""

from __future__ import annotations

from typing import Any

import numpy as np

from learner.policies._linear import LinearPolicy
from learner.policies.base import Block


class LinIGW(LinearPolicy):
    """Inverse-gap weighting over per-arm ridge regressions: SquareCB with linear models.

    For candidate k with row ``x_k`` and arm ``a``, the model predicts
    ``yhat_k = x_k . theta_a``. With ``b`` the best prediction (the first of ties) and
    ``gamma_t = gamma_scale * t ** gamma_exponent``, ``t`` the rows learned by the policy so
    far (at least 1)::

        p_k = 1 / (K + gamma_t * (yhat_b - yhat_k))     for k != b
        p_b = 1 - sum of the others

    so a candidate is explored in proportion to how little worse it is predicted, less and
    less as evidence accumulates; the floor then gives every candidate ``eps0 / K``. The
    distribution is a closed form of the model: exact and deterministic (the same model and
    rows give the same probabilities, with no draws), which is what off-policy evaluation wants.

    Parameters: ``gamma_scale`` (> 0) and ``gamma_exponent`` (>= 0) of the learning rate
    (Vowpal Wabbit's ``--squarecb`` defaults, 10 and 0.5); ``refactor_every``,
    ``intercept_index`` (see :class:`~learner.policies._linear.LinearPolicy`); ``dim``,
    ``eps0``, ``gamma``, ``prior_mean``, ``prior_strength``, ``arm_priors``, ``seed`` (see
    :class:`~learner.policies.base.Policy`).

    >>> import numpy as np
    >>> from learner.policies import LinIGW
    >>> policy = LinIGW(dim=1, gamma_scale=10.0, gamma_exponent=0.0, eps0=0.0, prior_strength=1.0)
    >>> _ = policy.update_batch(np.ones((2, 1)), ["good", "poor"], [1.0, 0.0])   # theta 0.5 and 0
    >>> policy.probabilities(np.ones((2, 1)), ["good", "poor"]).probabilities.round(12).tolist()   # 1/(2 + 10 * 0.5)
    [0.857142857143, 0.142857142857]

    References: D. J. Foster, A. Rakhlin (2020), "Beyond UCB: optimal and efficient contextual
    bandits with regression oracles", ICML 2020; A. Bietti, A. Agarwal, J. Langford (2021), "A
    contextual bandit bake-off", JMLR 22.
    """

    name = "lin_igw"

    def __init__(self, dim: int, *, gamma_scale: float = 10.0, gamma_exponent: float = 0.5, **kwargs: Any) -> None:
        if not (gamma_scale > 0.0 and np.isfinite(gamma_scale)):
            raise ValueError(f"gamma_scale must be finite and > 0, got {gamma_scale!r}")
        if not (gamma_exponent >= 0.0 and np.isfinite(gamma_exponent)):
            raise ValueError(f"gamma_exponent must be finite and >= 0, got {gamma_exponent!r}")
        self.gamma_scale = float(gamma_scale)
        self.gamma_exponent = float(gamma_exponent)
        super().__init__(dim, **kwargs)

    def learning_rate(self) -> float:
        """``gamma_t`` for the rows learned so far."""
        rows = int(self._arrays["count"][: len(self._arms)].sum()) if self._arms else 0
        return self.gamma_scale * max(rows, 1) ** self.gamma_exponent

    def _policy_probabilities(
        self, X: np.ndarray, slots: np.ndarray, block: Block | None, rng: np.random.Generator
    ) -> np.ndarray:
        mean, _ = self._mean_width(X, slots, block)
        best = int(np.argmax(mean))
        p = 1.0 / (len(mean) + self.learning_rate() * (mean[best] - mean))
        p[best] = 0.0
        p[best] = 1.0 - p.sum()
        return p

    @classmethod
    def _unit_test_params(cls) -> dict[str, Any]:
        return {**super()._unit_test_params(), "gamma_scale": 10.0}
