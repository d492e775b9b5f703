"""SourceReader against the real broker: the join's sources, read by librdkafka in time order."""

from __future__ import annotations

import json
import time

from confluent_kafka import KafkaError, Producer

from streams._join_reader import RewardHold, SourceReader
from streams.topics import ensure_topics
from tests import join_helpers as H


def _reader(kafka, topics, **hold) -> SourceReader:
    return SourceReader(
        kafka.consumer_config(f"reader-{topics.decisions}"), topics.decisions, topics.rewards,
        hold=RewardHold(hold.get("lead_ms", 0), hold.get("max_held", 1000)), fetch_wait_ms=100, batch_max=1000,
    )  # fmt: skip


def _read_all(reader: SourceReader, n: int, timeout_s: float = 30.0) -> list:
    out: list = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n:
        assert time.monotonic() < deadline, f"read {len(out)} of {n}"
        out.extend(reader.read(0.2)[1])
    return out


def test_rewards_come_after_the_decisions_stamped_before_them_and_the_end_is_known(kafka, topics):
    ensure_topics(kafka, topics)
    producer = Producer(kafka.producer_config())
    base = int(time.time() * 1000) - 60_000
    for i in range(10):  # every reward on the broker before any decision
        producer.produce(topics.rewards, f"r{i}".encode(), partition=0, timestamp=base + 1000 * i + 500)
    producer.flush(10)
    for i in range(10):
        producer.produce(topics.decisions, f"d{i}".encode(), partition=0, timestamp=base + 1000 * i)
    producer.flush(10)

    reader = _reader(kafka, topics)
    try:
        reader.assign({(topics.decisions, 0): None, (topics.rewards, 0): None})
        got = [m.value().decode() for m in _read_all(reader, 20)]
        assert sorted(got) == sorted([f"d{i}" for i in range(10)] + [f"r{i}" for i in range(10)])
        for i in range(9):  # reward i is stamped after decision i: never handed over before it
            assert got.index(f"r{i}") > got.index(f"d{i}"), got
        assert [g for g in got if g[0] == "d"] == [f"d{i}" for i in range(10)]  # offset order kept
        assert [g for g in got if g[0] == "r"] == [f"r{i}" for i in range(10)]

        deadline = time.monotonic() + 10
        while reader.complete_at(topics.decisions, 0, 10) is None:  # every decision handled
            assert time.monotonic() < deadline, "the decisions' end was never reported"
            reader.read(0.2)
        now = time.time() * 1000
        assert now - 2000 < reader.complete_at(topics.decisions, 0, 10) <= now
        assert reader.complete_at(topics.decisions, 0, 9) is None  # one still to handle
        assert reader.highwater(topics.decisions, 0) == 10

        reader.assign({(topics.decisions, 0): 7, (topics.rewards, 0): 8})  # from the state's offsets
        assert reader.complete_at(topics.decisions, 0, 10) is None  # known again only once read
        again = [m.value().decode() for m in _read_all(reader, 5)]
        assert sorted(again) == ["d7", "d8", "d9", "r8", "r9"]
    finally:
        reader.close()


def test_rewards_wait_while_their_decisions_lag_and_too_many_pause_their_partition(kafka, topics):
    """Rewards stamped after every decision read stay held; past ``max_held`` the rewards
    partition is paused; once the decisions are read to their end every reward goes, in
    offset order, and the partition resumes. (A backlog cannot be held still on a live
    broker, so the records are handed to the reader's intake directly.)"""
    ensure_topics(kafka, topics)
    reader = _reader(kafka, topics, max_held=10)
    try:
        reader.assign({(topics.decisions, 1): None, (topics.rewards, 1): None})
        base = 1_800_000_000_000
        batch = [H.Message(topics.decisions, 1, 0, base)]
        batch += [H.Message(topics.rewards, 1, i, base + 30_000 + i) for i in range(50)]
        out = reader._take(batch, time.time() * 1000)
        assert [(m.topic(), m.offset()) for m in out] == [(topics.decisions, 0)]
        assert reader.hold.count(1) == 50 and reader._paused == {1}

        out = reader._take([H.Message(topics.decisions, 1, 1, base + 30_020)], time.time() * 1000)
        assert [m.offset() for m in out] == [1] + list(range(21))  # up to the newest decision's time
        assert reader._paused == {1}  # 29 still wait: above half of max_held

        out = reader._take([H.Message(topics.decisions, 1, 2, eof=True)], time.time() * 1000)
        assert [m.offset() for m in out] == list(range(21, 50))  # the decisions' end: all the rest
        assert reader.hold.count(1) == 0 and reader._paused == set()
    finally:
        reader.close()


