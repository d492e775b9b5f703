"""The SDK's local spool and emitter: nothing lost below the bound, order kept, Kafka down then back."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from banditstream.decider import Decider
from banditstream.devstack import find_binary, free_port
from banditstream.spool import Spool
from streams.client import BatchConsumer
from streams.serde import AvroSerde
from streams.settings import KafkaSettings
from streams.topics import ensure_topics


def test_spool_keeps_order_and_truncates_when_drained(tmp_path):
    spool = Spool(tmp_path / "s", max_bytes=1 << 20)
    bodies = [f"event-{i}".encode() for i in range(100)]
    for body in bodies:
        assert spool.append(body)
    assert spool.depth == 100
    got = list(spool.peek(30))
    assert [b for _, b in got] == bodies[:30]
    spool.commit(got[-1][0])
    assert spool.depth == 70
    rest = list(spool.peek(1000))
    assert [b for _, b in rest] == bodies[30:]
    spool.commit(rest[-1][0])
    assert spool.depth == 0 and (tmp_path / "s").stat().st_size == 0


def test_spool_overflow_is_counted_never_silent(tmp_path, caplog):
    spool = Spool(tmp_path / "s", max_bytes=1024)
    accepted = sum(spool.append(b"x" * 100) for _ in range(20))
    assert accepted == 9  # 9 * (100 + 8 header bytes) <= 1024 < 10 * 108
    assert spool.overflowed == 11
    assert "spool" in caplog.text and "full" in caplog.text


def test_spool_survives_reopen_and_drops_a_torn_tail(tmp_path):
    path = tmp_path / "s"
    spool = Spool(path, max_bytes=1 << 20)
    for i in range(10):
        spool.append(f"e{i}".encode())
    first = list(spool.peek(3))
    spool.commit(first[-1][0])
    spool.close()
    with open(path, "ab") as f:  # a crash in the middle of an append
        f.write(b"\x00\x00\x00\x50\x01\x02")
    reopened = Spool(path, max_bytes=1 << 20)
    assert [b for _, b in reopened.peek(100)] == [f"e{i}".encode() for i in range(3, 10)]
    assert reopened.depth == 7


def _start_tansu(port: int) -> subprocess.Popen:
    url = f"tcp://127.0.0.1:{port}"
    return subprocess.Popen(
        [str(find_binary("tansu")), "broker", "--listener-url", url, "--advertised-listener-url", url,
         "--storage-engine", "memory://tansu/", "--silent"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


def test_spool_holds_10k_decisions_while_kafka_is_down_and_delivers_each_once(tmp_path, topics):
    """Kafka is unreachable while 10,000 decisions are made; when it comes up, all arrive, once each."""
    port = free_port()
    kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}", profile="tansu")
    decider = Decider("routing", kafka=kafka, topics=topics, spool_path=tmp_path / "spool", seed=1)
    rng = random.Random(4)
    made = []
    try:
        for i in range(10_000):
            ctx = {"task": rng.choice(["code", "chat"]), "tokens": float(rng.randint(1, 900))}
            made.append(decider.decide(ctx, ["a", "b", "c"], event_id=f"e{i:05d}").event_id)
        deadline = time.monotonic() + 30
        while decider.spool_depth < 10_000 and time.monotonic() < deadline:
            time.sleep(0.1)  # in-flight records time out into the spool
        assert decider.spool_depth == 10_000

        broker = _start_tansu(port)
        try:
            ensure_topics(kafka, topics)
            # usually ~15 s after the broker is back; reconnection after a long outage has been
            # seen to take up to a minute on a loaded machine
            assert decider.flush(timeout=120), (
                f"spool not drained: {decider.spool_depth} left; emitter online {decider._emitter.online}, "
                f"stats {decider._emitter.stats}, last drain error {decider._emitter.last_drain_error!r}"
            )
            serde = AvroSerde("decision", framing="single_object")
            seen: dict[str, int] = {}
            with BatchConsumer(kafka, "spool-check", [topics.decisions]) as consumer:
                for batch in consumer.batches(serde, max_records=5000, idle_timeout=6):
                    assert batch.failures == []
                    for record in batch.records:
                        seen[record["event_id"]] = seen.get(record["event_id"], 0) + 1
            assert sorted(seen) == sorted(made)
            assert set(seen.values()) == {1}
        finally:
            os.killpg(broker.pid, signal.SIGTERM)
            broker.wait(10)
    finally:
        decider.close(timeout=2)
