"""Non-blocking event emission for the SDK, with a local spool while Kafka is unreachable.

``emit`` never waits for the network: it hands the encoded event to the confluent-kafka
producer (delivery reported through callbacks, served by ``emit`` itself) or, while the
broker is unreachable or the spool still holds older events, appends it to the spool so
order is kept. A background thread serves the callbacks ``emit`` left (when events stop
coming) and, once the broker answers again, drains the spool in order, committing each
record only after the broker acknowledged it. A record whose delivery fails goes to the
spool too. Past the spool's bound, events are counted and logged, never silently dropped.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Producer

from banditstream.spool import Spool
from streams.settings import KafkaSettings

log = logging.getLogger(__name__)

_FRAME = struct.Struct(">HI")  # topic length, key length


def _frame(topic: str, key: bytes, value: bytes) -> bytes:
    t = topic.encode()
    return _FRAME.pack(len(t), len(key)) + t + key + value


def _unframe(body: bytes) -> tuple[str, bytes, bytes]:
    tlen, klen = _FRAME.unpack_from(body)
    start = _FRAME.size
    topic = body[start : start + tlen].decode()
    key = body[start + tlen : start + tlen + klen]
    return topic, key, body[start + tlen + klen :]


@dataclass
class EmitterStats:
    sent: int = 0
    spooled: int = 0
    drained: int = 0
    overflowed: int = 0


class EventEmitter:
    """See the module docstring. ``close()`` flushes what it can and stops the thread."""

    def __init__(
        self,
        kafka: KafkaSettings,
        *,
        spool_path: str | Path,
        spool_max_bytes: int = 64 << 20,
        delivery_timeout_ms: int = 5000,
        drain_interval_s: float = 0.2,
        producer_overrides: dict[str, Any] | None = None,
        on_spool_depth=None,
    ):
        self.stats = EmitterStats()
        self.spool = Spool(spool_path, max_bytes=spool_max_bytes)
        self._online = True
        self._lock = threading.Lock()
        self._on_spool_depth = on_spool_depth
        config = kafka.producer_config(
            **{
                "message.timeout.ms": delivery_timeout_ms,
                # fewer, larger batches: every batch wakes librdkafka's broker thread, which on
                # a small machine preempts the thread that is deciding
                "linger.ms": 100,
                # only failures call into Python (confluent-kafka still takes the GIL for each
                # report to free the message's state, hence the reports are served in emit)
                "delivery.report.only.error": True,
                "queue.buffering.max.messages": 200_000,
                # after an outage the spool drains once the broker answers; librdkafka's default
                # reconnect backoff (up to 10 s, growing) kept it waiting for up to a minute
                "reconnect.backoff.max.ms": 1000,
                "error_cb": self._on_error,
                "log_level": 3,
                **(producer_overrides or {}),
            }
        )
        self.config = config
        self._producer = Producer(config)
        # one bound method for every message: a fresh one each would live until the report
        # and, thousands in flight, set off the garbage collector during decide()
        self._on_delivery = self._delivered
        self._drain_interval = drain_interval_s
        #: spool positions of records the broker already acknowledged during a drain that
        #: stopped at an earlier failure; skipped on the next attempt so each arrives once
        self._acked_positions: set[int] = set()
        #: why the last drain attempt stopped early (None: none has)
        self.last_drain_error: str | None = None
        self._next_drain_log = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="banditstream-emitter", daemon=True)
        self._thread.start()

    # -- the hot path ---------------------------------------------------------------------

    def emit(self, topic: str, key: str, value: bytes) -> None:
        """Send one event without blocking; spool it when Kafka is unreachable."""
        key_bytes = key.encode()
        if self._online and self.spool.depth == 0:
            try:
                self._producer.produce(topic, value=value, key=key_bytes, on_delivery=self._on_delivery)
                self.stats.sent += 1
                # the delivery reports due, served by the thread holding the GIL: from the
                # background thread each would wait for the GIL and preempt the caller
                self._producer.poll(0)
                return
            except BufferError:
                pass  # the local queue is full: the broker is not keeping up or is away
        self._to_spool(topic, key_bytes, value)

    @property
    def online(self) -> bool:
        return self._online

    @property
    def spool_depth(self) -> int:
        return self.spool.depth

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until nothing is in flight and the spool is empty (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            in_flight = self._producer.flush(0.1)
            if in_flight == 0 and self.spool.depth == 0:
                return True
        return False

    def close(self, timeout: float = 10.0) -> None:
        self.flush(timeout)
        self._stop.set()
        self._thread.join(timeout)
        self.spool.close()
        self._producer = None  # librdkafka's threads stop with the last reference

    # -- callbacks and the background thread -------------------------------------------

    def _delivered(self, error: KafkaError | None, message) -> None:
        if error is None:
            return
        log.debug("delivery failed (%s); spooling", error)
        self._online = False
        self._to_spool(message.topic(), message.key() or b"", message.value() or b"")

    def _on_error(self, error: KafkaError) -> None:
        if error.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE):
            self._online = False

    def _to_spool(self, topic: str, key: bytes, value: bytes) -> None:
        if self.spool.append(_frame(topic, key, value)):
            self.stats.spooled += 1
        else:
            self.stats.overflowed += 1
        if self._on_spool_depth is not None:
            self._on_spool_depth(self.spool.depth)

    def _run(self) -> None:
        while not self._stop.wait(self._drain_interval):
            try:
                self._producer.poll(0)  # reports emit() did not serve: no event since they came
                if self.spool.depth:
                    if self._broker_answers():
                        self._drain()
                    else:
                        self._drain_failed("the broker does not answer a metadata request yet")
                elif not self._online and self._broker_answers():
                    self._online = True
            except Exception as exc:  # noqa: BLE001 - the thread is the spool's only way out: it stays
                self._drain_failed(f"{type(exc).__name__}: {exc}")

    def _drain_failed(self, why: str) -> None:
        """Remember why a drain attempt stopped (``last_drain_error``); log it now and then."""
        self.last_drain_error = why
        now = time.monotonic()
        if now >= self._next_drain_log:
            self._next_drain_log = now + 10.0
            log.warning("spool drain stopped (%d events waiting), retrying: %s", self.spool.depth, why)

    def _broker_answers(self) -> bool:
        try:
            self._producer.list_topics(timeout=1.0)
        except Exception:  # noqa: BLE001 - any failure means "not yet"
            return False
        return True

    def _drain(self, batch: int = 2000) -> None:
        """Send spooled records in order; commit the prefix the broker acknowledged."""
        while self.spool.depth and not self._stop.is_set():
            records = list(self.spool.peek(batch))
            # with delivery.report.only.error, only failures call back: None means delivered
            results: list[KafkaError | None] = [None] * len(records)

            def done(index):
                def callback(error, _message):
                    results[index] = error

                return callback

            for index, (position, body) in enumerate(records):
                if position in self._acked_positions:
                    results[index] = None
                    continue
                topic, key, value = _unframe(body)
                while True:
                    try:
                        self._producer.produce(topic, value=value, key=key, on_delivery=done(index))
                        break
                    except BufferError:
                        self._producer.poll(0.05)
            in_flight = self._producer.flush(30)
            if in_flight > 0:
                self._drain_failed(f"{in_flight} of {len(records)} records still in flight after 30 s")
                return  # outcome unknown for some: retry later (the join deduplicates by event_id)
            acknowledged = 0
            for result in results:
                if result is None:
                    acknowledged += 1
                else:
                    break
            if acknowledged:
                self.spool.commit(records[acknowledged - 1][0])
                self._acked_positions = {p for p in self._acked_positions if p > records[acknowledged - 1][0]}
                self.stats.drained += acknowledged
                if self._on_spool_depth is not None:
                    self._on_spool_depth(self.spool.depth)
            if acknowledged < len(records):
                self._drain_failed(f"record {acknowledged + 1} of {len(records)}: {results[acknowledged]}")
                self._acked_positions.update(
                    records[i][0] for i in range(acknowledged, len(records)) if results[i] is None
                )
                return  # broker went away again; try later from the first unacknowledged
        self._online = True
