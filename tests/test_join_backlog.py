"""Event time end to end: a backlog of 100,000 decision/reward pairs stamped an hour in the
past, produced at full speed (a spool drained after an outage, a producer catching up, a
backfill), joins exactly as the same events produced live would: every decision rewarded
with exactly its rewards stamped inside its window, the others with their default, and
only rewards stamped after their window dead-lettered as late.

(Measured before event time: 16,990 of 20,000 such rewards were dead-lettered as late.)
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter

import pytest

from learner.domain import DomainSettings
from streams.client import EventProducer
from streams.serde import AvroSerde
from streams.topics import ensure_topics
from tests import join_helpers as H
from tests.test_join_worker import _deadletters, _domains

PAIRS = 50_000
WINDOW_MS = 2_000


def backlog(seed: int, start_ms: int, pairs: int = PAIRS) -> tuple[list[tuple[str, dict]], dict[str, list[dict]], int]:
    """Decisions 1 ms apart and their rewards merged in event-time order, as a service logged
    them; (events, on-time rewards per decision, rewards stamped after their window)."""
    rng = random.Random(seed)
    events, on_time, late = [], {}, 0
    domains = list(H.DOMAINS)
    for i in range(pairs):
        ts = start_ms + i
        domain = domains[i % len(domains)]
        event_id = f"b-{i:06d}"
        events.append((ts, 0, "decision", H.decision(event_id, domain, rng, ts)))
        on_time[event_id] = []
        draw = rng.random()
        if draw < 0.7:  # rewarded in the window, now and then twice
            for j in range(1 + (draw < 0.1)):
                r = H.reward(event_id, f"{event_id}-r{j}", domain, rng, ts + rng.randint(1, WINDOW_MS))
                events.append((r["timestamp"], 1, "reward", r))
                on_time[event_id].append(r)
        elif draw < 0.75:  # after the window: late, whenever it is produced
            r = H.reward(event_id, f"{event_id}-late", domain, rng, ts + WINDOW_MS + rng.randint(1, 500))
            events.append((r["timestamp"], 1, "reward", r))
            late += 1
    events.sort(key=lambda e: (e[0], e[1]))
    return [(kind, event) for _, _, kind, event in events], on_time, late


@pytest.mark.parametrize(("pairs", "join_first"), [(PAIRS, True), (20_000, False)], ids=["join-running", "join-started-after"])
def test_a_backlog_stamped_an_hour_ago_at_full_speed_joins_as_live(kafka, topics, tmp_path, pairs, join_first):
    """``join-started-after``: the backlog is in both topics before the join first starts (a
    first deployment on topics with history). Its rewards wait in the reader's hold for their
    decisions while the rewards partitions report their end: that end must not count as read.
    (Measured before the fix: every decision of a partition learned its default.)"""
    ensure_topics(kafka, topics)
    domains = _domains(WINDOW_MS / 1000)
    config = H.settings(kafka, topics, tmp_path / "state", domains=domains).worker_config()
    events, on_time, late = backlog(seed=17, start_ms=H.now_ms() - 3_600_000, pairs=pairs)
    producer = EventProducer(kafka, **{"linger.ms": 20, "batch.num.messages": 10_000,
                                       "queue.buffering.max.messages": 1_000_000})
    serdes = {"decision": AvroSerde("decision", framing="single_object"), "reward": AvroSerde("reward", framing="single_object")}
    target = {"decision": topics.decisions, "reward": topics.rewards}

    def produce() -> None:
        for kind, event in events:
            producer.send_raw(target[kind], serdes[kind].encode(event), key=event["event_id"])
        producer.flush()

    if not join_first:
        produce()
    with H.JoinThread(config) as worker:
        if join_first:
            time.sleep(2.0)  # the join holds its partitions and is read to their (empty) ends: then the backlog comes
            produce()
        updates = H.read_topic(kafka, topics.updates, "update", until=H.every_event(on_time), idle_s=3, timeout_s=300,
                               check=worker.check)
        dead = _deadletters(kafka, topics, expect=late, check=worker.check)

    engines = {name: DomainSettings.model_validate(d).reward_engine() for name, d in domains.items()}
    joined = {}
    for _, u in updates:
        joined.setdefault(u["event_id"], (u["join_status"], u["reward_count"], u["reward"]))
    assert len(joined) == pairs and len(updates) == pairs  # one update each, none twice
    wrong = []
    for event_id, rewards in on_time.items():
        status, count, value = joined[event_id]
        expected_value = engines[rewards[0]["domain"]].aggregate(rewards)[0] if rewards else None
        if (status, count) != ("rewarded" if rewards else "default", len(rewards)) or (
                rewards and not math.isclose(value, expected_value, abs_tol=1e-9)):
            wrong.append((event_id, status, count, len(rewards)))
    assert not wrong, f"{len(wrong)} of {pairs} joined otherwise than live, e.g. {wrong[:5]}"
    assert Counter(r["reason"] for r in dead) == {"late_reward": late}
