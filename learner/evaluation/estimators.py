"""Off-policy estimators of a policy's value from a log another policy collected.

Every estimator here is the standard one as Open Bandit Pipeline (OBP) defines it, on OBP's
arrays without the position axis (see :mod:`learner.evaluation._inputs`). With the importance
weight ``w_i = pi_e(a_i | x_i) / pi_b(a_i | x_i)`` (``action_dist[i, action[i]] / pscore[i]``),
the model's value of the evaluated policy ``q(x_i, pi_e) = sum_k pi_e(k | x_i) q(x_i, k)`` and of
the logged action ``q(x_i, a_i)``:

============  ==================================================================================
``ips``       ``1/n sum_i min(w_i, clip) r_i``
``snips``     ``sum_i w_i r_i / sum_i w_i``
``dm``        ``1/n sum_i q(x_i, pi_e)``
``dr``        ``1/n sum_i [q(x_i, pi_e) + min(w_i, clip) (r_i - q(x_i, a_i))]``
``sndr``      ``1/n sum_i q(x_i, pi_e) + sum_i w_i (r_i - q(x_i, a_i)) / sum_i w_i``
``switch_dr`` ``1/n sum_i [q(x_i, pi_e) + 1{w_i <= tau} w_i (r_i - q(x_i, a_i))]``
``dros``      ``1/n sum_i [q(x_i, pi_e) + shrinkage w_i / (w_i^2 + shrinkage) w_i (r_i - q(x_i, a_i))]``
============  ==================================================================================

Each estimator splits its estimate into per-row :class:`Terms`,
``estimate = mean(base) + mean(correction) / mean(normalizer)``, where only the self-normalised
ones (SNIPS, SNDR) have a normalizer (their weights). Intervals resample those terms (so a
bootstrap re-normalises within each resample) and custom reductions start from them.
:meth:`Estimator.rows` gives the (n,) array whose plain mean is the estimate (OBP's
``_estimate_round_rewards``: for the self-normalised ones, each row's correction divided by the
full log's mean weight).

One convention where OBP returns NaN: when every weight on the log is 0 (the evaluated policy
never takes a logged action), the self-normalised correction ``0 / 0`` is taken as 0, so SNIPS
reports 0 as IPS does and SNDR reports DM as DR does; the diagnostics (ESS 0, zero-weight share
1) and :class:`~learner.evaluation.errors.LowESSWarning` then say that the log carries no evidence.

    >>> import numpy as np
    >>> reward = np.array([1.0, 0.0, 1.0, 1.0])
    >>> action = np.array([0, 1, 1, 0])
    >>> pscore = np.array([0.5, 0.5, 0.5, 0.5])
    >>> always_0 = np.array([[1.0, 0.0]] * 4)              # the policy "always action 0"
    >>> IPS().estimate(reward, action, pscore, always_0)    # (2*1 + 0 + 0 + 2*1) / 4
    1.0
    >>> make_estimator("dr").estimate(reward, action, pscore, always_0, np.full((4, 2), 0.5))
    1.0
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike

from learner.evaluation._inputs import LoggedArrays, check_inputs
from learner.evaluation.errors import InvalidInputError

__all__ = ["DM", "DR", "DRos", "ESTIMATORS", "IPS", "SNDR", "SNIPS", "Estimator", "SwitchDR", "Terms", "make_estimator"]


def _ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, with 0 / 0 (no weight at all) taken as 0."""
    return numerator / denominator if denominator != 0.0 else 0.0


def _frozen(array: np.ndarray | None) -> np.ndarray | None:
    """A read-only view (the caller's array itself stays writeable)."""
    if array is None:
        return None
    view = np.asarray(array, dtype=np.float64).view()
    view.setflags(write=False)
    return view


