"""Non-blocking event emission for the SDK: a producer that heals, and a local spool.

The workflow, in order:

1. **Emit.** ``emit`` never waits for the network: it hands the encoded event to the live
   confluent-kafka producer (delivery reported through callbacks, served by ``emit`` itself)
   or, while the broker is unreachable or the spool still holds older events, appends it to
   the spool so order is kept. A record whose delivery fails goes to the spool too.
2. **Heal.** An idempotent producer can end in a state it never leaves by itself: *fatal*
   (``error.fatal()``, ``_FATAL``), *fenced* (``PRODUCER_FENCED``, ``_FENCED``: seen after a
   broker was frozen and resumed) or *wedged* (a broker restarted with empty storage forgot
   the producer id: sends fail with UNKNOWN_PRODUCER_ID or only time out, and librdkafka's
   own "Fatal error" was seen never to reach ``error_cb``). Any of the signals counts: an
   ``error_cb``, ``produce()`` raising, a delivery report, or a drained batch that timed out
   while the broker answers metadata requests.
   Such a producer is replaced: a new one is built from the same config (idempotence kept)
   and swapped in with one assignment, so ``emit`` uses either the old or the complete new
   one, never a half-built one and never a lock. Then the old one's queue is purged and every
   record whose outcome was lost with it goes to the spool: at-least-once, the downstream
   deduplicates (the join by event_id for decisions, by reward_id for rewards).
3. **Drain.** A background thread serves the callbacks ``emit`` left and, once the broker
   answers, drains the spool in order, a batch at a time, committing each record only after
   the broker acknowledged it. ``flush`` drains actively too. One lock and one outstanding
   batch make sure the two never send the same records at once: a batch cut short by a
   deadline stays outstanding and whoever drains next waits for its outcome, never resends it.
4. **Close.** ``close`` flushes what it can, moves what is still inside a producer to the
   spool, and reports (:class:`CloseReport`) what stays in the spool file: the next emitter
   on the same path sends it.

The spool drains in its append order. A record that fails in flight joins the spool after
the newer ones spooled meanwhile, so after an outage events can reach Kafka out of emission
order (never out of the spool's order); the join keeps a reward that comes before its
decision until the decision arrives, so nothing downstream relies on emission order.
Past the spool's bound, events are dropped by its overflow policy (``drop_newest`` or
``drop_oldest``), counted in :class:`EmitterStats` and logged.

    >>> emitter = EventEmitter(settings.kafka, spool_path=".banditstream/spool/x.spool")  # doctest: +SKIP
    >>> emitter.emit("bandit.decisions", event_id, encoded)                             # doctest: +SKIP
    >>> emitter.close()                                                                 # doctest: +SKIP
    CloseReport(delivered=True, spooled=0, spool_path=PosixPath('.banditstream/spool/x.spool'), dropped=0)
"""

from __future__ import annotations

import functools
import logging
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from banditstream.spool import Overflow, Spool
from streams.settings import KafkaSettings

log = logging.getLogger(__name__)

_FRAME = struct.Struct(">HI")  # topic length, key length

#: errors after which a producer's idempotence state is wrong for good: build a new one
_REPLACE_PRODUCER = frozenset(
    {
        KafkaError._FATAL,
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.UNKNOWN_PRODUCER_ID,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.INVALID_PRODUCER_ID_MAPPING,
    }
)
_UNREACHABLE = frozenset({KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE})
#: a producer replaced this recently is not replaced again: one that fails at once (a broker
#: that refuses every producer) must not become a loop building producers
_REBUILD_MIN_INTERVAL_S = 1.0
#: a retired producer is dropped this long after it was replaced and found empty; an emit()
#: that read it just before the swap has long finished with it by then
_RETIRED_GRACE_S = 1.0
#: how long the background thread drains before it lets a waiting flush() in
_DRAIN_SLICE_S = 1.0


def _frame(topic: str, key: bytes, value: bytes) -> bytes:
    t = topic.encode()
    return _FRAME.pack(len(t), len(key)) + t + key + value


