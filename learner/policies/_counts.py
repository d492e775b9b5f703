"""Per-arm weighted counts and reward sums, the statistics behind the context-free policies.

Each arm keeps ``n`` (weighted number of observations) and ``s`` (weighted reward sum), started at
the prior's pseudo-observations::

    n = prior_strength + sum_i w_i          s = prior_strength * prior_mean + sum_i w_i r_i

so its mean estimate ``s / n`` starts at ``prior_mean`` (an arm with ``n = 0``, possible with a
zero strength, reports ``prior_mean``). Forgetting discounts both toward the prior (the
discounted UCB / sliding estimates of Garivier & Moulines, 2011). The rows X are accepted for a
uniform API and ignored.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from learner.policies.base import Drift, Policy


class CountPolicy(Policy):
    """Mechanics shared by UCB1, epsilon-greedy and softmax (the scoring view is ``n`` and ``s``)."""

    _stat_names: ClassVar[tuple[str, ...]] = ("n", "s")
    _scoring_names: ClassVar[tuple[str, ...]] = ("n", "s")

    def _stat_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"n": (), "s": ()}

    def _prior_stats(self, mean: np.ndarray, strength: np.ndarray) -> dict[str, np.ndarray]:
        return {"n": strength.copy(), "s": strength * mean}

    def _accumulate(
        self, slots: np.ndarray, starts: np.ndarray, counts: np.ndarray, X: np.ndarray, r: np.ndarray, w: np.ndarray
    ) -> None:
        self._arrays["n"][slots] += np.add.reduceat(w, starts)
        self._arrays["s"][slots] += np.add.reduceat(w * r, starts)

    def _means(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean estimates and weighted counts of the candidates' arms."""
        n = self._arrays["n"][slots]
        s = self._arrays["s"][slots]
        safe = np.where(n > 0, n, 1.0)
        return np.where(n > 0, s / safe, self._arrays["pmean"][slots]), n

    def _row_means(self, X: np.ndarray, slots: np.ndarray) -> np.ndarray:
        return self._means(slots)[0]

    def _drift(self, slot: int) -> Drift:
        # The mean of n unit-variance rewards has variance 1/n; the "precision" is n itself.
        n = float(self._arrays["n"][slot])
        return Drift(1.0 / n if n > 0 else float("inf"), n)
