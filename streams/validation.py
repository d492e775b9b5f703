"""Validation of events at the boundary: what a service emits and what a worker consumes.

The checks run per event in the SDK's ``decide`` path and in the join worker, so they are
plain loops over small maps with ``math.isfinite``; the inside of the system trusts what
passed them. Each method raises the first problem found, in a fixed order, as a typed
:class:`~streams.errors.ValidationError` naming the field and the value, and returns the
event unchanged when it is valid.

Decision checks, in order:

1. ``event_id`` is a non-empty string                        (:class:`MissingEventId`)
2. ``domain`` is configured, when domains are configured      (:class:`UnknownDomain`)
3. ``actions`` is not empty, nor longer than the domain allows
   (:class:`EmptyActions`, :class:`TooManyActions`)
4. one probability per action                                  (:class:`ProbabilityCountMismatch`)
5. ``chosen`` (and ``recommended`` unless -1) index an action  (:class:`ChosenOutOfRange`)
6. each probability is finite and not negative, and
   ``|sum(p) - 1| <= probability_tolerance``
   (:class:`NonFiniteValue`, :class:`NegativeProbability`, :class:`ProbabilitiesDoNotSumToOne`)
7. context features, then each action's features: numeric values finite, ``vector``
   empty or of the domain's ``vector_dim``, its elements finite
   (:class:`NonFiniteFeature`, :class:`WrongDimension`)
8. the encoded size, when the caller passes it                (:class:`OversizePayload`)

    >>> v = Validator(ValidationLimits(domains={"llm_routing": DomainLimits(vector_dim=2)}))
    >>> event = {"event_id": "e1", "domain": "llm_routing",
    ...          "context": {"numeric": {"prompt_len": float("nan")}},
    ...          "actions": [{"id": "a"}, {"id": "b"}], "chosen": 0, "probabilities": [0.5, 0.5]}
    >>> v.validate_decision(event)
    Traceback (most recent call last):
    ...
    streams.errors.NonFiniteFeature: context.numeric['prompt_len'] is nan; features must be finite
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from streams.errors import (
    ChosenOutOfRange,
    EmptyActions,
    MissingEventId,
    MissingRewardId,
    NegativeProbability,
    NonFiniteFeature,
    NonFiniteValue,
    OversizePayload,
    ProbabilitiesDoNotSumToOne,
    ProbabilityCountMismatch,
    TooManyActions,
    UnknownDomain,
    WrongDimension,
)

__all__ = ["DomainLimits", "ValidationLimits", "Validator"]

_isfinite = math.isfinite


@dataclass(frozen=True, slots=True)
class DomainLimits:
    """What one domain accepts. ``None`` means no limit."""

    #: Length of every non-empty ``vector`` (context and action features).
    vector_dim: int | None = None
    #: Most candidates a decision may carry.
    max_actions: int | None = None


@dataclass(frozen=True, slots=True)
class ValidationLimits:
    """The validator's configuration: one small frozen value, built once from settings."""

    #: Known domains and their limits; ``None`` accepts any domain without limits.
    domains: Mapping[str, DomainLimits] | None = None
    #: Allowed ``|sum(probabilities) - 1|``.
    probability_tolerance: float = 1e-6
    #: Largest encoded event, in bytes (framing included).
    max_payload_bytes: int = 1_000_000

    def __post_init__(self) -> None:
        if not self.probability_tolerance >= 0:
            raise ValueError(f"probability_tolerance must be >= 0, not {self.probability_tolerance}")
        if self.max_payload_bytes < 1:
            raise ValueError(f"max_payload_bytes must be positive, not {self.max_payload_bytes}")
        if self.domains is not None:  # a read-only copy: the caller's dict cannot change it later
            object.__setattr__(self, "domains", MappingProxyType(dict(self.domains)))


_NO_LIMITS = DomainLimits()


