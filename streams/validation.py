"""Validation of events at the boundary: what a service emits and what a worker consumes.

The checks run per event in the SDK's ``decide`` path and in the join worker, so they are
plain loops over small maps with ``math.isfinite``; the inside of the system trusts what
passed them. Each method raises the first problem found, in a fixed order, as a typed
:class:`~streams.errors.ValidationError` naming the field and the value, and returns the
event unchanged when it is valid.

Decision checks, in order:

1. ``event_id`` is a non-empty string                        (:class:`MissingEventId`)
2. ``domain`` is configured, when domains are configured      (:class:`UnknownDomain`)
3. ``actions`` is not empty, nor longer than the domain's ``max_actions`` (or, when the
   domain sets none, ``limits.max_actions``)  (:class:`EmptyActions`, :class:`TooManyActions`)
4. one probability per action                                  (:class:`ProbabilityCountMismatch`)
5. ``chosen`` (and ``recommended`` unless -1) index an action  (:class:`ChosenOutOfRange`)
6. each probability is finite and not negative, and
   ``|sum(p) - 1| <= probability_tolerance``
   (:class:`NonFiniteValue`, :class:`NegativeProbability`, :class:`ProbabilitiesDoNotSumToOne`);
   the same for ``recommended_probabilities`` unless it is empty, one per action too
7. ids (``event_id``, ``tenant``, ``workspace``, ``domain``, ``policy_version``) of at most
   ``max_id_bytes``                                            (:class:`FieldTooLarge`)
8. context features, then each action's id and features: at most ``max_features`` named
   features, names and categorical values of at most ``max_string_bytes``, numeric values
   finite, ``vector`` empty or of the domain's ``vector_dim`` (at most ``max_vector_dim``
   when the domain sets none), its elements finite
   (:class:`FieldTooLarge`, :class:`NonFiniteFeature`, :class:`WrongDimension`)
9. the encoded size, when the caller passes it                (:class:`OversizePayload`)

Size limits keep one event from costing the join more than a bounded amount of memory and
work (a megabyte-long feature name is stored, hashed and logged like any other). String sizes
are UTF-8 bytes, measured only for strings longer than a quarter of their limit (UTF-8 spends
at most 4 bytes on a character); the usual case costs one C-level ``sum(map(len, ...))`` per
map and per group of ids, and nothing at all for the limits an event's ``encoded_size``
already proves: no string is longer than the encoding it sits in, and no map has more than
half as many entries as that has bytes.

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
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from streams.errors import (
    ChosenOutOfRange,
    EmptyActions,
    FieldTooLarge,
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
    show,
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
    #: Longest id, in UTF-8 bytes: ``event_id``, ``reward_id``, ``tenant``, ``workspace``,
    #: ``domain``, action ids, ``policy_version`` (and an update's ``arm``, ``feature_hash``).
    max_id_bytes: int = 256
    #: Longest other string, in UTF-8 bytes: feature and signal names, categorical values.
    max_string_bytes: int = 1024
    #: Most candidates a decision may carry, when its domain sets no ``max_actions``.
    max_actions: int = 256
    #: Most named features (numeric plus categorical) in the context, and in each action.
    max_features: int = 512
    #: Longest dense ``vector``, when the domain sets no ``vector_dim``.
    max_vector_dim: int = 4096
    #: Most named signals in one reward.
    max_signals: int = 64

    def __post_init__(self) -> None:
        if not self.probability_tolerance >= 0:
            raise ValueError(f"probability_tolerance must be >= 0, not {self.probability_tolerance}")
        for name in _SIZE_LIMITS:
            value = getattr(self, name)
            if type(value) is not int or value < 1:  # bool is not int here: True is no limit
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        if self.domains is not None:  # a read-only copy: the caller's dict cannot change it later
            object.__setattr__(self, "domains", MappingProxyType(dict(self.domains)))


_SIZE_LIMITS = (
    "max_payload_bytes", "max_id_bytes", "max_string_bytes", "max_actions", "max_features", "max_vector_dim", "max_signals",
)  # fmt: skip
_NO_LIMITS = DomainLimits()
#: Ids of a decision besides ``event_id`` and ``domain`` (checked with them).
_DECISION_IDS = ("tenant", "workspace", "policy_version")
_REWARD_IDS = ("reward_id", "tenant", "workspace")
_UPDATE_IDS = ("tenant", "workspace", "arm", "feature_hash", "policy_version")
_update_ids = operator.itemgetter("event_id", "domain", *_UPDATE_IDS)
_decision_ids = operator.itemgetter("event_id", "domain", *_DECISION_IDS)
_reward_ids = operator.itemgetter("event_id", "domain", *_REWARD_IDS)
#: Above any string's length: the id check of an event whose encoding proves its ids short.
_UNBOUNDED = 1 << 62


class Validator:
    """Checks decisions, rewards and updates against :class:`ValidationLimits`."""

    def __init__(self, limits: ValidationLimits | None = None) -> None:
        self.limits = limits if limits is not None else ValidationLimits()
        self._domains = self.limits.domains
        self._tolerance = self.limits.probability_tolerance
        self._max_bytes = self.limits.max_payload_bytes
        self._max_id = self.limits.max_id_bytes
        self._max_string = self.limits.max_string_bytes
        # A string of at most this many characters fits its limit whatever they are (UTF-8
        # spends at most 4 bytes on one), so only longer ones are measured in bytes.
        self._id_chars = self._max_id // 4
        self._string_chars = self._max_string // 4
        #: Ids whose lengths sum to at most this many characters are all within ``max_id_bytes``.
        self.short_ids_chars = self._id_chars
        self._max_actions = self.limits.max_actions
        self._max_features = self.limits.max_features
        # An Avro map entry takes at least 2 bytes (a key's length, then a string's length or
        # a double's 8 bytes), so an encoding of at most this many bytes proves every
        # Features record holds at most ``max_features`` named features.
        self._feature_count_bytes = 2 * self._max_features
        self._max_vector = self.limits.max_vector_dim
        self._max_signals = self.limits.max_signals
        #: An encoded event of at most this many bytes cannot break ``max_features``,
        #: ``max_string_bytes`` or ``max_vector_dim`` (a vector element takes 8 bytes).
        self.small_event_bytes = min(self._feature_count_bytes, self._max_string, 8 * self._max_vector)

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

    def _check_ids(self, event: Mapping[str, Any], names: tuple[str, ...]) -> None:
        """``event_id``, ``domain`` (unless configured: then it is one of ours) and ``names``
        are at most ``max_id_bytes``. Callers first rule out the usual case, short ids, with
        one ``sum(map(len, ...))`` of their own."""
        for name in ("event_id", *names, *(("domain",) if self._domains is None else ())):
            self._check_id(event.get(name), name)

    def _check_id(self, value: Any, path: str) -> None:
        if type(value) is str and len(value) > self._id_chars:
            size = _utf8_size(value)
            if size > self._max_id:
                raise FieldTooLarge(path, size, self._max_id, "max_id_bytes")

    def _check_strings(self, values: Mapping[str, Any], path: str, what: str) -> None:
        """Names (``what="keys"``) or values (``"values"``) of ``values`` are at most
        ``max_string_bytes``; only called when one of them is long enough to break it."""
        limit, chars = self._max_string, self._string_chars
        for key, value in values.items():
            text = key if what == "keys" else value
            if type(text) is str and len(text) > chars:
                size = _utf8_size(text)
                if size > limit:
                    field = f"{path} key {show(key)}" if what == "keys" else f"{path}[{show(key)}]"
                    raise FieldTooLarge(field, size, limit, "max_string_bytes")

    def _check_features(
        self, features: Mapping[str, Any], dim: int | None, action: int | None, counts: bool, strings: bool
    ) -> None:
        """One Features record: with ``counts`` its number of named features, with ``strings``
        the size of their names and categorical values; numeric values finite, ``vector``
        empty or of length ``dim`` (at most ``max_vector_dim`` without one) with finite
        elements.

        ``action`` is the candidate's index, or None for the context; paths are only built
        when something is wrong.
        """
        numeric = features.get("numeric")
        if counts or strings:
            self._check_feature_sizes(features, numeric, action, strings)
        if numeric and not _all_finite(numeric.values()):
            _check_finite_map(numeric, f"{_features_path(action)}.numeric", NonFiniteFeature, "features must be finite")
        vector = features.get("vector")
        if vector is not None and len(vector):
            if dim is None:
                if len(vector) > self._max_vector:
                    path = f"len({_features_path(action)}.vector)"
                    raise FieldTooLarge(path, len(vector), self._max_vector, "max_vector_dim", "")
                if type(vector) is list and _all_finite(vector):
                    return
            elif len(vector) == dim and type(vector) is list and _all_finite(vector):
                return
            _check_vector(vector, dim, f"{_features_path(action)}.vector")

    def _check_feature_sizes(self, features: Mapping[str, Any], numeric: Any, action: int | None, strings: bool) -> None:
        categorical = features.get("categorical")
        count = (len(numeric) if numeric else 0) + (len(categorical) if categorical else 0)
        if count > self._max_features:
            path = _features_path(action)
            raise FieldTooLarge(f"len({path}.numeric) + len({path}.categorical)", count, self._max_features, "max_features", "")
        if strings:
            chars = self._string_chars
            if numeric and not _all_short(numeric, chars):
                self._check_strings(numeric, f"{_features_path(action)}.numeric", "keys")
            if categorical:
                if not _all_short(categorical, chars):
                    self._check_strings(categorical, f"{_features_path(action)}.categorical", "keys")
                if not _all_short(categorical.values(), chars):
                    self._check_strings(categorical, f"{_features_path(action)}.categorical", "values")

    def _check_signals(self, signals: Mapping[str, Any], strings: bool) -> None:
        if len(signals) > self._max_signals:
            raise FieldTooLarge("len(signals)", len(signals), self._max_signals, "max_signals", "")
        if strings and not _all_short(signals, self._string_chars):
            self._check_strings(signals, "signals", "keys")

    def _too_many_actions(self, n: int, limits: DomainLimits) -> None:
        if limits.max_actions is not None:
            if n > limits.max_actions:
                raise TooManyActions("len(actions)", n, f"the domain allows at most {limits.max_actions} candidates")
        elif n > self._max_actions:
            raise TooManyActions("len(actions)", n, f"the limit is {self._max_actions} (limits.max_actions)")

    # -- pieces the SDK checks the caller's input with (decide builds the rest) -----------

    def max_actions_of(self, domain_max: int | None) -> int:
        """Most candidates a decision may carry: the domain's ``max_actions``, else the limit's."""
        return domain_max if domain_max is not None else self._max_actions

    def check_id_size(self, value: str, path: str) -> None:
        """Raise :class:`FieldTooLarge` if the id ``value`` is over ``max_id_bytes``."""
        self._check_id(value, path)

    def check_id_sizes(self, ids: Sequence[str], path: str) -> None:
        """Raise :class:`FieldTooLarge` for the first of ``ids`` over ``max_id_bytes``;
        ``path`` names it from its index, e.g. ``"actions[{}].id"``."""
        if not _all_short(ids, self._id_chars):
            for i, value in enumerate(ids):
                self._check_id(value, path.format(i))

    def check_feature_sizes(self, features: Mapping[str, Any], action: int | None = None) -> None:
        """Raise :class:`FieldTooLarge` if a Features record (the context, or the features of
        candidate ``action``) has more than ``max_features`` named features, a name or
        categorical value over ``max_string_bytes``, or (any) ``vector`` over
        ``max_vector_dim``."""
        self._check_feature_sizes(features, features.get("numeric"), action, True)
        vector = features.get("vector")
        if vector is not None and len(vector) > self._max_vector:
            raise FieldTooLarge(f"len({_features_path(action)}.vector)", len(vector), self._max_vector, "max_vector_dim", "")

    # -- decisions -----------------------------------------------------------------------

    def validate_decision(self, event: Mapping[str, Any], *, encoded_size: int | None = None) -> Mapping[str, Any]:
        """Return ``event`` if it is a valid DecisionEvent, else raise the first problem.

        ``encoded_size``: the size of the bytes the event was decoded from, when it was; it
        is checked against ``max_payload_bytes``, and the size limits it already proves (no
        string is longer than the whole encoding, no map has more entries than half its
        bytes) are not checked again.
        """
        self._event_id(event)
        limits = self._domain(event)

        actions = event.get("actions")
        if not actions:
            raise EmptyActions("actions", actions, "a decision needs at least one candidate")
        n = len(actions)
        if n > self._max_actions or limits.max_actions is not None:
            self._too_many_actions(n, limits)

        probabilities = event.get("probabilities")
        count = None if probabilities is None else len(probabilities)
        if count != n:
            raise ProbabilityCountMismatch("len(probabilities)", count, f"one probability per action expected ({n} actions)")
        _check_index(event.get("chosen"), "chosen", n, "must index one of the actions")
        recommended = event.get("recommended", -1)
        if recommended != -1:
            _check_index(recommended, "recommended", n, "must index one of the actions, or be -1")
        self._check_distribution(probabilities)
        if event.get("recommended_probabilities"):
            self._check_recommendation(event["recommended_probabilities"], n)

        # What the encoding's size does not already prove (see the module docstring).
        ids = encoded_size is None or encoded_size > self._max_id
        counts = encoded_size is None or encoded_size > self._feature_count_bytes
        strings = encoded_size is None or encoded_size > self._max_string
        id_chars = self._id_chars
        if ids:
            try:  # the usual case in one C-level pass: together they are shorter than one may be
                short = sum(map(len, _decision_ids(event))) <= id_chars
            except (KeyError, TypeError):  # not decoded: a missing or non-string id
                short = False
            if not short:
                self._check_ids(event, _DECISION_IDS)
        else:
            id_chars = _UNBOUNDED
        dim = limits.vector_dim
        check_features = self._check_features
        context = event.get("context")
        if context:
            check_features(context, dim, None, counts, strings)
        for i, action in enumerate(actions):
            try:
                if len(action["id"]) > id_chars:
                    self._check_id(action["id"], f"actions[{i}].id")
            except (KeyError, TypeError):  # no id, or not a string: the schema's business
                pass
            features = action.get("features")
            if features:
                check_features(features, dim, i, counts, strings)

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

    def _check_recommendation(self, probabilities: Sequence[float], n: int) -> None:
        """A shadow policy's logged distribution: one probability per action, summing to 1."""
        if len(probabilities) != n:
            raise ProbabilityCountMismatch(
                "len(recommended_probabilities)", len(probabilities),
                f"empty or one probability per action expected ({n} actions)",
            )
        self._check_distribution(probabilities, "recommended_probabilities")

    # -- rewards -------------------------------------------------------------------------

    def validate_reward(self, event: Mapping[str, Any], *, encoded_size: int | None = None) -> Mapping[str, Any]:
        """Return ``event`` if it is a valid RewardEvent, else raise the first problem.

        Order: ``event_id``, ``reward_id``, ``domain``, ids of at most ``max_id_bytes``,
        at most ``max_signals`` signals named in at most ``max_string_bytes``, ``signals``
        finite, ``value`` finite (or absent), encoded size (see :meth:`validate_decision`).
        """
        self._event_id(event)
        reward_id = event.get("reward_id")
        if type(reward_id) is not str or not reward_id.strip():
            raise MissingRewardId("reward_id", reward_id, "every reward needs a non-empty string id")
        self._domain(event)
        if encoded_size is None or encoded_size > self._max_id:
            try:
                short = sum(map(len, _reward_ids(event))) <= self._id_chars
            except (KeyError, TypeError):
                short = False
            if not short:
                self._check_ids(event, _REWARD_IDS)
        signals = event.get("signals")
        if signals:
            self._check_signals(signals, encoded_size is None or encoded_size > self._max_string)
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

        Order: ``event_id``, ``domain``, ids of at most ``max_id_bytes`` (action ids
        included), at most ``max_actions`` actions (or the domain's), ``probabilities`` one
        per action, ``arm_index`` within the actions (when they are listed), ``probability``
        finite and in [0, 1], the logged distribution and the recommended one (when given),
        one probability per action each, ``features`` at most
        ``max_vector_dim`` long and finite, ``reward``, ``weight`` finite, at most
        ``max_signals`` signals, finite, encoded size. The feature vector is the hashed one,
        whose length is the model's, not the domain's ``vector_dim``, so the model's owner
        checks its length.
        """
        self._event_id(event)
        limits = self._domain(event)
        actions = event.get("actions") or ()
        probabilities = event.get("probabilities") or ()
        n = len(actions)
        strings = encoded_size is None or encoded_size > self._max_string
        if encoded_size is None or encoded_size > self._max_id:
            try:
                short = _all_short(_update_ids(event), self._id_chars)
            except KeyError:  # not decoded: a missing id
                short = False
            if not short:
                self._check_ids(event, _UPDATE_IDS)
            if n and not _all_short(actions, self._id_chars):
                for i, action_id in enumerate(actions):
                    self._check_id(action_id, f"actions[{i}]")
        if n > self._max_actions or limits.max_actions is not None:
            self._too_many_actions(n, limits)
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
        if event.get("recommended_probabilities"):
            self._check_recommendation(event["recommended_probabilities"], n)
        features = event.get("features")
        if features is not None and len(features):
            if len(features) > self._max_vector:
                raise FieldTooLarge("len(features)", len(features), self._max_vector, "max_vector_dim", "")
            _check_vector(features, None, "features")
        for name in ("reward", "weight"):
            if name in event and not _is_finite_number(event[name]):
                raise NonFiniteValue(name, event[name], f"{name} must be a finite number")
        signals = event.get("signals")
        if signals:
            self._check_signals(signals, strings)
            _check_finite_map(signals, "signals", NonFiniteValue, "signals must be finite")
        if encoded_size is not None:
            self.validate_size(encoded_size)
        return event


# -- helpers ---------------------------------------------------------------------------------


def _utf8_size(text: str) -> int:
    """Bytes of ``text`` in UTF-8; ``isascii()`` is a flag lookup, so ASCII costs no copy."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _all_short(strings: Any, chars: int) -> bool:
    """True when none of ``strings`` (a collection: read twice) has more than ``chars`` characters.

    Cheap for the usual case: one C-level ``sum`` of lengths (a third of what ``max`` costs),
    then ``max`` only if the sum is over. False for anything that is not a string, so the
    caller's exact walk (which skips non-strings: their type is the schema's business) runs.
    """
    try:
        return sum(map(len, strings)) <= chars or max(map(len, strings)) <= chars
    except TypeError:
        return False


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


def _short(values: Sequence[float]) -> str:
    text = ", ".join(f"{v:g}" if isinstance(v, float) else repr(v) for v in list(values)[:8])
    return f"[{text}{', ...' if len(values) > 8 else ''}]"