def _unframe(body: bytes) -> tuple[str, bytes, bytes]:
    tlen, klen = _FRAME.unpack_from(body)
    start = _FRAME.size
    topic = body[start : start + tlen].decode()
    key = body[start + tlen : start + tlen + klen]
    return topic, key, body[start + tlen + klen :]


def _needs_new_producer(error: KafkaError) -> bool:
    return error.fatal() or error.code() in _REPLACE_PRODUCER


@dataclass
class EmitterStats:
    sent: int = 0  #: handed to the producer by emit()
    spooled: int = 0  #: appended to the spool (emit() while offline, failed deliveries)
    drained: int = 0  #: sent from the spool and acknowledged
    overflowed: int = 0  #: lost to the spool's bound, either policy
    dropped_oldest: int = 0  #: of those, spooled events discarded to make room
    dropped_newest: int = 0  #: of those, new events the full spool refused
    producers_rebuilt: int = 0  #: fatal, fenced or wedged producers replaced


@dataclass(frozen=True)
class CloseReport:
    """What ``EventEmitter.close`` leaves behind."""

    delivered: bool  #: every emitted event was acknowledged (nothing spooled, nothing in flight)
    spooled: int  #: events left in the spool file, for the next emitter on the same path
    spool_path: Path
    dropped: int  #: events lost to the spool's bound over the emitter's life


class _Generation:
    """One producer and the callbacks bound to it (reports of a replaced one must not heal the new one)."""

    __slots__ = ("number", "producer", "on_delivery", "retired_at")

    def __init__(self, number: int, producer: Producer, on_delivery):
        self.number = number
        self.producer = producer
        self.on_delivery = on_delivery
        self.retired_at = 0.0


class _Batch:
    """Spooled records sent together; ``results[i]`` None means acknowledged (reports are
    for failures only) once the producer they went to holds nothing more."""

    __slots__ = ("records", "results", "generation", "lost")

    def __init__(self, records: list[tuple[int, bytes]], generation: _Generation):
        self.records = records
        self.results: list[KafkaError | str | None] = [None] * len(records)
        self.generation = generation
        #: the producer was replaced before every outcome came: treat all as unknown
        self.lost = False


