"""Beta-Bernoulli Thompson sampling per segment."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from learner.policies.base import Block, Drift, Policy, argmax_frequencies


class BetaTS(Policy):
    """Beta-Bernoulli Thompson sampling, one Beta posterior per (arm, segment).

    A segment is a value of one categorical context feature (e.g. the intent), read from the
    feature row: ``segment_slots`` lists the row coordinates that one-hot encode the segment
    values (``FeatureEncoder.categorical_slots("intent", ["billing", "tech"])`` gives them), and a
    row's segment is the first of those coordinates that is non-zero, or the last segment
    ("other") when none is. Without ``segment_slots`` there is one segment. Rewards are clipped
    to [0, 1] and counted as fractional successes::

        alpha[a, s] += w * r          beta[a, s] += w * (1 - r)

    from the prior ``alpha0 = strength * mean``, ``beta0 = strength * (1 - mean)`` (the default
    ``mean=0.5, strength=2`` is the uniform Beta(1, 1)). Forgetting discounts every segment of
    an arm, toward its prior, for each row the arm learns.

    The probability of each candidate is **estimated** as the share of ``n_draws`` joint
    posterior draws it wins; the choice is drawn, with the same rng, from that estimated
    distribution with the floor mixed in, so the reported probability is exactly the one the
    choice was drawn with (an estimate, standard error <= ``0.5 / sqrt(n_draws)``, of the
    probability that one posterior draw picks it; see :class:`~learner.policies.lin_ts.LinTS`
    for why off-policy estimates stay unbiased).

    Parameters: ``segment_slots`` (row coordinates of the segment values); ``n_draws`` (>= 1);
    ``dim``, ``eps0``, ``gamma``, ``prior_mean`` in (0, 1), ``prior_strength`` (> 0),
    ``arm_priors``, ``seed`` (:class:`~learner.policies.base.Policy`).

    >>> import numpy as np
    >>> from learner.policies import BetaTS
    >>> policy = BetaTS(dim=3, segment_slots=[1, 2], eps0=0.0, n_draws=500, seed=1)
    >>> billing, tech = [1.0, 1.0, 0.0], [1.0, 0.0, 1.0]          # intercept, intent one-hot
    >>> X = np.array([billing, billing, tech, tech] * 25)
    >>> arms = ["faq", "agent", "faq", "agent"] * 25
    >>> rewards = [1.0, 0.0, 0.0, 1.0] * 25           # faq solves billing, the agent solves tech
    >>> _ = policy.update_batch(X, arms, rewards)
    >>> policy.probabilities(np.array([billing, billing]), ["faq", "agent"]).probabilities.tolist()
    [1.0, 0.0]
    >>> policy.probabilities(np.array([tech, tech]), ["faq", "agent"]).probabilities.tolist()
    [0.0, 1.0]

    References: W. R. Thompson (1933), "On the likelihood that one unknown probability exceeds
    another in view of the evidence of two samples", Biometrika 25; O. Chapelle, L. Li (2011),
    "An empirical evaluation of Thompson sampling", NeurIPS 2011; S. Agrawal, N. Goyal (2012),
    "Analysis of Thompson sampling for the multi-armed bandit problem", COLT 2012 (fractional
    rewards as Bernoulli trials).
    """

    name = "beta_ts"
    _stat_names: ClassVar[tuple[str, ...]] = ("alpha", "beta")
    _scoring_names: ClassVar[tuple[str, ...]] = ("alpha", "beta")

    def __init__(
        self,
        dim: int,
        *,
        segment_slots: Sequence[int] = (),
        n_draws: int = 128,
        prior_mean: float = 0.5,
        prior_strength: float = 2.0,
        **kwargs: Any,
    ) -> None:
        slots = tuple(int(s) for s in segment_slots)
        if any(not 0 <= s < dim for s in slots) or len(set(slots)) != len(slots):
            raise ValueError(f"segment_slots must be distinct coordinates in [0, dim={dim}), got {list(slots)}")
        if isinstance(n_draws, bool) or int(n_draws) != n_draws or n_draws < 1:
            raise ValueError(f"n_draws must be an int >= 1, got {n_draws!r}")
        self.segment_slots = slots
        self.n_draws = int(n_draws)
        self._segment_index = np.array(slots, dtype=np.intp)
        super().__init__(dim, prior_mean=prior_mean, prior_strength=prior_strength, **kwargs)

    def _check_prior(self, mean: float, strength: float, what: str) -> None:
        if not (math.isfinite(mean) and math.isfinite(strength) and 0.0 < mean < 1.0 and strength > 0.0):
            raise ValueError(f"{what} needs a mean in (0, 1) and a strength > 0, got ({mean}, {strength})")

    @property
    def n_segments(self) -> int:
        return len(self.segment_slots) + 1

    def segments(self, X: np.ndarray) -> np.ndarray:
        """Segment index of each row: its first non-zero segment coordinate, else the last one."""
        if not self.segment_slots:
            return np.zeros(X.shape[0], dtype=np.intp)
        hit = X[:, self._segment_index] != 0.0
        return np.where(hit.any(axis=1), hit.argmax(axis=1), len(self.segment_slots))

    def _stat_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"alpha": (self.n_segments,), "beta": (self.n_segments,)}

    def _prior_stats(self, mean: np.ndarray, strength: np.ndarray) -> dict[str, np.ndarray]:
        ones = np.ones((1, self.n_segments))
        return {"alpha": (strength * mean)[:, None] * ones, "beta": (strength * (1.0 - mean))[:, None] * ones}

    def _accumulate(
        self, slots: np.ndarray, starts: np.ndarray, counts: np.ndarray, X: np.ndarray, r: np.ndarray, w: np.ndarray
    ) -> None:
        success = np.clip(r, 0.0, 1.0)
        rows = (np.repeat(slots, counts), self.segments(X))
        np.add.at(self._arrays["alpha"], rows, w * success)
        np.add.at(self._arrays["beta"], rows, w * (1.0 - success))

    def _check_loaded(self, slots: np.ndarray) -> None:
        from learner.policies.errors import StateFormatError

        if (self._arrays["alpha"][slots] <= 0).any() or (self._arrays["beta"][slots] <= 0).any():
            raise StateFormatError("Beta parameters must be > 0")

    def _load_scoring_stack(self, slots: np.ndarray, arrays: Any) -> None:
        super()._load_scoring_stack(slots, arrays)
        self._check_loaded(slots)

    def _policy_probabilities(
        self, X: np.ndarray, slots: np.ndarray, block: Block | None, rng: np.random.Generator
    ) -> np.ndarray:
        seg = self.segments(X)
        a = self._arrays["alpha"][slots, seg]
        b = self._arrays["beta"][slots, seg]
        return argmax_frequencies(rng.beta(a, b, size=(self.n_draws, len(slots))))

    def _row_means(self, X: np.ndarray, slots: np.ndarray) -> np.ndarray:
        seg = self.segments(X)
        a = self._arrays["alpha"][slots, seg]
        return a / (a + self._arrays["beta"][slots, seg])

    def _drift(self, slot: int) -> Drift:
        a = self._arrays["alpha"][slot]
        b = self._arrays["beta"][slot]
        total = a + b
        return Drift(float((a * b / (total * total * (total + 1.0))).sum()), float(total.max()))

    @classmethod
    def _unit_test_params(cls) -> dict[str, Any]:
        return {"dim": 4, "eps0": 0.1, "seed": 0, "segment_slots": [1, 2], "n_draws": 64}