class Validator:
    """Checks decisions, rewards and updates against :class:`ValidationLimits`."""

    def __init__(self, limits: ValidationLimits | None = None) -> None:
        self.limits = limits if limits is not None else ValidationLimits()
        self._domains = self.limits.domains
        self._tolerance = self.limits.probability_tolerance
        self._max_bytes = self.limits.max_payload_bytes

    # -- shared pieces -------------------------------------------------------------------

    def validate_size(self, nbytes: int) -> None:
        """Raise :class:`OversizePayload` if an encoded event of ``nbytes`` is too large."""
        if nbytes > self._max_bytes:
            raise OversizePayload("payload", nbytes, f"encoded bytes exceed the limit of {self._max_bytes}")

    def _domain(self, event: Mapping[str, Any]) -> DomainLimits:
        domain = event.get("domain")
        if self._domains is None:
            return _NO_LIMITS
        limits = self._domains.get(domain) if isinstance(domain, str) else None
        if limits is None:
            known = ", ".join(sorted(self._domains)) or "none"
            raise UnknownDomain("domain", domain, f"not a configured domain (known: {known})")
        return limits

    @staticmethod
    def _event_id(event: Mapping[str, Any]) -> None:
        event_id = event.get("event_id")
        if type(event_id) is not str or not event_id.strip():
            raise MissingEventId("event_id", event_id, "every event needs a non-empty string id")

    # -- decisions -----------------------------------------------------------------------

    def validate_decision(self, event: Mapping[str, Any], *, encoded_size: int | None = None) -> Mapping[str, Any]:
        """Return ``event`` if it is a valid DecisionEvent, else raise the first problem."""
        self._event_id(event)
        limits = self._domain(event)

        actions = event.get("actions")
        if not actions:
            raise EmptyActions("actions", actions, "a decision needs at least one candidate")
        n = len(actions)
        if limits.max_actions is not None and n > limits.max_actions:
            raise TooManyActions("len(actions)", n, f"the domain allows at most {limits.max_actions} candidates")

        probabilities = event.get("probabilities")
        count = None if probabilities is None else len(probabilities)
        if count != n:
            raise ProbabilityCountMismatch("len(probabilities)", count, f"one probability per action expected ({n} actions)")
        _check_index(event.get("chosen"), "chosen", n, "must index one of the actions")
        recommended = event.get("recommended", -1)
        if recommended != -1:
            _check_index(recommended, "recommended", n, "must index one of the actions, or be -1")
        self._check_distribution(probabilities)

        dim = limits.vector_dim
        context = event.get("context")
        if context:
            _check_features(context, dim, None)
        for i, action in enumerate(actions):
            features = action.get("features")
            if features:
                _check_features(features, dim, i)

        if encoded_size is not None:
            self.validate_size(encoded_size)
        return event

    def _check_distribution(self, probabilities: Sequence[float], name: str = "probabilities") -> None:
        try:
            total = sum(probabilities)
        except TypeError:
            total = math.nan
        if not _isfinite(total) or min(probabilities) < 0:
            for i, p in enumerate(probabilities):
                if not _is_finite_number(p):
                    raise NonFiniteValue(f"{name}[{i}]", p, "probabilities must be finite numbers")
                if p < 0:
                    raise NegativeProbability(f"{name}[{i}]", p, "probabilities must not be negative")
        if not abs(total - 1.0) <= self._tolerance:
            raise ProbabilitiesDoNotSumToOne(
                f"sum({name})", total, f"must be 1 within {self._tolerance:g} ({name}: {_short(probabilities)})"
            )

    # -- rewards -------------------------------------------------------------------------

    def validate_reward(self, event: Mapping[str, Any], *, encoded_size: int | None = None) -> Mapping[str, Any]:
        """Return ``event`` if it is a valid RewardEvent, else raise the first problem.

        Order: ``event_id``, ``reward_id``, ``domain``, ``signals`` finite, ``value`` finite
        (or absent), encoded size.
        """
        self._event_id(event)
        reward_id = event.get("reward_id")
        if type(reward_id) is not str or not reward_id.strip():
            raise MissingRewardId("reward_id", reward_id, "every reward needs a non-empty string id")
        self._domain(event)
        signals = event.get("signals")
        if signals:
            _check_finite_map(signals, "signals", NonFiniteValue, "signals must be finite")
        value = event.get("value")
        if value is not None and not _is_finite_number(value):
            raise NonFiniteValue("value", value, "a reward value must be a finite number")
        if encoded_size is not None:
            self.validate_size(encoded_size)
        return event

    # -- updates -------------------------------------------------------------------------

    def validate_update(self, event: Mapping[str, Any], *, encoded_size: int | None = None) -> Mapping[str, Any]:
        """Return ``event`` if it is a valid UpdateEvent, else raise the first problem.

        Order: ``event_id``, ``domain``, ``probabilities`` one per action, ``arm_index``
        within the actions (when they are listed), ``probability`` finite and in [0, 1],
        the logged distribution (when given), ``features`` finite, ``reward``, ``weight`` and
        ``signals`` finite, encoded size. The feature vector is the hashed one, whose length
        is the model's, not the domain's ``vector_dim``, so it is not checked here.
        """
        self._event_id(event)
        self._domain(event)
        actions = event.get("actions") or ()
        probabilities = event.get("probabilities") or ()
        n = len(actions)
        if probabilities and len(probabilities) != n:
            raise ProbabilityCountMismatch(
                "len(probabilities)", len(probabilities), f"one probability per action expected ({n} actions)"
            )
        if n:
            _check_index(event.get("arm_index"), "arm_index", n, "must index one of the actions")
        probability = event.get("probability")
        if not _is_finite_number(probability):
            raise NonFiniteValue("probability", probability, "the acted action's probability must be a finite number")
        if probability < 0:
            raise NegativeProbability("probability", probability, "probabilities must not be negative")
        if probabilities:
            self._check_distribution(probabilities)
        features = event.get("features")
        if features is not None and len(features):
            _check_vector(features, None, "features")
        for name in ("reward", "weight"):
            if name in event and not _is_finite_number(event[name]):
                raise NonFiniteValue(name, event[name], f"{name} must be a finite number")
        signals = event.get("signals")
        if signals:
            _check_finite_map(signals, "signals", NonFiniteValue, "signals must be finite")
        if encoded_size is not None:
            self.validate_size(encoded_size)
        return event