class Terms:
    """Per-row terms of one estimate: ``mean(base) + mean(correction) / mean(normalizer)``.

    Each part is an (n,) array or None (a missing base or correction counts 0, a missing
    normalizer 1). Plain-mean estimators carry everything in ``base``; SNIPS has
    ``correction = w r`` and ``normalizer = w``; SNDR adds ``base = q(x, pi_e)`` and
    ``correction = w (r - q(x, a))``. The arrays are read-only.

        >>> t = Terms(None, np.array([2.0, 0.0, 4.0]), np.array([2.0, 0.0, 2.0]))
        >>> t.value(), t.rows().tolist()           # SNIPS: (2 + 4) / (2 + 2); rows divide by mean(w) = 4/3
        (1.5, [1.5, 0.0, 3.0])
    """

    __slots__ = ("base", "correction", "normalizer", "n")

    def __init__(
        self, base: np.ndarray | None, correction: np.ndarray | None = None, normalizer: np.ndarray | None = None
    ) -> None:
        parts = [p for p in (base, correction, normalizer) if p is not None]
        if not parts:
            raise InvalidInputError("Terms need at least one of base, correction")
        if normalizer is not None and correction is None:
            raise InvalidInputError("a normalizer needs a correction to normalise")
        self.n = parts[0].shape[0]
        if any(p.shape != (self.n,) for p in parts):
            raise InvalidInputError(f"every part must have shape ({self.n},), got {[p.shape for p in parts]}")
        self.base = _frozen(base)
        self.correction = _frozen(correction)
        self.normalizer = _frozen(normalizer)

    @property
    def self_normalized(self) -> bool:
        return self.normalizer is not None

    def value(self) -> float:
        """The estimate these terms reduce to."""
        value = 0.0 if self.base is None else float(self.base.mean())
        if self.correction is not None:
            mean = float(self.correction.mean())
            value += mean if self.normalizer is None else _ratio(mean, float(self.normalizer.mean()))
        return value

    def rows(self) -> np.ndarray:
        """(n,) per-row terms whose plain mean is the estimate (OBP's round rewards): for the
        self-normalised ones each correction is divided by the full log's mean normalizer."""
        if self.correction is None:
            assert self.base is not None
            return self.base.copy()
        scale = 1.0 if self.normalizer is None else _ratio(1.0, float(self.normalizer.mean()))
        out = self.correction * scale
        if self.base is not None:
            out += self.base
        return out

    def influence(self) -> np.ndarray:
        """(n,) each row's first-order contribution ``psi_i`` to the estimate's error, so that
        ``var(estimate) ~= sum(psi^2) / (n (n - 1))``.

        Plain means: ``psi_i = rows_i - estimate``. Self-normalised (the delta method on
        ``B + C / N`` at the sample means): ``psi_i = (b_i - B) + (c_i - (C / N) w_i) / N``.
        Both sum to 0.
        """
        if self.normalizer is None:
            rows = self.rows()
            return rows - rows.mean()
        psi = np.zeros(self.n) if self.base is None else self.base - self.base.mean()
        mean_n = float(self.normalizer.mean())
        if mean_n != 0.0:
            assert self.correction is not None
            ratio = float(self.correction.mean()) / mean_n
            psi += (self.correction - ratio * self.normalizer) / mean_n
        return psi


