"""RewardHold: rewards handed to the join in time order with their partition's decisions."""

from __future__ import annotations

from dataclasses import dataclass

from streams._join_reader import RewardHold


@dataclass
class Record:
    offset: int
    timestamp: float  # seconds, as faust's ConsumerMessage carries it


def test_a_reward_waits_until_a_decision_stamped_up_to_the_lead_before_it_is_read():
    hold = RewardHold(lead_ms=100, max_held=10)
    rewards = [Record(i, 10.0 + 0.1 * i) for i in range(6)]  # 10.0 .. 10.5 s
    for record in rewards:
        hold.reward(0, int(record.timestamp * 1000), record)
    assert hold.release(lambda p: False) == []  # no decision read yet
    hold.decision(0, 10_150)
    assert [r.offset for r in hold.release(lambda p: False)] == [0, 1, 2]  # up to 10.25 s
    hold.decision(0, 10_000)  # an older decision moves nothing back
    assert hold.release(lambda p: False) == []
    assert hold.count(0) == 3
    assert [r.offset for r in hold.release(lambda p: True)] == [3, 4, 5]  # decisions read to the end
    assert hold.count(0) == 0


def test_partitions_are_held_apart_and_over_names_those_to_pause():
    hold = RewardHold(lead_ms=0, max_held=2)
    for i in range(3):
        hold.reward(1, 5000, Record(i, 5.0))
    hold.reward(2, 5000, Record(0, 5.0))
    hold.decision(2, 5_000)
    assert hold.over() == {1}
    assert [r.offset for r in hold.release(lambda p: False)] == [0]  # partition 2 only
    assert hold.count(1) == 3
    released = hold.release(lambda p: p == 1)
    assert [r.offset for r in released] == [0, 1, 2] and hold.over() == set()


def test_offset_order_is_kept_even_when_a_reward_is_stamped_out_of_order():
    hold = RewardHold(lead_ms=0, max_held=10)
    hold.reward(0, 9000, Record(0, 9.0))
    hold.reward(0, 20000, Record(1, 20.0))  # a producer clock ahead
    hold.reward(0, 9500, Record(2, 9.5))
    hold.decision(0, 10_000)
    assert [r.offset for r in hold.release(lambda p: False)] == [0]  # 2 waits behind 1
    hold.clear()
    assert hold.count(0) == 0 and hold.decisions_at == {}
