"""Disjoint linear models explored by inverse-gap weighting (SquareCB), optimistically."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from learner.policies._detect import DriftDetection
from learner.policies._linear import LinearPolicy
from learner.policies._robust import RobustLearning
from learner.policies.base import Block


#: The optimism of a decision among ten candidates or fewer when ``alpha`` is not set.
ALPHA = 0.3
#: ... which grows as ``log10 K`` with K candidates, to this many times at a hundred or more.
ALPHA_GROWTH = 2.0
SQRT2 = math.sqrt(2.0)
#: An arm with fewer rows than this is new: it is drawn with probability at least
#: :data:`NEW_ARM_SHARE` times its posterior chance of beating the best score ("New arms" in
#: :class:`LinIGW`).
NEW_ARM_ROWS = 5
NEW_ARM_SHARE = 0.1


class LinIGW(RobustLearning, DriftDetection, LinearPolicy):
    """Inverse-gap weighting over optimistic per-arm ridge regressions (SquareCB, RegCB-style).

    For candidate k with row ``x_k`` and arm ``a``, the score is the model's prediction plus
    ``alpha`` times its width, ``s_k = x_k . theta_a + alpha * ||L_a^T x_k||`` (LinUCB's score;
    ``alpha = 0`` is the plain prediction, Foster & Rakhlin's SquareCB). With ``b`` the best
    score (the first of ties) and ``gamma_t = gamma_scale * t ** gamma_exponent``, ``t`` the rows
    learned by the policy so far (at least 1)::

        p_k = 1 / (K + gamma_t * (s_b - s_k))     for k != b
        p_b = 1 - fsum of the others

    so a candidate is explored in proportion to how little worse it looks, less and less as
    evidence accumulates. Optimism explores what the model has not seen yet (a new arm, a new
    region of the context space) at once, where plain SquareCB would wait for gamma_t's gaps to
    close. Every candidate keeps a positive probability without a floor, but as ``gamma_t``
    grows the ones far behind get 1e-4 and less, and a log of such propensities cannot rate a
    policy that differs from the one that decided (an importance weight of 1e4 on the row that
    drew one): the floor ``eps0`` defaults to 0.01 here, the smallest that kept the demo's
    off-policy ratings usable (effective sample size 33-43 of 2,000 rows against 6 without a
    floor), at a cost in regret (README, "Which policy"). The distribution is a closed form of
    the model: exact and deterministic (the same model and rows give the same probabilities,
    with no draws), which off-policy evaluation wants.

    **New arms.** Optimism alone can leave an arm that has almost no rows unplayed for good: its
    width is the prior's, ``alpha`` times it is short of a well-learned arm's score, and
    ``gamma_t`` grows with every row the *other* arms learn. ``benchmarks/regret.py``'s
    many_arms (100 arms, batches of 200), seed 8: the arm best on a fifth of the contexts, by 1.4
    where it is, had 2 rows (the first batch's) after 20,000, its score 1.0-1.7 under the chosen
    arm's 1.8-2.9, its probability 1e-4 (the floor); regret grew by 0.22 a step to the end (6,255
    in all). So a candidate whose arm has fewer than ``new_arm_rows`` rows gets at least
    ``new_arm_share`` times the chance, under its posterior, that its value beats the best score,
    and never more than a uniform choice's share::

        q_k = new_arm_share * Phi((mean_k - s_b) / width_k)      (arm with < new_arm_rows rows)
        p_k = max(1 / (K + gamma_t * (s_b - s_k)), min(q_k, 1 / K))

    (``Phi(x) = erfc(-x / sqrt 2) / 2``, in closed form as the rest: exact and deterministic).
    An arm far behind on a confident model is never new; one the first rows say little about is
    tried until they say more. On that seed, 2,605 regret; on many_arms over seeds 0-8, 3,422 to
    2,722 (no seed above 2,884); in batches of 200, ten arms or fewer (whose first batch gives
    every arm its rows) decided as before to the digit. At one update per event every stream's
    first rows meet it (``docs/policies.md`` has the suite: heavy_tail -22 %, wine
    +4.4 %). The defaults are left out of the policy's parameters (:meth:`get_params`), as
    robust learning's are, so an SDK from before new arms still decides with a default domain's
    snapshots (without the new arms' share: upgrade the SDKs to have it).

    **How optimistic.** Unset, ``alpha`` is :data:`ALPHA` (0.3) times ``log10 K`` for a decision
    among K candidates, clipped to [1, :data:`ALPHA_GROWTH`]: 0.3 up to ten candidates, 0.39 at
    twenty, 0.6 from a hundred on. With many arms each has few rows, and a model that exploits
    early locks onto the first that looked good: on ``benchmarks/regret.py``'s linear worlds
    (``lin_igw`` alone, T = 20,000, seeds 0-8 in batches of 200 and 0-5 at one update per
    event) the best fixed ``alpha`` was 0.3 at K = 10 and 0.45-1 at K = 30-300 (0.6-1 at one
    update per event, where no first batch is drawn uniformly). 100 arms, d = 5, one update per
    event: 7,203 regret at 0.3, 3,577 at 0.6, 2,420 at 1; in batches of 200: 4,051, 2,980,
    3,495. The cap keeps batches of 200 among 200 arms (d = 10) within 6 % of 0.3 (0.6: 8,415
    against 7,938), where one update per event gains 28 % (7,354 against 10,213). A number given
    is used at every K.

    Parameters: ``alpha`` (>= 0, default unset: above), ``gamma_scale`` (> 0, default 300) and
    ``gamma_exponent`` (>= 0, default 0.5), the defaults chosen by ``benchmarks/regret.py``
    (Vowpal Wabbit's ``--squarecb`` uses 10 and 0.5 with ``alpha = 0``);
    ``eps0`` (default 0.01, above); ``new_arm_rows`` (>= 0, default 5) and ``new_arm_share``
    (in [0, 1], default 0.1; 0 turns it off), above; ``detect``, ``detect_threshold``,
    ``detect_keep`` (change detection on each arm's residuals, on by default:
    :class:`~learner.policies._detect.DriftDetection`); ``huber_q`` (robust learning: 0.98 by
    default, 0 turns it off;
    :class:`~learner.policies._robust.RobustLearning`);
    ``refactor_every``, ``intercept_index`` (see :class:`~learner.policies._linear.LinearPolicy`); ``dim``,
    ``eps0``, ``gamma``, ``prior_mean``, ``prior_strength``, ``arm_priors``, ``seed`` (see
    :class:`~learner.policies.base.Policy`).

    >>> import numpy as np
    >>> from learner.policies import LinIGW
    >>> policy = LinIGW(dim=1, alpha=0.0, gamma_scale=10.0, gamma_exponent=0.0, eps0=0.0, prior_strength=1.0)
    >>> _ = policy.update_batch(np.ones((2, 1)), ["good", "poor"], [1.0, 0.0])   # theta 0.5 and 0
    >>> policy.probabilities(np.ones((2, 1)), ["good", "poor"]).probabilities.round(12).tolist()   # 1/(2 + 10 * 0.5)
    [0.857142857143, 0.142857142857]

    References: D. J. Foster, A. Rakhlin (2020), "Beyond UCB: optimal and efficient contextual
    bandits with regression oracles", ICML 2020; A. Bietti, A. Agarwal, J. Langford (2021), "A
    contextual bandit bake-off", JMLR 22.
    """

    name = "lin_igw"

    def __init__(
        self, dim: int, *, alpha: float | None = None, gamma_scale: float = 300.0, gamma_exponent: float = 0.5,
        eps0: float = 0.01, new_arm_rows: int = NEW_ARM_ROWS, new_arm_share: float = NEW_ARM_SHARE, **kwargs: Any,
    ) -> None:  # fmt: skip
        number = isinstance(alpha, (int, float)) and not isinstance(alpha, bool)
        if alpha is not None and not (number and alpha >= 0.0 and np.isfinite(alpha)):
            raise ValueError(f"alpha must be a finite number >= 0 (or unset: by the number of candidates), got {alpha!r}")
        if not (gamma_scale > 0.0 and np.isfinite(gamma_scale)):
            raise ValueError(f"gamma_scale must be finite and > 0, got {gamma_scale!r}")
        if not (gamma_exponent >= 0.0 and np.isfinite(gamma_exponent)):
            raise ValueError(f"gamma_exponent must be finite and >= 0, got {gamma_exponent!r}")
        if isinstance(new_arm_rows, bool) or not isinstance(new_arm_rows, int) or new_arm_rows < 0:
            raise ValueError(f"new_arm_rows must be an int >= 0, got {new_arm_rows!r}")
        if isinstance(new_arm_share, bool) or not (isinstance(new_arm_share, (int, float)) and 0.0 <= new_arm_share <= 1.0):
            raise ValueError(f"new_arm_share must be a number in [0, 1], got {new_arm_share!r}")
        self.new_arm_rows = new_arm_rows
        self.new_arm_share = float(new_arm_share)
        self.gamma_scale = float(gamma_scale)
        self.gamma_exponent = float(gamma_exponent)
        self.alpha = None if alpha is None else float(alpha)
        super().__init__(dim, eps0=eps0, **kwargs)

    def get_params(self) -> dict[str, Any]:
        params = super().get_params()
        for name, default in (("new_arm_rows", NEW_ARM_ROWS), ("new_arm_share", NEW_ARM_SHARE)):
            if params[name] == default:  # left out, so an SDK from before new arms loads the snapshot
                del params[name]
        return params

    def alpha_for(self, K: int) -> float:
        """The optimism for a decision among ``K`` candidates: ``alpha`` when set, otherwise
        :data:`ALPHA` times ``log10 K`` clipped to [1, :data:`ALPHA_GROWTH`] (0.3 up to ten
        candidates, 0.6 from a hundred)."""
        if self.alpha is not None:
            return self.alpha
        return ALPHA * min(ALPHA_GROWTH, max(1.0, math.log10(max(K, 1))))

    def learning_rate(self) -> float:
        """``gamma_t`` for the rows learned so far."""
        rows = int(self._arrays["count"][: len(self._arms)].sum()) if self._arms else 0
        return self.gamma_scale * max(rows, 1) ** self.gamma_exponent

    def _policy_probabilities(
        self, X: np.ndarray, slots: np.ndarray, block: Block | None, rng: np.random.Generator
    ) -> np.ndarray:
        mean, width = self._mean_width(X, slots, block)
        score = mean + self.alpha_for(len(mean)) * width
        best = int(np.argmax(score))
        K = len(score)
        p = 1.0 / (K + self.learning_rate() * (score[best] - score))
        if self.new_arm_share > 0.0:
            self._new_arm_floor(p, mean, width, score[best], slots)
        p[best] = 0.0
        p[best] = 1.0 - math.fsum(p.tolist())  # correctly rounded: the compiled path sums the same
        return p

    def _new_arm_floor(self, p: np.ndarray, mean: np.ndarray, width: np.ndarray, top: float, slots: np.ndarray) -> None:
        """Raise the new arms' probabilities in ``p`` to ``min(q_k, 1 / K)`` ("New arms"), with
        the compiled path's operations."""
        cap = 1.0 / len(p)
        share = self.new_arm_share
        for k in np.flatnonzero(self._arrays["count"][slots] < self.new_arm_rows).tolist():
            w = float(width[k])
            if w > 0.0:  # a NaN or zero width leaves the arm as inverse-gap weighting has it
                q = share * (0.5 * math.erfc((top - float(mean[k])) / (w * SQRT2)))
                q = q if q < cap else cap
                if q > p[k]:
                    p[k] = q

    def _compiled_rule(self, K: int, rng: np.random.Generator) -> tuple[float, None, int, float]:
        return self.alpha_for(K), None, 0, self.learning_rate()

    def _new_arm_rule(self) -> tuple[int, float]:
        return self.new_arm_rows, self.new_arm_share

    @classmethod
    def _unit_test_params(cls) -> dict[str, Any]:
        return {**super()._unit_test_params(), "gamma_scale": 10.0, "alpha": 0.5}