def _check_param(owner: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidInputError(f"{owner} {name} must be a number, got {value!r}")
    value = float(value)
    if math.isnan(value) or value < 0.0:
        raise InvalidInputError(f"{owner} {name} must be >= 0 (inf: off), got {value}")
    return value


class Estimator(ABC):
    """Base of the estimators: validation at the boundary, then :meth:`_terms` on trusted arrays.

    Every estimator takes the same arrays, in OBP's order and names, so one log runs through any
    list of them; ``estimated_rewards`` is required by the model-based ones (:attr:`uses_model`)
    and ignored by the others.
    """

    #: registry name (:data:`ESTIMATORS`), also the ``estimator`` of an :class:`~learner.evaluation.intervals.Estimate`
    name: ClassVar[str]
    #: whether ``estimated_rewards`` (a reward model's (n, K) predictions) is required
    uses_model: ClassVar[bool] = False
    #: whether the estimate is a ratio of means rather than a plain mean of per-row terms
    self_normalized: ClassVar[bool] = False

    def terms(
        self,
        reward: ArrayLike,
        action: ArrayLike,
        pscore: ArrayLike,
        action_dist: ArrayLike,
        estimated_rewards: ArrayLike | None = None,
    ) -> Terms:
        """The per-row :class:`Terms` of the estimate on this log (inputs validated)."""
        return self._terms(self.check(reward, action, pscore, action_dist, estimated_rewards))

    def rows(
        self,
        reward: ArrayLike,
        action: ArrayLike,
        pscore: ArrayLike,
        action_dist: ArrayLike,
        estimated_rewards: ArrayLike | None = None,
    ) -> np.ndarray:
        """(n,) per-row terms whose plain mean is the estimate (see :meth:`Terms.rows`)."""
        return self.terms(reward, action, pscore, action_dist, estimated_rewards).rows()

    def estimate(
        self,
        reward: ArrayLike,
        action: ArrayLike,
        pscore: ArrayLike,
        action_dist: ArrayLike,
        estimated_rewards: ArrayLike | None = None,
    ) -> float:
        """The estimated value of the policy ``action_dist`` describes, on this log."""
        return self.terms(reward, action, pscore, action_dist, estimated_rewards).value()

    def check(
        self,
        reward: ArrayLike,
        action: ArrayLike,
        pscore: ArrayLike,
        action_dist: ArrayLike,
        estimated_rewards: ArrayLike | None = None,
    ) -> LoggedArrays:
        """Validate a log for this estimator (see :func:`~learner.evaluation._inputs.check_inputs`)."""
        return check_inputs(
            reward, action, pscore, action_dist, estimated_rewards if self.uses_model else None,
            need_model=self.uses_model, who=type(self).__name__,
        )  # fmt: skip

    @abstractmethod
    def _terms(self, data: LoggedArrays) -> Terms:
        """The terms on a validated log."""


@dataclass(frozen=True)
class IPS(Estimator):
    """Inverse propensity scoring (Horvitz-Thompson), with optional weight clipping.

    ``V = 1/n sum_i min(w_i, clip) r_i`` with ``w_i = pi_e(a_i | x_i) / pi_b(a_i | x_i)``.

    Unbiased when the logged propensities are right and the evaluated policy only takes actions
    the logging policy could take; its variance grows with the weights. Clipping at ``clip``
    (lambda in the papers, OBP's ``lambda_``) trades a downward bias for less variance.

    Parameters: ``clip`` >= 0, the largest weight kept (``inf``, the default: no clipping).

        >>> import numpy as np
        >>> reward, action, pscore = [1.0, 0.0, 1.0], [0, 1, 1], [0.2, 0.5, 0.5]
        >>> target = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
        >>> IPS().estimate(reward, action, pscore, target)             # (5*1 + 2*0 + 1*1) / 3
        2.0
        >>> IPS(clip=2.0).estimate(reward, action, pscore, target)     # (2*1 + 2*0 + 1*1) / 3
        1.0

    References: D. G. Horvitz and D. J. Thompson, "A Generalization of Sampling Without Replacement
    from a Finite Universe", JASA 1952; M. Dudík, D. Erhan, J. Langford and L. Li, "Doubly Robust
    Policy Evaluation and Optimization", Statistical Science 2014; Y. Su, M. Dimakopoulou,
    A. Krishnamurthy and M. Dudík, "Doubly Robust Off-Policy Evaluation with Shrinkage", ICML 2020.
    """

    clip: float = math.inf
    name: ClassVar[str] = "ips"

    def __post_init__(self) -> None:
        object.__setattr__(self, "clip", _check_param("IPS", "clip", self.clip))

    def _terms(self, data: LoggedArrays) -> Terms:
        w = data.weights if self.clip == math.inf else np.minimum(data.weights, self.clip)
        return Terms(w * data.reward)


@dataclass(frozen=True)
class SNIPS(Estimator):
    """Self-normalised inverse propensity scoring.

    ``V = sum_i w_i r_i / sum_i w_i``: IPS divided by the mean weight, whose expectation is 1.
    Biased (by O(1/n)) but consistent, always within the range of the observed rewards, and far
    less variable than IPS when the weights are large. With every weight 0 it reports 0 (see the
    module's note).

        >>> import numpy as np
        >>> reward, action, pscore = [1.0, 0.0, 1.0], [0, 1, 1], [0.2, 0.5, 0.5]
        >>> target = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
        >>> SNIPS().estimate(reward, action, pscore, target)           # (5 + 0 + 1) / (5 + 2 + 1)
        0.75

    References: A. Swaminathan and T. Joachims, "The Self-Normalized Estimator for Counterfactual
    Learning", NeurIPS 2015; M. Dudík et al., Statistical Science 2014.
    """

    name: ClassVar[str] = "snips"
    self_normalized: ClassVar[bool] = True

    def _terms(self, data: LoggedArrays) -> Terms:
        w = data.weights
        return Terms(None, w * data.reward, w)


@dataclass(frozen=True)
class DM(Estimator):
    """Direct method: the reward model's value of the evaluated policy, no weights at all.

    ``V = 1/n sum_i sum_k pi_e(k | x_i) q(x_i, k)`` with ``q = estimated_rewards``. Low variance,
    but as biased as the reward model is wrong; ``reward``, ``action`` and ``pscore`` are only
    validated (the diagnostics still read the weights they imply).

        >>> import numpy as np
        >>> q = np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3]])
        >>> target = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
        >>> round(DM().estimate([1.0, 0.0, 1.0], [0, 1, 1], [0.2, 0.5, 0.5], target, q), 12)   # (0.9 + 0.2 + 0.5) / 3
        0.533333333333

    References: M. Dudík et al., "Doubly Robust Policy Evaluation and Optimization", Statistical
    Science 2014 (the direct method as the baseline DR corrects).
    """

    name: ClassVar[str] = "dm"
    uses_model: ClassVar[bool] = True

    def _terms(self, data: LoggedArrays) -> Terms:
        return Terms(data.q_target)


@dataclass(frozen=True)
class DR(Estimator):
    """Doubly robust: the direct method plus an importance-weighted correction of its error.

    ``V = 1/n sum_i [q(x_i, pi_e) + min(w_i, clip) (r_i - q(x_i, a_i))]``. Unbiased when the
    propensities are right (whatever the model), and consistent when the model is right (whatever
    the propensities); its variance is IPS's with the rewards replaced by the model's residuals.
    ``clip`` (OBP's ``lambda_``; DR with pessimistic shrinkage in Su et al. 2020) caps the weights.

        >>> import numpy as np
        >>> q = np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3]])
        >>> target = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
        >>> # rows: 0.9 + 5 (1 - 0.9) = 1.4; 0.2 + 2 (0 - 0.2) = -0.2; 0.5 + 1 (1 - 0.3) = 1.2
        >>> round(DR().estimate([1.0, 0.0, 1.0], [0, 1, 1], [0.2, 0.5, 0.5], target, q), 12)
        0.8

    References: M. Dudík, D. Erhan, J. Langford and L. Li, "Doubly Robust Policy Evaluation and
    Optimization", Statistical Science 2014; Y. Su et al., "Doubly Robust Off-Policy Evaluation
    with Shrinkage", ICML 2020.
    """

    clip: float = math.inf
    name: ClassVar[str] = "dr"
    uses_model: ClassVar[bool] = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "clip", _check_param("DR", "clip", self.clip))

    def _terms(self, data: LoggedArrays) -> Terms:
        w = data.weights if self.clip == math.inf else np.minimum(data.weights, self.clip)
        return Terms(data.q_target + w * (data.reward - data.q_logged))


