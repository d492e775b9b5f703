"""Reading the joined log back for evaluation: the updates topic, or Avro files of updates.

:func:`read_updates` reads the updates topic's partitions from given offsets (default: the
earliest) to the end each partition had when reading reached it (partition EOF events: right on
every broker, unlike a queried end offset), keeping the updates stamped inside an optional
decision-time range. :func:`read_update_files` reads Avro container files of UpdateEvents.
Both return decoded UpdateEvents for :meth:`learner.evaluation.logged.LoggedBandit.from_updates`.

Records that do not decode are counted and skipped (they were dead-lettered when written);
reading never stops for one.
"""

from __future__ import annotations

import gc
import time
import uuid
from datetime import datetime
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastavro

import schemas
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from streams.errors import DecodeError
from streams.serde import AvroSerde
from streams.settings import KafkaSettings

__all__ = ["LogRange", "ReadReport", "domain_log_reader", "read_update_files", "read_updates"]


@dataclass(frozen=True)
class LogRange:
    """Which part of the log: offsets to start from per partition (default the earliest),
    and a range in epoch ms (inclusive since, exclusive until) of each record's ``field``
    (an update's decision time; ``timestamp`` for dead letters)."""

    start_offsets: Mapping[int, int] | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    field: str = "decision_time"

    def keeps(self, update: Mapping[str, Any]) -> bool:
        t = update[self.field]
        return (self.since_ms is None or t >= self.since_ms) and (self.until_ms is None or t < self.until_ms)


@dataclass
class ReadReport:
    records: int = 0
    kept: int = 0
    undecodable: int = 0
    out_of_range: int = 0
    #: model-reset markers (:mod:`streams.reset`) read and left out: they are not decisions
    resets: int = 0
    seconds: float = 0.0
    #: partition -> the next offset after the last record read
    ends: dict[int, int] = field(default_factory=dict)


def read_updates(
    kafka: KafkaSettings,
    topic: str,
    serde: AvroSerde,
    *,
    log_range: LogRange = LogRange(),
    progress: Callable[[int], None] | None = None,
    timeout_s: float = 600.0,
) -> tuple[list[dict[str, Any]], ReadReport]:
    """Every update of ``topic`` in ``log_range`` (model-reset markers left out), and what reading found.

    ``progress(records_so_far)`` is called after each fetch. Raises TimeoutError when the
    partitions are not read to their ends within ``timeout_s``.
    """
    started = time.monotonic()
    partitions = topic_partitions(kafka, topic)
    starts = log_range.start_offsets or {}
    consumer = Consumer(kafka.consumer_config(
        f"banditstream-evaluate-{uuid.uuid4().hex[:8]}",
        **{"enable.partition.eof": True, "enable.auto.commit": False, "fetch.max.bytes": 64 << 20,
           "max.partition.fetch.bytes": 16 << 20, "queued.max.messages.kbytes": 256 << 10},
    ))  # fmt: skip
    if not starts and log_range.since_ms is not None:
        starts = _offsets_at(consumer, topic, partitions, log_range.since_ms - _SEEK_SLACK_MS)
    consumer.assign([TopicPartition(topic, p, starts.get(p, OFFSET_BEGINNING)) for p in partitions])
    report = ReadReport()
    kept: list[dict[str, Any]] = []
    open_partitions = set(partitions)
    whole = log_range.since_ms is None and log_range.until_ms is None
    # Reading builds a long list of new dicts and frees nothing: every collection the cyclic
    # GC runs meanwhile scans them all again for no garbage (a fifth of the time at 200k rows).
    collecting = gc.isenabled()
    gc.disable()
    try:
        while open_partitions:
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"{topic}: partitions {sorted(open_partitions)} not read to their end in {timeout_s:.0f} s")
            messages = consumer.consume(10_000, 0.1)
            values = [message.value() or b"" for message in messages if message.error() is None]
            if len(values) < len(messages):  # partition ends, and errors
                for message in messages:
                    error = message.error()
                    if error is None:
                        continue
                    if error.code() == KafkaError._PARTITION_EOF:
                        open_partitions.discard(message.partition())
                        report.ends[message.partition()] = message.offset()
                    elif error.fatal():
                        raise RuntimeError(f"reading {topic}: {error}")
            report.records += len(values)
            decoded = serde.decode_batch(values)
            if whole:  # (no per-row call: most reads take the whole log)
                good = [update for update in decoded if not isinstance(update, DecodeError)]
                report.undecodable += len(decoded) - len(good)
                decisions = [update for update in good if not update.get("reset")]
                report.resets += len(good) - len(decisions)
                kept += decisions
            else:
                for update in decoded:
                    if isinstance(update, DecodeError):
                        report.undecodable += 1
                    elif update.get("reset"):  # a model-reset marker (streams.reset), not a decision
                        report.resets += 1
                    elif log_range.keeps(update):
                        kept.append(update)
                    else:
                        report.out_of_range += 1
            if progress is not None:
                progress(report.records)
    finally:
        if collecting:
            gc.enable()
        consumer.close()
    report.kept = len(kept)
    report.seconds = time.monotonic() - started
    return kept, report


