"""Topic creation against the real broker: idempotent, shaped, co-partitioned."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from streams.settings import TopicSettings
from streams.topics import CoPartitioningError, TopicError, check_topics, ensure_topics


def test_topics_are_created_idempotently_with_their_partitions(kafka, topics):
    first = ensure_topics(kafka, topics)
    second = ensure_topics(kafka, topics)
    assert first == second
    assert first[topics.decisions] == first[topics.rewards] == topics.partitions
    assert first[topics.updates] == first[topics.posterior] == topics.update_partitions
    assert first[topics.deadletter] == 1
    ours = check_topics(kafka, topics)
    assert {name: ours[name] for name in first} == first  # the broker holds other tests' topics too


def test_broken_copartitioning_fails_with_a_clear_message(kafka, topics):
    admin = AdminClient(kafka.client_config())
    futures = admin.create_topics([NewTopic(topics.rewards, num_partitions=topics.partitions + 1, replication_factor=1)])
    futures[topics.rewards].result(15)
    with pytest.raises(CoPartitioningError) as info:
        ensure_topics(kafka, topics)
    message = str(info.value)
    assert topics.decisions in message and topics.rewards in message
    assert f"({topics.partitions} partitions)" in message and f"({topics.partitions + 1} partitions)" in message


def test_worker_start_check_names_a_missing_topic(kafka):
    missing = TopicSettings(decisions="nope.decisions", rewards="nope.rewards", updates="nope.updates",
                            posterior="nope.posterior", deadletter="nope.deadletter")
    with pytest.raises(TopicError, match="'nope.decisions' does not exist"):
        check_topics(kafka, missing)
