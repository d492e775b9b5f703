"""The joined log read back for evaluation: from the updates topic on the real broker (a
time range, undecodable records counted and passed over) and from Avro files, lined up as
LoggedBandit arrays over one action universe."""

from __future__ import annotations

import gc
import random
import time
import uuid

import fastavro
import numpy as np
import pytest
from confluent_kafka import Producer

import schemas
from learner.evaluation.logged import LoggedBandit
from streams.evaluation_log import LogRange, read_update_files, read_updates
from streams.serde import AvroSerde
from streams.settings import TopicSettings
from streams.topics import ensure_topics
from tests.learn_helpers import produce

T0 = 1_800_000_000_000
ARMS = ("a", "b", "c", "d")


def update(i: int, rng: random.Random, *, domain: str = "routing", mode: str = "live", t: int | None = None) -> dict:
    k = rng.randint(2, 4)
    actions = rng.sample(ARMS, k)
    p = np.array([rng.random() + 0.1 for _ in actions])
    p = (p / p.sum()).tolist()
    chosen = rng.randrange(k)
    return {
        "event_id": f"e-{i:06d}", "tenant": "default", "workspace": "main", "domain": domain,
        "arm": actions[chosen], "arm_index": chosen, "actions": actions, "probabilities": p,
        "probability": p[chosen], "features": [1.0, rng.gauss(0, 1), rng.gauss(0, 1)], "feature_hash": "fh",
        "reward": rng.random(), "signals": {}, "reward_count": 1, "join_status": "rewarded", "mode": mode,
        "policy_version": f"1.0.{i % 3}", "decision_time": T0 + i if t is None else t, "reward_time": None,
        "weight": 1.0,
    }  # fmt: skip


def test_updates_line_up_over_one_action_universe_in_decision_time_order():
    rng = random.Random(1)
    rows = [update(i, rng, t=T0 + (7 * i) % 50) for i in range(50)]
    rows += [update(100, rng, domain="other"), update(101, rng, mode="shadow"), dict(rows[3])]
    log = LoggedBandit.from_updates(rows, domain="routing")
    assert len(log) == 50 and log.skipped == {"other_domain": 1, "mode_shadow": 1, "duplicate": 1}
    assert (np.diff(log.decision_time) >= 0).all()
    assert sorted(log.actions) == sorted(ARMS)
    np.testing.assert_allclose(log.logged_dist.sum(axis=1), 1.0)
    by_id = {u["event_id"]: u for u in rows[:50]}
    for i in range(len(log)):
        u = by_id[log.event_id[i]]
        assert log.actions[log.action[i]] == u["arm"]
        assert log.pscore[i] == u["probability"] and log.reward[i] == u["reward"]
        assert {log.actions[k] for k in np.flatnonzero(log.candidates[i])} == set(u["actions"])
        assert (log.logged_dist[i][~log.candidates[i]] == 0).all()
        assert log.context[i].tolist() == u["features"]
    assert len(log.select(log.policy_version == "1.0.1")) == sum(1 for u in rows[:50] if u["policy_version"] == "1.0.1")


def test_rows_of_two_feature_configurations_are_refused_by_name():
    rng = random.Random(2)
    rows = [update(0, rng), {**update(1, rng), "feature_hash": "other"}]
    with pytest.raises(ValueError, match="evaluate one feature configuration at a time"):
        LoggedBandit.from_updates(rows)


def test_the_updates_topic_is_read_back_in_a_time_range_past_records_that_do_not_decode(kafka, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    topics = TopicSettings(decisions=f"t-{suffix}.d", rewards=f"t-{suffix}.r", updates=f"t-{suffix}.u",
                           posterior=f"t-{suffix}.p", deadletter=f"t-{suffix}.x", partitions=2, update_partitions=3)
    ensure_topics(kafka, topics)
    rng = random.Random(3)
    rows = [update(i, rng) for i in range(3000)]
    serde = AvroSerde("update", framing="single_object")
    items = [(u["event_id"], serde.encode(u)) for u in rows] + [("junk", b"\x07not an update")] * 5
    produce(kafka, topics.updates, items)
    seen = []
    kept, report = read_updates(kafka, topics.updates, serde, log_range=LogRange(since_ms=T0 + 1000, until_ms=T0 + 2500),
                                progress=seen.append)
    assert report.records == 3005 and report.undecodable == 5 and report.kept == 1500 == len(kept)
    assert report.out_of_range == 1500 and sum(report.ends.values()) == 3005 and seen[-1] == 3005
    assert sorted(u["event_id"] for u in kept) == [u["event_id"] for u in rows[1000:2500]]
    log = LoggedBandit.from_updates(kept)
    assert len(log) == 1500 and log.decision_time[0] == T0 + 1000

    everything, whole = read_updates(kafka, topics.updates, serde, progress=seen.append)  # no range: the fast path
    assert whole.records == 3005 and whole.undecodable == 5 and whole.kept == 3000 and whole.out_of_range == 0
    assert sorted(u["event_id"] for u in everything) == [u["event_id"] for u in rows] and seen[-1] == 3005
    assert gc.isenabled()  # reading turns the collector off and back on

    path = tmp_path / "updates.avro"
    with open(path, "wb") as handle:
        fastavro.writer(handle, schemas.parsed("update"), rows)
    from_file, file_report = read_update_files([path], log_range=LogRange(until_ms=T0 + 10))
    assert file_report.records == 3000 and [u["event_id"] for u in from_file] == [u["event_id"] for u in rows[:10]]


def test_a_time_range_keeps_exactly_the_updates_decided_in_it_whatever_the_seek_finds(kafka):
    """Reading from ``since_ms`` first seeks by record time to 10 minutes before it (an update
    is written after its decision), so a broker that answers ListOffsets by time skips a week
    of older log. Tansu answers offset 0 for any time: the seek must then cost only speed."""
    suffix = uuid.uuid4().hex[:8]
    topic = f"t-{suffix}.u"
    ensure_topics(kafka, TopicSettings(decisions=f"t-{suffix}.d", rewards=f"t-{suffix}.r", updates=topic,
                                       posterior=f"t-{suffix}.p", deadletter=f"t-{suffix}.x", partitions=2, update_partitions=2))
    now = int(time.time() * 1000)
    rng = random.Random(4)
    serde = AvroSerde("update", framing="single_object")
    old = [update(i, rng, t=now - 7 * 86_400_000 + i) for i in range(400)]
    new = [update(1000 + i, rng, t=now - 60_000 + i) for i in range(300)]
    producer = Producer(kafka.producer_config())
    for u in [*old, *new]:  # each written when it was decided
        producer.produce(topic, key=u["event_id"], value=serde.encode(u), timestamp=u["decision_time"])
    assert producer.flush(30) == 0
    kept, report = read_updates(kafka, topic, serde, log_range=LogRange(since_ms=now - 3_600_000))
    assert sorted(u["event_id"] for u in kept) == sorted(u["event_id"] for u in new)
    assert report.records - report.out_of_range == len(new) and report.out_of_range in (0, len(old))


def test_a_row_whose_arm_index_is_outside_its_actions_is_refused_by_event_id():
    rng = random.Random(5)
    rows = [update(0, rng), {**update(1, rng), "arm_index": 7}]
    with pytest.raises(ValueError, match="'e-000001' logs arm_index 7"):
        LoggedBandit.from_updates(rows)
