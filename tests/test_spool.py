"""The SDK's local spool and emitter: nothing lost below the bound, order kept, Kafka down then back."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter

from banditstream.decider import Decider
from banditstream.devstack import find_binary
from banditstream.spool import Spool
from streams.errors import DecodeError
from streams.serde import AvroSerde
from streams.settings import KafkaSettings
from streams.topics import ensure_topics
from tests.test_emitter_recovery import outage_port, read_to_end


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


def test_spool_drop_oldest_keeps_the_newest_and_counts_what_it_dropped(tmp_path, caplog):
    spool = Spool(tmp_path / "s", max_bytes=1024, overflow="drop_oldest")
    bodies = [f"{i:03d}".encode() + b"x" * 97 for i in range(20)]
    assert all(spool.append(body) for body in bodies)  # accepted: room is made at the other end
    assert [b for _, b in spool.peek(100)] == bodies[-9:]  # 9 * (100 + 8 header bytes) <= 1024
    assert (spool.depth, spool.dropped_oldest, spool.dropped_newest, spool.overflowed) == (9, 11, 0, 11)
    assert len([r for r in caplog.records if "is full" in r.getMessage()]) == 1  # rate-limited
    assert not spool.append(b"y" * 2000)  # larger than the whole bound: refused, even so
    assert spool.dropped_newest == 1 and spool.depth == 9
    spool.close()
    assert [b for _, b in Spool(tmp_path / "s", max_bytes=1024).peek(100)] == bodies[-9:]


def test_spool_positions_never_repeat_so_a_stale_commit_is_harmless(tmp_path):
    spool = Spool(tmp_path / "s", max_bytes=1 << 20)
    spool.append(b"first")
    (old_position, _), = spool.peek(1)
    spool.commit(old_position)  # drained: the file is truncated
    spool.append(b"second")
    (new_position, body), = spool.peek(1)
    assert new_position > old_position and body == b"second"
    spool.commit(old_position)  # a drain remembering the old record commits nothing new
    assert spool.depth == 1


def test_spool_compaction_bounds_the_file_and_a_crash_midway_loses_nothing(tmp_path):
    path = tmp_path / "s"
    spool = Spool(path, max_bytes=4096, overflow="drop_oldest")
    for i in range(2000):  # a long outage: the spool never empties, the oldest make room
        spool.append(f"e{i:04d}".encode() * 10)
        if i % 100 == 99:
            spool.compact(min_dead_bytes=8192)
    assert path.stat().st_size <= 4096 + 8192 + 100 * 58  # bound + threshold + one round of appends
    kept = [b for _, b in spool.peek(1000)]
    assert kept == [f"e{i:04d}".encode() * 10 for i in range(2000 - len(kept), 2000)]
    # a crash after a rewrite, before the cursor file was updated: the cursor names the old
    # file (its inode), so it is ignored and the rewritten file is read from its start
    assert spool.compact(min_dead_bytes=1)
    spool.close()
    cursor = path.with_name(path.name + ".cursor")
    cursor.write_text(f"{path.stat().st_size // 2} {path.stat().st_ino + 1}")
    assert [b for _, b in Spool(path, max_bytes=4096).peek(1000)] == kept


def _start_tansu(port: int) -> subprocess.Popen:
    url = f"tcp://127.0.0.1:{port}"
    return subprocess.Popen(
        [str(find_binary("tansu")), "broker", "--listener-url", url, "--advertised-listener-url", url,
         "--storage-engine", "memory://tansu/", "--silent"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


def test_spool_holds_10k_decisions_while_kafka_is_down_and_delivers_each_once(tmp_path, topics):
    """Kafka is unreachable while 10,000 decisions are made; when it comes up, all arrive, once each."""
    port = outage_port()  # dialled for seconds with nothing listening: see outage_port
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
            # about a second here; generous for a loaded machine
            assert decider.flush(timeout=60), (
                f"spool not drained: {decider.spool_depth} left; emitter online {decider._emitter.online}, "
                f"stats {decider._emitter.stats}, last drain error {decider._emitter.last_drain_error!r}"
            )
            # read to the end offsets the fetches carry: a consumer group's join (~3 s on Tansu,
            # more on a loaded machine) raced the 6 s idle timeout this test used to stop on
            messages = read_to_end(kafka, topics.decisions)
            decoded = AvroSerde("decision", framing="single_object").decode_batch([m.value() for m in messages])
            assert not [d for d in decoded if isinstance(d, DecodeError)]
            seen = Counter(record["event_id"] for record in decoded)
            assert seen == Counter(made)  # every decision, once each
        finally:
            os.killpg(broker.pid, signal.SIGKILL)  # memory storage: nothing to shut down cleanly
            broker.wait(10)
    finally:
        decider.close(timeout=2)