@dataclass(frozen=True)
class SNDR(Estimator):
    """Self-normalised doubly robust: DR whose correction is divided by the mean weight.

    ``V = 1/n sum_i q(x_i, pi_e) + sum_i w_i (r_i - q(x_i, a_i)) / sum_i w_i``. With every
    weight 0 it reports DM (see the module's note).

        >>> import numpy as np
        >>> q = np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3]])
        >>> target = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
        >>> # DM 1.6/3, corrections 5*0.1 + 2*(-0.2) + 1*0.7 = 0.8 over weights 5 + 2 + 1 = 8
        >>> round(SNDR().estimate([1.0, 0.0, 1.0], [0, 1, 1], [0.2, 0.5, 0.5], target, q), 12)
        0.633333333333

    References: M. Dudík et al., Statistical Science 2014; A. Swaminathan and T. Joachims,
    "The Self-Normalized Estimator for Counterfactual Learning", NeurIPS 2015; N. Kallus and
    M. Uehara, "Intrinsically Efficient, Stable, and Bounded Off-Policy Evaluation for
    Reinforcement Learning", NeurIPS 2019.
    """

    name: ClassVar[str] = "sndr"
    uses_model: ClassVar[bool] = True
    self_normalized: ClassVar[bool] = True

    def _terms(self, data: LoggedArrays) -> Terms:
        w = data.weights
        return Terms(data.q_target, w * (data.reward - data.q_logged), w)