def test_a_transient_read_error_is_logged_and_reading_goes_on(kafka, topics, caplog):
    ensure_topics(kafka, topics)
    reader = _reader(kafka, topics)
    try:
        reader.assign({(topics.decisions, 0): None, (topics.rewards, 0): None})
        transient = H.Message(topics.decisions, 0, 0)
        transient._error = KafkaError(KafkaError._TRANSPORT)
        out = reader._take([transient, H.Message(topics.decisions, 0, 0, 1)], time.time() * 1000)
        assert [m.offset() for m in out] == [0]
        assert "retrying" in caplog.text
    finally:
        reader.close()


def test_rewards_read_to_their_end_but_still_held_are_not_handled(kafka, topics):
    """A join starting on a backlog fetches a rewards partition to its end while every reward
    waits in the hold for decisions not read yet. That end must not count as handled: the
    reward clock would move to the decisions' time and fire their defaults with their
    rewards still held. (Found by the soak: a partition's whole backlog learned as default.)"""
    ensure_topics(kafka, topics)
    reader = _reader(kafka, topics)
    try:
        reader.assign({(topics.decisions, 2): None, (topics.rewards, 2): None})
        base = 1_800_000_000_000
        batch = [H.Message(topics.rewards, 2, i, base + 5_000 + i) for i in range(3)]
        batch += [H.Message(topics.rewards, 2, 3, eof=True), H.Message(topics.decisions, 2, 0, base)]
        out = reader._take(batch, time.time() * 1000)
        assert [(m.topic(), m.offset()) for m in out] == [(topics.decisions, 0)]
        assert reader.complete_at(topics.rewards, 2, None) is None  # nothing handled, all held
        out = reader._take([H.Message(topics.decisions, 2, 1, base + 5_001)], time.time() * 1000)
        assert [m.offset() for m in out] == [1, 0, 1]
        assert reader.complete_at(topics.rewards, 2, 2) is None  # one still held
        out = reader._take([H.Message(topics.decisions, 2, 2, eof=True)], time.time() * 1000)
        assert [m.offset() for m in out] == [2]
        reader.contact[(topics.rewards, 2)] = time.time() * 1000  # its broker answered (librdkafka's statistics)
        assert reader.complete_at(topics.rewards, 2, 3) is not None  # every reward handled
    finally:
        reader.close()


def test_a_broker_heard_again_after_a_silence_marks_when_it_came_back():
    """librdkafka's statistics report each broker's time since it last received (rxidle): over
    the silence limit (or not connected: -1) the broker is away; the first report after that
    in which it answered again sets the partitions' resumed time (the answer's wall time)."""
    reader = SourceReader.__new__(SourceReader)  # only the statistics handling: no consumer
    reader.contact, reader.resumed, reader._silent, reader.silence_ms = {}, {}, {}, 1000.0
    reader.silenced, reader._last_heard = {}, {}

    def report(idle_ms: float) -> None:
        broker = {"nodeid": 1, "rxidle": int(idle_ms * 1000),
                  "toppars": {"d-0": {"topic": "d", "partition": 0}, "r-0": {"topic": "r", "partition": 0}}}
        reader._stats(json.dumps({"brokers": {"b1": broker, "bootstrap": {"nodeid": -1, "rxidle": 5}}}))

    report(100)
    assert reader.resumed_at("d", 0) is None and reader.contact[("d", 0)] > 0  # answering: never away
    assert reader.outage("r", 0) is None
    report(600)
    heard = reader.contact[("r", 0)]
    report(4_000)  # silent for 4 s
    assert reader.resumed_at("r", 0) is None
    assert reader.outage("r", 0) == (heard, None)  # away since it was last heard, and still
    before = time.time() * 1000
    report(50)  # heard again, 50 ms ago
    back = reader.resumed_at("r", 0)
    assert back is not None and before - 100 <= back <= time.time() * 1000 and reader.resumed_at("d", 0) == back
    assert reader.outage("d", 0) == (heard, back)
    report(80)
    assert reader.resumed_at("r", 0) == back  # only a new silence moves it
    reader._stats(json.dumps({"brokers": {"b1": {"nodeid": 1, "rxidle": -1, "toppars": {}}}}))  # disconnected
    report(20)
    assert reader.resumed_at("r", 0) > back
    # no report for 5 s (the reading thread did not poll): it cannot tell, so it counts as away
    gap_start = reader._last_heard[1] = time.time() * 1000 - 5_000
    report(30)
    silenced, resumed = reader.outage("d", 0)
    assert silenced == gap_start and resumed >= gap_start + 4_900
    # a report written 2 s before it is read: rxidle counts to when it was written (its ts)
    stale = {"ts": int(time.monotonic() * 1e6) - 2_000_000,
             "brokers": {"b1": {"nodeid": 1, "rxidle": 10_000, "toppars": {"d-0": {"topic": "d", "partition": 0}}}}}
    reader._stats(json.dumps(stale))
    assert abs(reader.contact[("d", 0)] - (time.time() * 1000 - 2_010)) < 100