# -- helpers ---------------------------------------------------------------------------------


def _is_finite_number(value: Any) -> bool:
    try:
        return _isfinite(value)
    except TypeError:  # str, None, containers: not a number at all
        return False


def _check_index(index: Any, name: str, n: int, explanation: str) -> None:
    if type(index) is not int or not 0 <= index < n:
        raise ChosenOutOfRange(name, index, f"{explanation} (0..{n - 1})")


def _all_finite(values: Any) -> bool:
    """True when every element is a finite number; cheap for the valid case.

    ``sum()`` is finite exactly when every element is (NaN and inf propagate), so a valid
    input costs one C-level pass; only a non-finite or non-numeric sum makes callers walk
    the values to name the culprit (an overflow of finite values walks and finds none).
    """
    try:
        return _isfinite(sum(values))
    except TypeError:
        return False


def _check_finite_map(values: Mapping[str, Any], path: str, error: type, explanation: str) -> None:
    if _all_finite(values.values()):
        return
    for key, value in values.items():
        if not _is_finite_number(value):
            raise error(f"{path}[{key!r}]", value, explanation)


def _features_path(action: int | None) -> str:
    return "context" if action is None else f"actions[{action}].features"


def _check_vector(vector: Any, dim: int | None, path: str) -> None:
    if dim is not None and len(vector) != dim:
        raise WrongDimension(f"len({path})", len(vector), f"the domain's vector dimension is {dim}")
    if type(vector) is not list and hasattr(vector, "dtype"):  # numpy array: vectorised check
        import numpy as np

        finite = np.isfinite(vector)
        if finite.all():
            return
        i = int(np.argmin(finite))
        raise NonFiniteFeature(f"{path}[{i}]", float(vector[i]), "features must be finite")
    # For a list, sum() beats converting to numpy at every length (no copy, one C loop).
    if _all_finite(vector):
        return
    for i, value in enumerate(vector):
        if not _is_finite_number(value):
            raise NonFiniteFeature(f"{path}[{i}]", value, "features must be finite")


def _check_features(features: Mapping[str, Any], dim: int | None, action: int | None) -> None:
    """Numeric values finite; ``vector`` empty or of length ``dim`` with finite elements.

    ``action`` is the candidate's index, or None for the context; paths are only built
    when something is wrong.
    """
    numeric = features.get("numeric")
    if numeric and not _all_finite(numeric.values()):
        _check_finite_map(numeric, f"{_features_path(action)}.numeric", NonFiniteFeature, "features must be finite")
    vector = features.get("vector")
    if vector is not None and len(vector):
        if dim is None or len(vector) == dim:
            if type(vector) is list and _all_finite(vector):
                return
        _check_vector(vector, dim, f"{_features_path(action)}.vector")


def _short(values: Sequence[float]) -> str:
    text = ", ".join(f"{v:g}" if isinstance(v, float) else repr(v) for v in list(values)[:8])
    return f"[{text}{', ...' if len(values) > 8 else ''}]"
