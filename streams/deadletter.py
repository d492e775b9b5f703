"""The dead-letter topic: where a record a worker cannot use goes, with why, and its bytes.

A worker never stops for one bad record. It hands the record and the typed error to
:meth:`DeadLetters.send`; the DeadLetter event (schemas/deadletter.avsc) keeps the source
topic/partition/offset, the error class, a reason slug (also the metric label) and the
message, plus the raw key and value so nothing is lost and the record can be replayed.
"""

from __future__ import annotations

import re
import time

from streams.client import EventProducer, Failure
from streams.serde import AvroSerde


def reason_of(error: BaseException) -> str:
    """The short slug for an error: its ``reason`` if typed, else its class in snake_case."""
    reason = getattr(error, "reason", None)
    if isinstance(reason, str) and reason and reason != "error":
        return reason
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(error).__name__).lower()


class DeadLetters:
    """Produces DeadLetter events for one worker; counts them per reason."""

    def __init__(self, producer: EventProducer, topic: str, *, worker: str, serde: AvroSerde | None = None, on_dead_letter=None):
        self.producer = producer
        self.topic = topic
        self.worker = worker
        self.serde = serde or AvroSerde("deadletter", framing="single_object")
        self.on_dead_letter = on_dead_letter  # e.g. a metrics hook: f(reason)
        self.counts: dict[str, int] = {}

    def send(
        self,
        *,
        source_topic: str,
        partition: int,
        offset: int,
        key: bytes | str | None,
        value: bytes | None,
        error: BaseException,
        reason: str | None = None,
    ) -> None:
        dl_key, value = self.encode(source_topic=source_topic, partition=partition, offset=offset, key=key,
                                    value=value, error=error, reason=reason)
        self.producer.send_raw(self.topic, value, key=dl_key)
        self.counted(reason or reason_of(error))

    def encode(self, *, source_topic: str, partition: int, offset: int, key: bytes | str | None, value: bytes | None,
               error: BaseException, reason: str | None = None) -> tuple[str, bytes]:
        """The dead letter's ``(key, value)`` as :meth:`send` produces it (for callers that
        produce it themselves, and may have to produce it again); count it with :meth:`counted`."""
        reason = reason or reason_of(error)
        record = {
            "source_topic": source_topic,
            "source_partition": partition,
            "source_offset": offset,
            "key": key.encode() if isinstance(key, str) else key,
            "value": value,
            "error_class": type(error).__name__,
            "reason": reason,
            "message": str(error).splitlines()[0] if str(error) else type(error).__name__,
            "worker": self.worker,
            "timestamp": int(time.time() * 1000),
        }
        return f"{source_topic}/{partition}/{offset}", self.serde.encode(record)

    def counted(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        if self.on_dead_letter is not None:
            self.on_dead_letter(reason)

    def send_failure(self, failure: Failure) -> None:
        """Dead-letter a record a :class:`streams.client.BatchConsumer` could not decode."""
        self.send(
            source_topic=failure.topic,
            partition=failure.partition,
            offset=failure.offset,
            key=failure.key,
            value=failure.value,
            error=failure.error,
        )
