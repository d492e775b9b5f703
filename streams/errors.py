"""Typed errors for what crosses the Kafka boundary: bytes that do not decode, events that are invalid.

Callers catch by meaning::

    try:
        event = serde.decode(payload)
        validator.validate_decision(event)
    except DecodeError as err:      # the bytes: framing, schema, truncation, size
        dead_letter(payload, err)
    except ValidationError as err:  # the event: ids, domain, features, probabilities
        dead_letter(payload, err)

Every error carries ``field`` (a path into the event such as ``context.numeric['latency']``
or ``actions[2].features.vector``; ``payload`` for the raw bytes), ``value`` (what was found)
and ``reason`` (a short slug, stable enough for a Prometheus label and the dead-letter
record). ``str(err)`` is one line naming the field and the value:
``context.numeric['prompt_len'] is nan; features must be finite``.

:class:`OversizePayload` is both a :class:`DecodeError` (raw bytes refused before parsing)
and a :class:`ValidationError` (an event whose encoding is too large), so either handler
catches it.

:class:`FieldTooLarge` names the configured limit it broke, so an operator knows which knob
to raise: ``actions[3].id is 1048576 bytes, the limit is 256 (limits.max_id_bytes)``.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "BanditstreamError",
    "ChosenOutOfRange",
    "CorruptPayload",
    "DecodeError",
    "EmptyActions",
    "FieldTooLarge",
    "IncompatibleSchema",
    "MissingEventId",
    "MissingRewardId",
    "NegativeProbability",
    "NonFiniteFeature",
    "NonFiniteValue",
    "OversizePayload",
    "ProbabilitiesDoNotSumToOne",
    "ProbabilityCountMismatch",
    "TooManyActions",
    "TruncatedPayload",
    "UnknownDomain",
    "UnknownFingerprint",
    "UnknownFraming",
    "UnknownSchemaId",
    "ValidationError",
    "WrongDimension",
]

_MAX_VALUE_CHARS = 80


def show(value: Any) -> str:
    """``repr`` of an offending value, cut to one short line (payloads and vectors can be big)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value[:16])
        text = raw.hex(" ") + (" ..." if len(value) > 16 else "")
        return f"<{len(value)} bytes: {text}>" if text else "<0 bytes>"
    text = repr(value)
    if len(text) > _MAX_VALUE_CHARS:
        text = text[: _MAX_VALUE_CHARS - 3] + "..."
    return text


class BanditstreamError(Exception):
    """Base of every error banditstream raises on purpose."""

    reason: ClassVar[str] = "error"

    def __init__(self, field: str, value: Any, explanation: str) -> None:
        self.field = field
        self.value = value
        self.explanation = explanation
        super().__init__(f"{field} is {show(value)}; {explanation}")

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across process pools
        return (type(self), (self.field, self.value, self.explanation))


class RegistryError(BanditstreamError):
    """The schema registry refused (credentials, an unregistered subject) or could not be
    reached while a schema's id was looked up or registered."""

    reason: ClassVar[str] = "registry"


# --- decoding ---------------------------------------------------------------------------


class DecodeError(BanditstreamError):
    """The bytes are not an event this process can read."""

    reason: ClassVar[str] = "decode"


class TruncatedPayload(DecodeError):
    """The data ends before the framing header or the record does."""

    reason: ClassVar[str] = "truncated"


class UnknownFraming(DecodeError):
    """Neither the Confluent wire format (0x00) nor Avro single-object encoding (0xC3 0x01)."""

    reason: ClassVar[str] = "unknown_framing"


class UnknownSchemaId(DecodeError):
    """The schema registry does not know the Confluent schema id (or no registry is set)."""

    reason: ClassVar[str] = "unknown_schema_id"


class UnknownFingerprint(DecodeError):
    """The single-object fingerprint matches none of the schemas this package ships."""

    reason: ClassVar[str] = "unknown_fingerprint"


class IncompatibleSchema(DecodeError):
    """The writer schema cannot be read with ours (another record type, or a breaking change)."""

    reason: ClassVar[str] = "incompatible_schema"


class CorruptPayload(DecodeError):
    """The bytes are not Avro of the writer schema (bad union or enum index, bad UTF-8, ...)."""

    reason: ClassVar[str] = "corrupt"


# --- validation -------------------------------------------------------------------------


class ValidationError(BanditstreamError):
    """The event decodes (or would encode) but breaks a rule of the contract."""

    reason: ClassVar[str] = "validation"


class OversizePayload(DecodeError, ValidationError):
    """The encoded event is larger than the configured limit."""

    reason: ClassVar[str] = "oversize"


class FieldTooLarge(ValidationError):
    """A string, list or map is larger than its configured limit (``limits.<knob>``).

    ``value`` is the size found (UTF-8 bytes for a string, entries for a list or map) and
    ``limit`` the limit; the message reads ``<field> is <size> bytes, the limit is <limit>
    (limits.<knob>)`` (no unit for a count).
    """

    reason: ClassVar[str] = "field_too_large"

    def __init__(self, field: str, size: int, limit: int, knob: str, unit: str = "bytes") -> None:
        self.field = field
        self.value = size
        self.limit = limit
        self.knob = knob
        self.unit = unit
        self.explanation = f"the limit is {limit} (limits.{knob})"
        Exception.__init__(self, f"{field} is {size}{' ' + unit if unit else ''}, {self.explanation}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.field, self.value, self.limit, self.knob, self.unit))


class MissingEventId(ValidationError):
    """``event_id`` is missing, not a string, or empty."""

    reason: ClassVar[str] = "missing_event_id"


class MissingRewardId(ValidationError):
    """A reward's ``reward_id`` is missing, not a string, or empty."""

    reason: ClassVar[str] = "missing_reward_id"


class UnknownDomain(ValidationError):
    """The domain is not among the configured ones."""

    reason: ClassVar[str] = "unknown_domain"


class NonFiniteFeature(ValidationError):
    """A numeric feature, action feature or vector element is NaN, infinite or not a number."""

    reason: ClassVar[str] = "non_finite_feature"


class NonFiniteValue(ValidationError):
    """A probability, reward, signal or weight is NaN, infinite or not a number."""

    reason: ClassVar[str] = "non_finite_value"


class WrongDimension(ValidationError):
    """A non-empty ``vector`` has another length than the domain's configured dimension."""

    reason: ClassVar[str] = "wrong_dimension"


class EmptyActions(ValidationError):
    """A decision without candidates."""

    reason: ClassVar[str] = "empty_actions"


class TooManyActions(ValidationError):
    """More candidates than the domain allows."""

    reason: ClassVar[str] = "too_many_actions"


class ChosenOutOfRange(ValidationError):
    """An index into the candidates (``chosen``, ``recommended``, ``arm_index``) is out of range."""

    reason: ClassVar[str] = "chosen_out_of_range"


class ProbabilityCountMismatch(ValidationError):
    """``len(probabilities) != len(actions)``."""

    reason: ClassVar[str] = "probability_count_mismatch"


class NegativeProbability(ValidationError):
    """A probability below zero."""

    reason: ClassVar[str] = "negative_probability"


class ProbabilitiesDoNotSumToOne(ValidationError):
    """The logged distribution sums to something other than 1 (beyond the tolerance)."""

    reason: ClassVar[str] = "probabilities_do_not_sum_to_one"
