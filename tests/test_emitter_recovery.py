"""The SDK's emitter heals: a broker killed or frozen and back, a large spool, close, the bound.

Each test runs its own Tansu broker on a fixed port, so it can SIGKILL, SIGSTOP and SIGCONT
it and restart it where the emitter looks for it. Tansu keeps topics in memory: a restart
loses every topic and every record, so what a test can prove about records acknowledged
before a kill is that they are *not* sent again. Records are read back with a plain
consumer, assigned to every partition from the start, up to the end offset carried with
the fetched records (a queried end offset is not trusted on Tansu).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import subprocess
import time
from collections import Counter

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from banditstream.devstack import find_binary, port_accepts, port_is_free
from banditstream.emitter import EventEmitter
from banditstream.spool import Spool
from streams.settings import KafkaSettings

TOPIC = "recovery.decisions"


class _Broker:
    """One Tansu process on a fixed port: start, kill, freeze, thaw, start again."""

    def __init__(self, port: int):
        self.port = port
        self.kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}", profile="tansu")
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 15.0) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [str(find_binary("tansu")), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/", "--silent"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        admin = AdminClient(self.kafka.client_config(log_level=0))
        deadline = time.monotonic() + timeout
        while True:
            assert self.process.poll() is None, f"tansu exited with {self.process.returncode}"
            with contextlib.suppress(KafkaException):
                if port_accepts(self.port):
                    admin.list_topics(timeout=1)
                    break
            assert time.monotonic() < deadline, f"tansu did not answer on port {self.port} within {timeout}s"
            time.sleep(0.05)
        # memory storage: a (re)started broker has no topics; the emitter's drain may have
        # created this one already by producing to it (Tansu creates topics on produce)
        future = admin.create_topics([NewTopic(TOPIC, num_partitions=4, replication_factor=1)])[TOPIC]
        with contextlib.suppress(KafkaException):
            future.result(10)

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def freeze(self) -> None:
        os.killpg(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGCONT)
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


def outage_port() -> int:
    """A free loopback port for a broker that will be away while clients keep dialling it.

    Below the ephemeral range: a client's outgoing connection never takes it as its own
    source port, which on Linux connects a socket to itself and keeps the broker from
    binding the port again.
    """
    try:
        low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(min(20000, low - 1000), low)
        if port_is_free(port):
            return port
    raise RuntimeError("no free port below the ephemeral range")


@pytest.fixture
def broker():
    """A broker of the test's own (not started: the test says when)."""
    own = _Broker(outage_port())
    yield own
    own.stop()


def read_to_end(kafka: KafkaSettings, topic: str, timeout: float = 30.0) -> list:
    """Every message of ``topic``: each partition assigned from its start and read up to the
    end offset its fetched records carry (no group join to wait for, no idle time to guess)."""
    consumer = Consumer(kafka.consumer_config(f"check-{time.monotonic_ns()}", log_level=0))
    try:
        found = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        partitions = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in found]
        consumer.assign(partitions)
        messages = []
        deadline = time.monotonic() + timeout
        while True:
            for message in consumer.consume(5000, 0.2):
                assert message.error() is None, message.error()
                messages.append(message)
            ends = [consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)[1] for p in found]
            positions = [max(p.offset, 0) for p in consumer.position(partitions)]
            if all(end >= 0 and position >= end for end, position in zip(ends, positions)):
                return messages
            assert time.monotonic() < deadline, f"{topic} not read to its end in {timeout}s: at {positions} of {ends}"
    finally:
        consumer.close()


def _read_keys(kafka: KafkaSettings) -> Counter:
    """How often each key is on the topic."""
    return Counter(message.key().decode() for message in read_to_end(kafka, TOPIC))


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout}s"
        time.sleep(0.05)


def _emit(emitter: EventEmitter, prefix: str, count: int, *, pace_s: float = 0.0) -> list[str]:
    keys = [f"{prefix}{i:05d}" for i in range(count)]
    for key in keys:
        emitter.emit(TOPIC, key, b"event " + key.encode())
        if pace_s:
            time.sleep(pace_s)
    return keys


def test_broker_killed_and_restarted_every_event_from_the_kill_on_arrives_once(broker, tmp_path):
    broker.start()
    emitter = EventEmitter(broker.kafka, spool_path=tmp_path / "spool", delivery_timeout_ms=2000)
    try:
        before = _emit(emitter, "a", 500)
        assert emitter.flush(10)  # acknowledged by the broker that is about to die with them

        broker.kill()
        during = _emit(emitter, "b", 2000, pace_s=0.0002)
        _wait_for(lambda: not emitter.online, 10, "the emitter noticing the broker is gone")
        broker.start()
        after = _emit(emitter, "c", 1000)

        assert emitter.flush(40), f"not delivered: spool {emitter.spool_depth}, last error {emitter.last_drain_error!r}"
        seen = _read_keys(broker.kafka)
        # what the old broker acknowledged died with it and is never sent again
        assert not [k for k in before if k in seen]
        # everything from the kill on: each exactly once (the old producer's id is unknown to
        # the new broker, so nothing it sent landed; the new producer's sends are idempotent)
        assert Counter({k: seen[k] for k in during + after}) == Counter(during + after)
        assert emitter.stats.producers_rebuilt >= 1, emitter.stats
    finally:
        emitter.close(timeout=2)


