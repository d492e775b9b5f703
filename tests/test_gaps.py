"""GapCheck: a gap in a partition's offsets is read again before it counts as a hole.

The rules on a scripted consumer and clock first, then the seek-and-pause against the real
broker: a passing gap (the reader is made to expect offsets the consumer was placed past)
and real holes (a transactional producer's control records, which librdkafka hides).
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from streams._gaps import GapCheck
from streams.topics import ensure_topics
from tests import join_helpers as H


class _Consumer:
    """Records what GapCheck asks of librdkafka."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def pause(self, tps) -> None:
        self.calls += [("pause", tp.topic, tp.partition) for tp in tps]

    def resume(self, tps) -> None:
        self.calls += [("resume", tp.topic, tp.partition) for tp in tps]

    def seek(self, tp) -> None:
        self.calls.append(("seek", tp.topic, tp.partition, tp.offset))


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _admitted(check: GapCheck, offsets, partition: int = 0) -> list[int]:
    return [o for o in offsets if check.admit(H.Message("t", partition, o))]


def test_a_passing_gap_is_read_again_from_the_offset_missing_and_nothing_is_skipped():
    consumer, clock = _Consumer(), _Clock()
    check = GapCheck(consumer, 1.0, clock=clock)
    check.expect({("t", 0): 10, ("t", 1): None})
    assert _admitted(check, [10, 11, 15, 16, 17]) == [10, 11]  # 12..14 missing: 15 on is held back
    assert consumer.calls == [("pause", "t", 0), ("seek", "t", 0, 12)]
    assert check.held == {("t", 0): 101.0} and check.rereads == 1
    assert _admitted(check, [3, 4], partition=1) == [3, 4]  # other partitions read on; None: the first sets it

    clock.now = 100.9
    check.tick()
    assert ("resume", "t", 0) not in consumer.calls  # not before its wait is over
    clock.now = 101.0
    check.tick()
    assert consumer.calls[-1] == ("resume", "t", 0) and not check.held
    assert _admitted(check, [12, 13, 14, 15, 16]) == [12, 13, 14, 15, 16]  # there now: in order
    assert check.holes == 0 and not check.sighted


def test_a_gap_still_there_when_read_again_after_the_wait_is_a_hole(caplog):
    consumer, clock = _Consumer(), _Clock()
    check = GapCheck(consumer, 1.0, clock=clock)
    check.expect({("t", 0): 5})
    assert _admitted(check, [5, 7]) == [5]
    clock.now = 101.5
    check.tick()
    with caplog.at_level(logging.INFO, logger="banditstream.gaps"):
        assert _admitted(check, [7, 8]) == [7, 8]
    assert check.holes == 1 and check.rereads == 1
    assert "offsets 6..6 still missing 1.5s after first seen: a hole in the log" in caplog.text


def test_a_new_gap_while_reading_again_starts_its_own_wait():
    consumer, clock = _Consumer(), _Clock()
    check = GapCheck(consumer, 1.0, clock=clock)
    check.expect({("t", 0): 0})
    assert _admitted(check, [0, 3]) == [0]
    clock.now = 101.0
    check.tick()
    assert _admitted(check, [1, 5]) == [1]  # 1 came; now 2..4 are missing: a fresh gap
    assert check.held == {("t", 0): 102.0} and consumer.calls[-1] == ("seek", "t", 0, 2)
    assert check.rereads == 2 and check.holes == 0


def test_without_a_wait_a_gap_is_a_hole_at_once_and_a_step_back_is_read_as_it_comes():
    consumer = _Consumer()
    check = GapCheck(consumer, 0.0)
    check.expect({("t", 0): 0})
    assert _admitted(check, [0, 1, 4, 5]) == [0, 1, 4, 5]
    assert check.holes == 1 and consumer.calls == []
    assert _admitted(check, [2, 3]) == [2, 3]  # read again from further back (a reassignment)
    assert check.expected[("t", 0)] == 4


