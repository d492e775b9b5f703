"""Thin, explicit Kafka clients for Avro events: a producer with delivery callbacks and a
batch consumer that decodes in bulk and hands back undecodable records instead of raising.

Configuration is a plain librdkafka dict built from :class:`streams.settings.KafkaSettings`
(profile settings first, then the user's extras), shown in full by ``.config``.

    producer = EventProducer(kafka)
    producer.send(topics.decisions, serde, record)      # keyed by record["event_id"]
    producer.flush()

    with BatchConsumer(kafka, "my-group", [topics.decisions]) as consumer:
        for batch in consumer.batches(serde, max_records=1000):
            ...                                         # batch.records, batch.failures
            consumer.commit(batch)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from streams._gaps import GapCheck
from streams.errors import DecodeError
from streams.serde import AvroSerde
from streams.settings import KafkaSettings


class DeliveryError(RuntimeError):
    """The broker did not accept records before the flush timeout."""


class EventProducer:
    """Produce Avro events; delivery results arrive through callbacks served by ``poll``."""

    def __init__(self, kafka: KafkaSettings, **overrides: Any):
        self.config = kafka.producer_config(**overrides)
        self._producer = Producer(self.config)
        self._lock = threading.Lock()
        self.delivered = 0
        self.failed = 0
        self.last_error: KafkaError | None = None

    def send(self, topic: str, serde: AvroSerde, record: dict, *, key: str | None = None, on_delivery=None) -> None:
        """Encode and enqueue one record; never waits for the network.

        The key defaults to ``record["event_id"]`` so decisions and their rewards land on one
        partition. If the local queue is full, serve callbacks until there is room.
        """
        value = serde.encode(record)
        self.send_raw(topic, value, key=key if key is not None else record["event_id"], on_delivery=on_delivery)

    def send_raw(self, topic: str, value: bytes, *, key: str | bytes | None, on_delivery=None) -> None:
        self.send_many(topic, ((key, value),), on_delivery=on_delivery)

    def send_many(self, topic: str, records: Iterable[tuple[str | bytes | None, bytes]], *, on_delivery=None) -> None:
        """Enqueue encoded ``(key, value)`` records, one delivery callback for all of them; if the
        local queue is full, serve callbacks until there is room. Callbacks are served once at
        the end, so a batch costs one poll."""
        produce, callback = self._producer.produce, self._callback(on_delivery)
        for key, value in records:
            while True:
                try:
                    produce(topic, value=value, key=key, on_delivery=callback)
                    break
                except BufferError:
                    self._producer.poll(0.05)
        self._producer.poll(0)

    def poll(self, timeout: float = 0.0) -> int:
        return self._producer.poll(timeout)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every enqueued record is acknowledged; raise if some are not."""
        remaining = self._producer.flush(timeout)
        if remaining:
            raise DeliveryError(f"{remaining} records not delivered within {timeout}s (last error: {self.last_error})")
        if self.failed:
            raise DeliveryError(f"{self.failed} records failed delivery (last error: {self.last_error})")

    def rebuild(self) -> None:
        """Drop what is queued and start over with a new producer (after a fatal or fenced
        error, or records not delivered in time): the caller sends again what it must deliver."""
        old, self._producer = self._producer, Producer(self.config)
        with self._lock:
            self.failed, self.last_error = 0, None
        discard_producer(old)

    def _callback(self, user_callback):
        def on_delivery(error: KafkaError | None, message: Message) -> None:
            with self._lock:
                if error is None:
                    self.delivered += 1
                else:
                    self.failed += 1
                    self.last_error = error
            if user_callback is not None:
                user_callback(error, message)

        return on_delivery


def discard_producer(producer: Producer) -> None:
    """Purge a producer's queue and let it go (its callbacks report the purge, harmlessly)."""
    try:
        producer.purge()
        producer.flush(0)
    except Exception:  # a fatal producer may refuse both; it is dropped all the same
        pass


@dataclass
class Failure:
    """A record that could not be decoded, with where it came from (for the dead-letter topic)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    error: Exception


@dataclass
class Batch:
    """Decoded records of one poll, in offset order per partition, and the failures among them."""

    records: list[dict] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    #: (topic, partition) -> next offset to read after this batch
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)


class BatchConsumer:
    """A consumer-group member that polls in batches and decodes them in bulk; a gap in a
    partition's offsets is read again before it counts as a hole (:mod:`streams._gaps`)."""

    def __init__(self, kafka: KafkaSettings, group_id: str, topics: Sequence[str], **overrides: Any):
        self.config = kafka.consumer_config(group_id, **overrides)
        self._consumer = Consumer(self.config)
        self._gaps = GapCheck(self._consumer, kafka.broker_profile.gap_confirm_s)
        self._consumer.subscribe(list(topics), on_revoke=self._forget, on_lost=self._forget)

    def _forget(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._gaps.forget((tp.topic, tp.partition) for tp in partitions)

    def poll_batch(self, serde: AvroSerde, *, max_records: int = 1000, timeout: float = 1.0) -> Batch:
        """One ``consume`` call, decoded; broker errors other than end-of-partition raise."""
        messages = self._consumer.consume(max_records, timeout)
        self._gaps.tick()
        batch = Batch()
        good: list[Message] = []
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise DeliveryError(f"consume failed: {error.str()}")
            if not self._gaps.admit(message):
                continue
            good.append(message)
            batch.next_offsets[(message.topic(), message.partition())] = message.offset() + 1
        decoded = serde.decode_batch([m.value() for m in good])
        for message, result in zip(good, decoded):
            if isinstance(result, DecodeError):
                batch.failures.append(
                    Failure(message.topic(), message.partition(), message.offset(), message.key(), message.value(), result)
                )
            else:
                batch.records.append(result)
                batch.messages.append(message)
        return batch

    def batches(self, serde: AvroSerde, *, max_records: int = 1000, timeout: float = 1.0, idle_timeout: float | None = None) -> Iterator[Batch]:
        """Batches until ``idle_timeout`` seconds pass with nothing new (forever if None)."""
        last_seen = time.monotonic()
        while True:
            batch = self.poll_batch(serde, max_records=max_records, timeout=timeout)
            if batch.next_offsets:
                last_seen = time.monotonic()
                yield batch
            elif idle_timeout is not None and time.monotonic() - last_seen > idle_timeout:
                return

    def commit(self, batch: Batch) -> None:
        """Commit the batch's offsets synchronously."""
        if batch.next_offsets:
            offsets = [TopicPartition(t, p, o) for (t, p), o in batch.next_offsets.items()]
            self._consumer.commit(offsets=offsets, asynchronous=False)

    def close(self) -> None:
        """Leave the group so the others rebalance at once."""
        self._consumer.close()

    def __enter__(self) -> "BatchConsumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