@dataclass(frozen=True)
class SwitchDR(Estimator):
    """Switch doubly robust: DR on rows whose weight is at most ``tau``, DM on the others.

    ``V = 1/n sum_i [q(x_i, pi_e) + 1{w_i <= tau} w_i (r_i - q(x_i, a_i))]``. ``tau`` >= 0 is the
    switching threshold (OBP's ``lambda_``, ``tau`` before OBP 0.5): ``inf`` gives DR, 0 gives
    DM on every row the target gives weight.

        >>> import numpy as np
        >>> q = np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3]])
        >>> target = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
        >>> # the weight-5 row keeps its DM term 0.9: (0.9 - 0.2 + 1.2) / 3
        >>> round(SwitchDR(tau=2.0).estimate([1.0, 0.0, 1.0], [0, 1, 1], [0.2, 0.5, 0.5], target, q), 12)
        0.633333333333

    References: Y.-X. Wang, A. Agarwal and M. Dudík, "Optimal and Adaptive Off-policy Evaluation
    in Contextual Bandits", ICML 2017; M. Dudík et al., Statistical Science 2014.
    """

    tau: float = math.inf
    name: ClassVar[str] = "switch_dr"
    uses_model: ClassVar[bool] = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "tau", _check_param("SwitchDR", "tau", self.tau))

    def _terms(self, data: LoggedArrays) -> Terms:
        w = data.weights
        kept = np.where(w <= self.tau, w, 0.0)
        return Terms(data.q_target + kept * (data.reward - data.q_logged))


@dataclass(frozen=True)
class DRos(Estimator):
    """Doubly robust with optimistic shrinkage of the weights.

    ``V = 1/n sum_i [q(x_i, pi_e) + w~_i (r_i - q(x_i, a_i))]`` with
    ``w~_i = shrinkage w_i / (w_i^2 + shrinkage)``, the weight that minimises a bound on the mean
    squared error (Su et al. 2020). ``shrinkage`` is their lambda >= 0 (OBP's ``lambda_``);
    it has no neutral default: 0 gives DM (w~ = 0; OBP's formula is 0/0 on zero weights there),
    ``inf`` gives DR, and in between large weights shrink the most.

        >>> import numpy as np
        >>> q = np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3]])
        >>> target = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
        >>> # w~ = 5*5/(25+5) = 5/6, 5*2/(4+5) = 10/9, 5*1/(1+5) = 5/6
        >>> # rows: 0.9 + (5/6)(0.1); 0.2 + (10/9)(-0.2); 0.5 + (5/6)(0.7); sum 2.0444.../3
        >>> round(DRos(shrinkage=5.0).estimate([1.0, 0.0, 1.0], [0, 1, 1], [0.2, 0.5, 0.5], target, q), 12)
        0.681481481481

    References: Y. Su, M. Dimakopoulou, A. Krishnamurthy and M. Dudík, "Doubly Robust Off-Policy
    Evaluation with Shrinkage", ICML 2020; M. Dudík et al., Statistical Science 2014.
    """

    shrinkage: float
    name: ClassVar[str] = "dros"
    uses_model: ClassVar[bool] = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "shrinkage", _check_param("DRos", "shrinkage", self.shrinkage))

    def _terms(self, data: LoggedArrays) -> Terms:
        w = data.weights
        lam = self.shrinkage
        if lam == math.inf:
            shrunk = w
        elif lam == 0.0:
            shrunk = np.zeros_like(w)
        else:
            shrunk = lam * w / (w * w + lam)
        return Terms(data.q_target + shrunk * (data.reward - data.q_logged))


#: Every estimator by its registry name (what ``--estimators`` and a promotion config name).
ESTIMATORS: dict[str, type[Estimator]] = {cls.name: cls for cls in (IPS, SNIPS, DM, DR, SNDR, SwitchDR, DRos)}


def make_estimator(name: str, **params: Any) -> Estimator:
    """An estimator by registry name, e.g. ``make_estimator("switch_dr", tau=20)``.

        >>> make_estimator("ips", clip=50)
        IPS(clip=50.0)
    """
    try:
        cls = ESTIMATORS[name]
    except KeyError:
        raise InvalidInputError(f"unknown estimator {name!r}; known: {', '.join(sorted(ESTIMATORS))}") from None
    try:
        return cls(**params)
    except TypeError as exc:  # a missing or unknown parameter
        raise InvalidInputError(f"estimator {name!r}: {exc}") from None