def test_a_partition_the_caller_paused_is_left_for_it_to_resume_and_a_revoked_one_is_forgotten():
    consumer, clock = _Consumer(), _Clock()
    check = GapCheck(consumer, 0.5, clock=clock)
    check.expect({("t", 0): 0, ("t", 1): 0})
    assert _admitted(check, [2]) == [] and _admitted(check, [4], partition=1) == []
    clock.now = 101.0
    check.tick(blocked=[("t", 0)])
    assert [c for c in consumer.calls if c[0] == "resume"] == [("resume", "t", 1)]
    assert not check.held  # t/0 is the caller's to resume (its flow control)
    check.expect({("t", 1): 0})
    assert _admitted(check, [3], partition=1) == [] and ("t", 1) in check.held
    check.forget([("t", 1)])
    assert ("t", 1) not in check.expected and not check.held and ("t", 1) not in check.sighted
    assert consumer.calls[-1] == ("resume", "t", 1)  # not left paused for a later assignment


def test_an_end_past_the_last_record_is_read_again_then_the_partition_is_read_to_its_last_record():
    """A transaction's last control record: the end is reported past the last record, with
    no record after the gap to show it. Read again, then the partition is read up to its
    last record, and reading goes on at the end."""
    consumer, clock = _Consumer(), _Clock()
    check = GapCheck(consumer, 1.0, clock=clock)
    check.expect({("t", 0): 0})
    assert _admitted(check, [0, 1, 2, 3, 4]) == [0, 1, 2, 3, 4]
    assert check.end(("t", 0), 6) is None  # 5 missing: read again
    assert consumer.calls == [("pause", "t", 0), ("seek", "t", 0, 5)]
    assert check.end(("t", 0), 6) is None  # (reported before the seek)
    clock.now = 101.0
    check.tick()
    assert check.end(("t", 0), 6) == 5 and check.holes == 1
    assert _admitted(check, [6, 7]) == [6, 7]
    assert check.end(("t", 0), 8) == 8  # an end right after the last record: read to it at once

    at_once = GapCheck(_Consumer(), 0.0)
    at_once.expect({("t", 0): 5})
    assert at_once.end(("t", 0), 6) == 5 and at_once.holes == 1
    assert at_once.end(("t", 1), 3) == 3  # nothing expected: the end is what it is


def _read(consumer: Consumer, check: GapCheck, until: int, timeout_s: float = 30.0) -> list[int]:
    got: list[int] = []
    deadline = time.monotonic() + timeout_s
    while until not in got:
        assert time.monotonic() < deadline, f"read {got}"
        messages = consumer.consume(100, 0.1)
        check.tick()
        got += [m.offset() for m in messages if m.error() is None and check.admit(m)]
    return got


def test_against_the_broker_a_gap_is_sought_back_and_read_again_in_order(kafka, topics):
    """The consumer is placed at 8 while the check expects 5, as when a fetch stepped over
    5..7: it seeks back, waits, and reads 5.. in order, each once."""
    ensure_topics(kafka, topics)
    producer = Producer(kafka.producer_config())
    for i in range(12):
        producer.produce(topics.decisions, f"d{i}".encode(), partition=0)
    producer.flush(10)
    consumer = Consumer(kafka.consumer_config(f"gaps-{topics.decisions}"))
    try:
        consumer.assign([TopicPartition(topics.decisions, 0, 8)])
        check = GapCheck(consumer, 0.3)
        check.expect({(topics.decisions, 0): 5})
        started = time.monotonic()
        assert _read(consumer, check, 11) == list(range(5, 12))
        assert time.monotonic() - started >= 0.3
        assert check.rereads == 1 and check.holes == 0
    finally:
        consumer.close()


def test_against_the_broker_a_transactions_control_records_are_holes_taken_after_the_wait(kafka, topics):
    """Each committed transaction leaves a control record that librdkafka does not hand over:
    a real hole. Read again once, then taken; every record arrives, in order."""
    ensure_topics(kafka, topics)
    producer = Producer(kafka.producer_config(**{"transactional.id": f"gaps-{topics.decisions}"}))
    producer.init_transactions(30)
    for t in range(3):
        producer.begin_transaction()
        for i in range(4):
            producer.produce(topics.decisions, f"t{t}-{i}".encode(), partition=1)
        producer.commit_transaction(30)
    consumer = Consumer(kafka.consumer_config(f"gaps-{topics.decisions}"))
    try:
        consumer.assign([TopicPartition(topics.decisions, 1, 0)])
        check = GapCheck(consumer, 0.2)
        check.expect({(topics.decisions, 1): 0})
        got = _read(consumer, check, 13)  # 4 records, a marker, 4, a marker, 4
        assert got == [0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13]
        assert check.holes == 2 and check.rereads == 2
    finally:
        consumer.close()