def test_a_broker_heard_again_before_its_partitions_come_back_to_it_still_ends_their_outage():
    """A reconnect: the broker's partitions leave its statistics while it is away and come
    back a report or more after it answers again (librdkafka delegates them anew after a
    metadata refresh). The partitions it held when it went away are resumed when it answers,
    whatever the report lists; before, their outage never ended and their clocks stayed
    capped at the silence for good (the join then never fired the last windows)."""
    reader = SourceReader.__new__(SourceReader)  # only the statistics handling: no consumer
    reader.contact, reader.resumed, reader._silent, reader.silence_ms = {}, {}, {}, 1000.0
    reader.silenced, reader._last_heard = {}, {}
    parts = {"d-0": {"topic": "d", "partition": 0}, "r-0": {"topic": "r", "partition": 0}}

    def report(idle_ms: float, toppars: dict) -> None:
        reader._stats(json.dumps({"brokers": {"b1": {"nodeid": 1, "rxidle": int(idle_ms * 1000), "toppars": toppars}}}))

    report(100, parts)
    heard = reader.contact[("r", 0)]
    report(-0.001, {})  # disconnected: no receive yet, its partitions with no broker
    assert reader.outage("r", 0) == (heard, None)
    before = time.time() * 1000
    report(30, {})  # connected again, answering; the partitions not delegated back yet
    back = reader.resumed_at("r", 0)
    assert back is not None and back >= before - 100 and reader.resumed_at("d", 0) == back
    assert reader.outage("r", 0) == (heard, back) and reader.outage("d", 0) == (heard, back)
    report(40, parts)  # and back in its report: nothing changes
    assert reader.outage("r", 0) == (heard, back)


def test_a_gap_is_read_again_before_the_partition_counts_as_read_to_its_end(kafka, topics):
    """The reader is placed at 8 while its gap check expects 5, as when a fetch at 5 was
    answered from 8 (Tansu, two producers on a partition: streams._gaps). 5..7 come, in
    order, before anything after them, and the partition is not read to its end meanwhile."""
    ensure_topics(kafka, topics)
    producer = Producer(kafka.producer_config())
    base = int(time.time() * 1000) - 60_000
    for i in range(10):
        producer.produce(topics.decisions, f"d{i}".encode(), partition=3, timestamp=base + i)
    producer.flush(10)
    reader = SourceReader(
        kafka.consumer_config(f"reader-{topics.decisions}"), topics.decisions, topics.rewards,
        hold=RewardHold(0, 1000), fetch_wait_ms=100, batch_max=1000, gap_confirm_s=0.5,
    )  # fmt: skip
    try:
        reader.assign({(topics.decisions, 3): 8, (topics.rewards, 3): None})
        reader.gaps.expected[(topics.decisions, 3)] = 5
        first, deadline = reader.read(0.5)[1], time.monotonic() + 10
        while not first and not reader.gaps.held:
            assert time.monotonic() < deadline, "8 and 9 were never fetched"
            first = reader.read(0.2)[1]
        assert first == [] and (topics.decisions, 3) in reader.gaps.held  # 8 and 9 held back
        assert reader.complete_at(topics.decisions, 3, 10) is None
        got = [m.value().decode() for m in _read_all(reader, 5)]
        assert got == ["d5", "d6", "d7", "d8", "d9"]
        assert reader.gaps.rereads == 1 and reader.gaps.holes == 0
    finally:
        reader.close()