def test_broker_frozen_then_resumed_the_fenced_producer_is_replaced_and_all_arrives(broker, tmp_path):
    """SIGSTOP longer than the delivery timeout, then SIGCONT: the broker fences the producer."""
    broker.start()
    emitter = EventEmitter(broker.kafka, spool_path=tmp_path / "spool", delivery_timeout_ms=1500)
    try:
        before = _emit(emitter, "a", 500)
        assert emitter.flush(10)

        broker.freeze()
        frozen_until = time.monotonic() + 6.0  # four delivery timeouts: sends time out in flight
        during = _emit(emitter, "b00000-", 50, pace_s=0.002)
        assert emitter.in_flight > 0  # handed to the producer; the broker does not answer
        while time.monotonic() < frozen_until:
            during += _emit(emitter, f"b{len(during):05d}-", 50, pace_s=0.002)
        broker.thaw()
        assert emitter.spool_depth > 0  # sends timed out in flight while it was frozen
        after = _emit(emitter, "c", 1000)

        assert emitter.flush(30), f"not delivered: spool {emitter.spool_depth}, last error {emitter.last_drain_error!r}"
        assert emitter.in_flight == 0
        assert emitter.stats.producers_rebuilt >= 1, emitter.stats
        reasons = list(emitter.rebuild_reasons)
        assert [r for r in reasons if "FENCED" in r or "FATAL" in r.upper()], reasons  # not only "wedged"
        seen = _read_keys(broker.kafka)
        assert all(seen[k] == 1 for k in before)  # acknowledged before the freeze: never resent
        assert not [k for k in during if seen[k] == 0]  # at least once
        # emitted while the spool was not empty: sent (from the spool, or directly once it
        # emptied) only after the fenced producer was replaced, so once each
        assert all(seen[k] == 1 for k in after)
        # sends that timed out in the frozen broker's socket were written when it resumed and
        # sent again from the spool: at-least-once, the join deduplicates by event_id
        assert set(seen) == set(before + during + after)
    finally:
        emitter.close(timeout=2)


def test_close_reports_what_stays_in_the_spool_when_the_broker_is_gone(broker, tmp_path, caplog):
    broker.start()
    spool_path = tmp_path / "spool"
    emitter = EventEmitter(broker.kafka, spool_path=spool_path, delivery_timeout_ms=2000)
    _emit(emitter, "a", 100)
    assert emitter.flush(10)
    broker.kill()
    _emit(emitter, "b", 200)

    with caplog.at_level(logging.WARNING, logger="banditstream.emitter"):
        report = emitter.close(timeout=1)
    assert (report.delivered, report.spooled, report.spool_path) == (False, 200, spool_path)
    lines = [r.getMessage() for r in caplog.records if "emitter closed" in r.getMessage()]
    assert len(lines) == 1 and str(spool_path) in lines[0] and "200" in lines[0]
    left = Spool(spool_path)  # they stay for the next process
    assert sorted(body[-6:].decode() for _, body in left.peek(1000)) == [f"b{i:05d}" for i in range(200)]


def test_flush_drains_a_large_spool_itself(broker, tmp_path):
    """25,000 events spooled while the broker is down; flush() alone sends them all, once each."""
    spool_path = tmp_path / "spool"
    offline = EventEmitter(broker.kafka, spool_path=spool_path, delivery_timeout_ms=2000)
    keys = _emit(offline, "e", 25_000)
    assert offline.close(timeout=0.5).spooled == 25_000

    broker.start()
    # the background thread never runs a drain here: whatever is delivered, flush() sent
    emitter = EventEmitter(broker.kafka, spool_path=spool_path, drain_interval_s=3600)
    try:
        started = time.monotonic()
        assert emitter.flush(60), f"not drained: spool {emitter.spool_depth}, last error {emitter.last_drain_error!r}"
        took = time.monotonic() - started
        assert emitter.spool_depth == 0 and emitter.stats.drained == 25_000
        assert _read_keys(broker.kafka) == Counter(keys), f"flush took {took:.1f}s"
    finally:
        assert emitter.close(timeout=2).spooled == 0


@pytest.mark.parametrize("overflow", ["drop_oldest", "drop_newest"])
def test_past_the_spool_bound_events_are_dropped_by_policy_counted_and_logged_once(broker, tmp_path, caplog, overflow):
    # the broker is never started: everything goes to the spool once the emitter knows
    emitter = EventEmitter(broker.kafka, spool_path=tmp_path / "spool", spool_max_bytes=4096, overflow=overflow)
    try:
        _wait_for(lambda: not emitter.online, 10, "the emitter noticing there is no broker")
        with caplog.at_level(logging.WARNING, logger="banditstream.spool"):
            keys = _emit(emitter, "e", 200)
        kept = [body[-6:].decode() for _, body in emitter.spool.peek(1000)]
        assert 0 < len(kept) < 200 and emitter.stats.overflowed == 200 - len(kept)
        if overflow == "drop_oldest":
            assert kept == keys[-len(kept):] and emitter.stats.dropped_oldest == 200 - len(kept)
        else:
            assert kept == keys[: len(kept)] and emitter.stats.dropped_newest == 200 - len(kept)
        lines = [r.getMessage() for r in caplog.records if "is full" in r.getMessage()]
        assert len(lines) == 1 and overflow in lines[0]  # rate-limited: one line, not one per event
        assert emitter.close(timeout=0.2).dropped == 200 - len(kept)
    finally:
        emitter.close(timeout=0.2)