#: How much earlier than the range's start reading seeks by record time: an update is written
#: after its decision (window, grace), by a join whose clock may differ a little, ms.
_SEEK_SLACK_MS = 10 * 60 * 1000


def domain_log_reader(kafka: KafkaSettings, topic: str, serde: AvroSerde) -> Callable[[str, int], list[dict[str, Any]]]:
    """``read_log(domain, since_ms)`` for the promotion gate: the domain's updates on ``topic``
    decided at or after ``since_ms``."""

    def read_log(domain: str, since_ms: int) -> list[dict[str, Any]]:
        updates, _ = read_updates(kafka, topic, serde, log_range=LogRange(since_ms=since_ms))
        return [u for u in updates if u["domain"] == domain]

    return read_log


def _offsets_at(consumer: Consumer, topic: str, partitions: list[int], timestamp_ms: int) -> dict[int, int]:
    """Per partition, the first offset whose record time is at or after ``timestamp_ms``
    (absent where the broker knows none: reading starts at the beginning there)."""
    try:
        found = consumer.offsets_for_times([TopicPartition(topic, p, max(0, timestamp_ms)) for p in partitions], timeout=10)
    except KafkaException:
        return {}
    return {tp.partition: tp.offset for tp in found if tp.error is None and tp.offset >= 0}


def read_update_files(paths: Iterable[str | Path], *, log_range: LogRange = LogRange()) -> tuple[list[dict[str, Any]], ReadReport]:
    """UpdateEvents from Avro container files (any schema version: fastavro resolves each
    file's writer schema against the project's current one)."""
    started = time.monotonic()
    reader_schema = schemas.parsed("update")
    report = ReadReport()
    kept: list[dict[str, Any]] = []
    for path in paths:
        with open(path, "rb") as handle:
            for update in fastavro.reader(handle, reader_schema=reader_schema):
                report.records += 1
                if update.get("reset"):
                    report.resets += 1
                    continue
                for name in _TIMES:  # fastavro gives timestamp-millis as datetimes; the topic's readers give ms
                    if isinstance(update.get(name), datetime):
                        update[name] = int(update[name].timestamp() * 1000)
                if log_range.keeps(update):
                    kept.append(update)
                else:
                    report.out_of_range += 1
    report.kept = len(kept)
    report.seconds = time.monotonic() - started
    return kept, report


_TIMES = ("decision_time", "reward_time")


def topic_partitions(kafka: KafkaSettings, topic: str) -> list[int]:
    """The partition numbers of ``topic``, sorted; ValueError if it does not exist."""
    metadata = AdminClient(kafka.client_config()).list_topics(timeout=10)
    info = metadata.topics.get(topic)
    if info is None or info.error is not None:
        raise ValueError(f"topic {topic!r} does not exist")
    return sorted(info.partitions)


def log_ends(kafka: KafkaSettings, topic: str, timeout_s: float = 30.0) -> dict[int, int]:
    """Per partition, the offset after its last record, as fetching finds it: a queried end
    offset can be short of it (Tansu answers the last batch's first offset + 1), so each
    partition is read from just below that to where the fetch reports its end."""
    partitions = topic_partitions(kafka, topic)
    consumer = Consumer(kafka.consumer_config(f"banditstream-ends-{uuid.uuid4().hex[:8]}", **{"enable.partition.eof": True}))
    try:
        starts = {p: max(0, consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] - 1) for p in partitions}
        consumer.assign([TopicPartition(topic, p, start) for p, start in starts.items()])
        ends: dict[int, int] = {}
        deadline = time.monotonic() + timeout_s
        while len(ends) < len(partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions {sorted(set(partitions) - set(ends))} not read to their end")
            for message in consumer.consume(1000, 0.2):
                if message.error() is not None and message.error().code() == KafkaError._PARTITION_EOF:
                    ends[message.partition()] = message.offset()
        return ends
    finally:
        consumer.close()
