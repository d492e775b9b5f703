"""The dead-letter topic: where a record a worker cannot use goes, with why, and its bytes.

A worker never stops for one bad record. It hands the record and the typed error to
:meth:`DeadLetters.send`; the DeadLetter event (schemas/deadletter.avsc) keeps the source
topic/partition/offset, the error class, a reason slug (also the metric label) and the
message, plus the raw key and value so nothing is lost and the record can be replayed.
"""

from __future__ import annotations

import logging
import re
import time

from confluent_kafka import KafkaError, KafkaException

from streams.client import DeliveryError, EventProducer, Failure
from streams.errors import BanditstreamError
from streams.serde import AvroSerde

log = logging.getLogger(__name__)


def reason_of(error: BaseException) -> str:
    """The short slug for an error: its ``reason`` if typed, else its class in snake_case."""
    reason = getattr(error, "reason", None)
    if isinstance(reason, str) and reason and reason != "error":
        return reason
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(error).__name__).lower()


class DeadLetters:
    """Produces DeadLetter events for one worker; counts them per reason.

    Every dead letter :meth:`send` produces is kept until the broker acknowledges it. A
    worker calls :meth:`settle` before it commits its source offsets: it waits for the
    acknowledgements and sends again what failed (a broker restart, a fenced producer), so a
    committed offset never passes a bad record whose dead letter is not on the topic.
    """

    def __init__(self, producer: EventProducer, topic: str, *, worker: str, serde: AvroSerde, on_dead_letter=None):
        self.producer = producer
        self.topic = topic
        self.worker = worker
        self.serde = serde  # the deployment's framing, as every other producer of the topic
        self.on_dead_letter = on_dead_letter  # e.g. a metrics hook: f(reason)
        self.counts: dict[str, int] = {}
        #: dead letters not acknowledged yet: key -> (value, value without the refused bytes)
        self._unacked: dict[str, tuple[bytes, bytes | None]] = {}
        self._too_large: set[str] = set()

    @property
    def outstanding(self) -> int:
        """Dead letters sent but not acknowledged yet."""
        return len(self._unacked)

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
        where = dict(source_topic=source_topic, partition=partition, offset=offset, key=key, error=error, reason=reason)
        dl_key, bare = self.encode(**where, value=None)
        encoded = None
        if value is not None:
            try:
                encoded = self.encode(**where, value=value)[1]
                self.producer.send_raw(self.topic, encoded, key=dl_key, on_delivery=self._delivered)
            except (BanditstreamError, KafkaException) as failure:  # e.g. too large for the serde or the producer
                log.warning("dead letter %s sent without the refused bytes: %s", dl_key, failure)
                encoded = None
        if encoded is None:
            encoded, bare = bare, None
            self.producer.send_raw(self.topic, encoded, key=dl_key, on_delivery=self._delivered)
        self._unacked[dl_key] = (encoded, bare)
        self.counted(reason or reason_of(error))

    def _delivered(self, error: KafkaError | None, message) -> None:
        key = message.key()
        key = key.decode() if isinstance(key, bytes) else key
        if error is None:
            self._unacked.pop(key, None)
        elif error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
            self._too_large.add(key)

    def settle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every dead letter sent so far to be acknowledged.

        Returns True when none is outstanding. Otherwise the producer is rebuilt (it may be
        fatal or fenced), the outstanding ones are sent again (a dead letter the broker
        refused as too large goes without the refused bytes) and False is returned: the
        caller must not commit past them yet, and calls again later.
        """
        if not self._unacked:
            return True
        try:
            self.producer.flush(timeout)
        except (DeliveryError, KafkaException, RuntimeError, SystemError):  # SystemError: a fatal producer's flush
            pass
        if not self._unacked:
            return True
        self.producer.rebuild()
        for key, (encoded, bare) in list(self._unacked.items()):
            if key in self._too_large and bare is not None:
                encoded, bare = bare, None
                self._unacked[key] = (encoded, bare)
            self._too_large.discard(key)
            self.producer.send_raw(self.topic, encoded, key=key, on_delivery=self._delivered)
        return False

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