class EventEmitter:
    """See the module docstring. ``close()`` flushes what it can, stops the thread, reports."""

    def __init__(
        self,
        kafka: KafkaSettings,
        *,
        spool_path: str | Path,
        spool_max_bytes: int = 64 << 20,
        overflow: Overflow = "drop_newest",
        delivery_timeout_ms: int = 5000,
        drain_interval_s: float = 0.2,
        drain_batch: int = 5000,
        producer_overrides: dict[str, Any] | None = None,
        on_spool_depth=None,
    ):
        self.stats = EmitterStats()
        self.spool = Spool(spool_path, max_bytes=spool_max_bytes, overflow=overflow)
        self._online = True
        self._on_spool_depth = on_spool_depth
        #: the librdkafka settings every producer of this emitter is built from
        self.config = kafka.producer_config(
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
                "log_level": 3,
                **(producer_overrides or {}),
            }
        )
        self._drain_batch = drain_batch
        self._drain_interval = drain_interval_s
        #: one drainer (the thread or a flush) and one healer at a time
        self._drain_lock = threading.Lock()
        self._flushers = 0
        self._flushers_lock = threading.Lock()
        self._live = self._build(1)
        self._retired: list[_Generation] = []
        #: why the live producer must be replaced (set cheaply from any thread; None: it is fine)
        self._heal_reason: str | None = None
        self._next_rebuild = 0.0
        #: why producers were replaced, the latest last (the last few)
        self.rebuild_reasons: deque[str] = deque(maxlen=16)
        self._batch: _Batch | None = None
        #: spool positions of records the broker already acknowledged in a batch that
        #: stopped at an earlier failure; skipped on the next attempt so each arrives once
        self._acked_positions: set[int] = set()
        #: why the last drain attempt stopped early (None: none has)
        self.last_drain_error: str | None = None
        self._next_drain_log = 0.0
        self._close_report: CloseReport | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="banditstream-emitter", daemon=True)
        self._thread.start()

    # -- the hot path ---------------------------------------------------------------------

    def emit(self, topic: str, key: str, value: bytes) -> None:
        """Send one event without blocking; spool it when Kafka is unreachable."""
        key_bytes = key.encode()
        if self._online and self.spool.depth == 0:
            live = self._live  # one read: the old producer or the complete new one
            try:
                live.producer.produce(topic, value=value, key=key_bytes, on_delivery=live.on_delivery)
                self.stats.sent += 1
                # the delivery reports due, served by the thread holding the GIL: from the
                # background thread each would wait for the GIL and preempt the caller
                live.producer.poll(0)
                return
            except BufferError:
                pass  # the local queue is full: the broker is not keeping up or is away
            except KafkaException as exc:
                error = exc.args[0]
                if not _needs_new_producer(error):
                    raise  # about this event (too large, bad topic), not about the producer
                self._request_rebuild(live.number, error)
        self._to_spool(topic, key_bytes, value)

    @property
    def online(self) -> bool:
        return self._online

    @property
    def spool_depth(self) -> int:
        return self.spool.depth

    @property
    def in_flight(self) -> int:
        """Events inside a producer, not yet acknowledged nor reported failed."""
        return sum(len(generation.producer) for generation in (self._live, *self._retired))

    # -- flush and close ------------------------------------------------------------------

    def flush(self, timeout: float = 30.0) -> bool:
        """Deliver what is in flight and drain the spool; True when all was acknowledged in time.

        Drains in the calling thread (the background thread steps aside meanwhile), heals a
        broken producer on the way, and gives up at ``timeout``; whatever is left stays in
        the spool.
        """
        deadline = time.monotonic() + timeout
        with self._flushers_lock:
            self._flushers += 1
        try:
            while True:
                if not self._drain_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    return False
                try:
                    self._reap_retired()
                    if self._drain(deadline):
                        in_flight = self._live.producer.flush(max(0.0, min(1.0, deadline - time.monotonic())))
                        # a failed direct delivery was spooled while flushing: drain it next round
                        if in_flight == 0 and self._all_delivered():
                            return True
                finally:
                    self._drain_lock.release()
                if time.monotonic() >= deadline:
                    return False
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))  # a failed attempt
        finally:
            with self._flushers_lock:
                self._flushers -= 1

    def close(self, timeout: float = 10.0) -> CloseReport:
        """Flush for up to ``timeout``, stop, and report what stays in the spool file."""
        if self._close_report is not None:
            return self._close_report
        delivered = self.flush(timeout)
        self._stop.set()
        self._thread.join(timeout)
        with self._drain_lock:
            # records still inside a producer would die with it: their reports spool them
            for generation in (self._live, *self._retired):
                generation.producer.purge()
                generation.producer.flush(1.0)
            self._batch = None  # its records were never committed: they are still in the spool
        report = CloseReport(
            delivered=delivered and self.spool.depth == 0,
            spooled=self.spool.depth,
            spool_path=self.spool.path,
            dropped=self.spool.overflowed,
        )
        self.spool.close()
        if report.spooled:
            log.warning(
                "emitter closed with %d events in the spool %s; they stay there for the next emitter on that path",
                report.spooled, report.spool_path,
            )  # fmt: skip
        self._close_report = report
        self._live = None  # librdkafka's threads stop with the last reference
        self._retired = []
        return report

    # -- callbacks (any thread; cheap: they may run inside emit) --------------------------

    def _delivered(self, number: int, error: KafkaError | None, message) -> None:
        if error is None:
            return
        log.debug("delivery failed (%s); spooling", error)
        if _needs_new_producer(error):
            self._request_rebuild(number, error)
        self._online = False
        self._to_spool(message.topic(), message.key() or b"", message.value() or b"")

    def _on_error(self, number: int, error: KafkaError) -> None:
        if _needs_new_producer(error):
            self._request_rebuild(number, error)
        elif error.code() in _UNREACHABLE and self._live is not None and number == self._live.number:
            self._online = False

    def _request_rebuild(self, number: int, why: KafkaError | str) -> None:
        """Ask for producer ``number`` to be replaced; the drainer does it, off the hot path."""
        live = self._live
        if live is not None and number == live.number and self._heal_reason is None:
            if not isinstance(why, str):
                why = f"{'fatal ' if why.fatal() else ''}{why.name()}: {why.str()}"
            self._heal_reason = why
            self._online = False

    def _to_spool(self, topic: str, key: bytes, value: bytes) -> None:
        if self.spool.append(_frame(topic, key, value)):
            self.stats.spooled += 1
        stats, spool = self.stats, self.spool
        stats.dropped_oldest, stats.dropped_newest = spool.dropped_oldest, spool.dropped_newest
        stats.overflowed = spool.overflowed
        if self._on_spool_depth is not None:
            self._on_spool_depth(spool.depth)

    # -- producers: build, replace, retire (drain lock held) ------------------------------

    def _build(self, number: int) -> _Generation:
        config = {**self.config, "error_cb": functools.partial(self._on_error, number)}
        # one callable for every message of this producer: a fresh one each would live until
        # the report and, thousands in flight, set off the garbage collector during decide()
        return _Generation(number, Producer(config), functools.partial(self._delivered, number))

    def _heal(self) -> None:
        """Replace the live producer if it was found fatal, fenced or wedged."""
        reason = self._heal_reason
        now = time.monotonic()
        if reason is None or now < self._next_rebuild:
            return
        old = self._live
        self._live = self._build(old.number + 1)  # complete before emit can see it
        self._heal_reason = None
        self._next_rebuild = now + _REBUILD_MIN_INTERVAL_S
        self.stats.producers_rebuilt += 1
        self.rebuild_reasons.append(reason)
        log.warning(
            "replaced the Kafka producer (%s); the %d records it still held are purged and sent again from the spool",
            reason, len(old.producer),
        )  # fmt: skip
        self._retire(old)

    def _retire(self, old: _Generation) -> None:
        """Purge a replaced producer; the reports of what it held spool those records."""
        old.retired_at = time.monotonic()
        old.producer.purge()
        left = old.producer.flush(1.0)  # serves the purge reports (the drain's and emit's)
        batch = self._batch
        if left and batch is not None and batch.generation is old:
            batch.lost = True
        self._retired.append(old)

    def _reap_retired(self) -> None:
        """Spool what an emit() racing with the swap put into a retired producer; then drop it."""
        now = time.monotonic()
        for generation in list(self._retired):
            generation.producer.purge()
            generation.producer.poll(0)
            if len(generation.producer) == 0 and now - generation.retired_at >= _RETIRED_GRACE_S:
                self._retired.remove(generation)

    # -- draining (drain lock held) -------------------------------------------------------

    def _drain(self, deadline: float) -> bool:
        """Send spooled records in order until the spool is empty (True); False when a
        batch failed or ``deadline`` passed (an unsettled batch stays outstanding)."""
        while True:
            self._heal()
            batch = self._batch
            if batch is None:
                if self.spool.depth == 0:
                    return True
                batch = self._batch = self._send_batch(deadline)
            if not self._await(batch, deadline):
                return False
            if not self._settle(batch):
                return False

    def _send_batch(self, deadline: float) -> _Batch:
        live = self._live
        batch = _Batch(list(self.spool.peek(self._drain_batch)), live)
        produce = live.producer.produce
        for index, (position, body) in enumerate(batch.records):
            if position in self._acked_positions:
                continue
            topic, key, value = _unframe(body)
            callback = functools.partial(self._drain_outcome, batch, index)
            while True:
                try:
                    produce(topic, value=value, key=key, on_delivery=callback)
                    break
                except BufferError:
                    if time.monotonic() >= deadline:
                        return self._unsent(batch, index, "the producer's queue stayed full")
                    live.producer.poll(0.05)
                except KafkaException as exc:
                    error = exc.args[0]
                    if _needs_new_producer(error):
                        self._request_rebuild(live.number, error)
                    return self._unsent(batch, index, f"{error.name()}: {error.str()}")
        return batch

    def _drain_outcome(self, batch: _Batch, index: int, error: KafkaError | None, _message) -> None:
        batch.results[index] = error
        # seen at once, not only when the batch is settled: a batch's first failure is often
        # a timeout while later records name the cause (UNKNOWN_PRODUCER_ID after a restart)
        if error is not None and _needs_new_producer(error):
            self._request_rebuild(batch.generation.number, error)

    @staticmethod
    def _unsent(batch: _Batch, first: int, why: str) -> _Batch:
        for index in range(first, len(batch.records)):
            batch.results[index] = f"not sent: {why}"
        return batch

    def _await(self, batch: _Batch, deadline: float) -> bool:
        """Wait until every record of the batch has an outcome; False at the deadline, or when
        its producer is to be replaced (the replacement's purge gives the outcomes)."""
        if batch.lost:
            return True
        producer = batch.generation.producer
        while True:
            if producer.flush(max(0.0, min(0.2, deadline - time.monotonic()))) == 0:
                return True
            if time.monotonic() >= deadline:
                return False
            if self._heal_reason is not None and batch.generation is self._live:
                return False

    def _settle(self, batch: _Batch) -> bool:
        """Commit the acknowledged prefix; True when the whole batch was acknowledged."""
        self._batch = None
        records = batch.records
        results = batch.results
        if batch.lost:
            results = [r if r is not None else "outcome lost with a replaced producer" for r in results]
        acknowledged = 0
        for result in results:
            if result is not None:
                break
            acknowledged += 1
        if acknowledged:
            last = records[acknowledged - 1][0]
            self.spool.commit(last)
            self._acked_positions = {p for p in self._acked_positions if p > last}
            self.stats.drained += acknowledged
            if self._on_spool_depth is not None:
                self._on_spool_depth(self.spool.depth)
        if acknowledged == len(records):
            if self.spool.depth == 0 and self._heal_reason is None:
                self._online = True
            return True
        error = results[acknowledged]
        self._acked_positions.update(records[i][0] for i in range(acknowledged, len(records)) if results[i] is None)
        self._drain_failed(f"record {acknowledged + 1} of {len(records)}: {error}")
        if isinstance(error, KafkaError):
            if _needs_new_producer(error):
                self._request_rebuild(batch.generation.number, error)
            elif error.code() == KafkaError._MSG_TIMED_OUT and batch.generation is self._live and self._broker_answers():
                # the broker answers, yet this producer's records time out: wedged (a broker
                # restarted with empty storage refuses its producer id, silently, for ever)
                why = f"wedged: the broker answers but deliveries time out ({error.str()})"
                self._request_rebuild(batch.generation.number, why)
        return False

    def _all_delivered(self) -> bool:
        return (
            self.spool.depth == 0
            and self._batch is None
            and self._heal_reason is None
            and all(len(g.producer) == 0 for g in self._retired)
        )

    # -- the background thread ------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self._drain_interval):
            try:
                self._tick()
            except Exception as exc:  # noqa: BLE001 - the thread is the spool's only way out: it stays
                self._drain_failed(f"{type(exc).__name__}: {exc}")

    def _tick(self) -> None:
        self._live.producer.poll(0)  # reports emit() did not serve: no event since they came
        if self._flushers or not self._drain_lock.acquire(blocking=False):
            return  # a flush() is draining
        try:
            self._heal()
            self._reap_retired()
            if self._batch is not None or self.spool.depth:
                if self._batch is None and not self._broker_answers():
                    self._drain_failed("the broker does not answer a metadata request yet")
                else:
                    self._drain(time.monotonic() + _DRAIN_SLICE_S)
            elif not self._online and self._broker_answers():
                self._online = True
        finally:
            self._drain_lock.release()
        # a spool that never empties (long outage, drop_oldest) would grow its file for ever
        self.spool.compact()

    def _drain_failed(self, why: str) -> None:
        """Remember why a drain attempt stopped (``last_drain_error``); log it now and then."""
        self.last_drain_error = why
        now = time.monotonic()
        if now >= self._next_drain_log:
            self._next_drain_log = now + 10.0
            log.warning("spool drain stopped (%d events waiting), retrying: %s", self.spool.depth, why)

    def _broker_answers(self) -> bool:
        try:
            self._live.producer.list_topics(timeout=1.0)
        except Exception:  # noqa: BLE001 - any failure means "not yet"
            return False
        return True
