"""Create the project's topics idempotently and verify their shape.

decisions and rewards are co-partitioned (same partition count, both keyed by event_id
with the default partitioner), so one partition of the join sees a decision and all of its
rewards. updates holds one learner shard per partition; posterior is compacted (latest
state per shard key); deadletter keeps what workers could not use.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from streams.settings import KafkaSettings, TopicSettings


class TopicError(RuntimeError):
    """A topic is missing, could not be created, or has the wrong shape."""


class CoPartitioningError(TopicError):
    """decisions and rewards do not have the same number of partitions."""


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


def topic_specs(topics: TopicSettings) -> list[TopicSpec]:
    """What each topic should look like."""
    retention = {"retention.ms": str(topics.retention_ms)}
    return [
        TopicSpec(topics.decisions, topics.partitions, {**retention, "cleanup.policy": "delete"}),
        TopicSpec(topics.rewards, topics.partitions, {**retention, "cleanup.policy": "delete"}),
        TopicSpec(topics.updates, topics.update_partitions, {**retention, "cleanup.policy": "delete"}),
        TopicSpec(topics.posterior, topics.update_partitions, {"cleanup.policy": "compact"}),
        TopicSpec(topics.deadletter, 1, {**retention, "cleanup.policy": "delete"}),
    ]


def ensure_topics(kafka: KafkaSettings, topics: TopicSettings, *, timeout: float = 15.0) -> dict[str, int]:
    """Create whatever topic is missing; return name -> partition count of all of them.

    Existing topics are left alone (creation is idempotent), then the shape is verified:
    co-partitioning of decisions and rewards is a hard requirement of the join.
    """
    admin = admin_client(kafka)
    existing = _partition_counts(admin, timeout)
    missing = [spec for spec in topic_specs(topics) if spec.name not in existing]
    if missing:
        futures = admin.create_topics(
            [
                NewTopic(spec.name, num_partitions=spec.partitions, replication_factor=topics.replication, config=spec.config)
                for spec in missing
            ],
            operation_timeout=timeout,
            request_timeout=timeout,
        )
        for name, future in futures.items():
            try:
                future.result(timeout)
            except KafkaException as exc:
                error = exc.args[0]
                if error.name() != "TOPIC_ALREADY_EXISTS":  # a concurrent creator won: fine
                    raise TopicError(f"could not create topic {name!r}: {error.str()}") from None
    created = {spec.name: spec.partitions for spec in missing}
    counts = _wait_for_topics(admin, [spec.name for spec in topic_specs(topics)], created, timeout)
    verify_copartitioning(counts, topics)
    return counts


def verify_copartitioning(counts: dict[str, int], topics: TopicSettings) -> None:
    """Fail with a clear message when decisions and rewards are not co-partitioned."""
    for name in (topics.decisions, topics.rewards):
        if name not in counts:
            raise TopicError(f"topic {name!r} does not exist; run `banditstream topics create`")
    decisions, rewards = counts[topics.decisions], counts[topics.rewards]
    if decisions != rewards:
        raise CoPartitioningError(
            f"topics {topics.decisions!r} ({decisions} partitions) and {topics.rewards!r} ({rewards} partitions) "
            "must have the same number of partitions: the join needs a decision and its rewards on one partition"
        )


def check_topics(kafka: KafkaSettings, topics: TopicSettings, *, timeout: float = 10.0) -> dict[str, int]:
    """Verify at a worker's start-up that the topics exist and are co-partitioned."""
    counts = _partition_counts(admin_client(kafka), timeout)
    for name in topics.names().values():
        if name not in counts:
            raise TopicError(f"topic {name!r} does not exist; run `banditstream topics create`")
    verify_copartitioning(counts, topics)
    return counts


def admin_client(kafka: KafkaSettings) -> AdminClient:
    """An admin client whose broker refusals (authentication, TLS) :func:`_partition_counts`
    reports at once: librdkafka only retries them, so a wrong password would look like a
    broker that never answers."""
    refused: list[KafkaError] = []
    admin = AdminClient(kafka.client_config(error_cb=refused.append))
    admin.refused = refused
    return admin


_REFUSALS = (KafkaError._AUTHENTICATION, KafkaError._SSL)


def _partition_counts(admin: AdminClient, timeout: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            metadata = admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
        except KafkaException as exc:
            admin.poll(0)  # serves the error callbacks
            refusal = next((e for e in getattr(admin, "refused", []) if e.code() in _REFUSALS), None)
            if refusal is not None:
                raise TopicError(f"the broker refused this client: {refusal.str()} (check kafka.security_protocol, "
                                 "kafka.sasl_* and kafka.ssl_*)") from None
            if time.monotonic() < deadline:
                continue
            raise TopicError(f"cannot reach the broker: {exc.args[0].str()}") from None
        return {name: len(topic.partitions) for name, topic in metadata.topics.items() if topic.error is None}


def _wait_for_topics(admin: AdminClient, names: list[str], created: dict[str, int], timeout: float) -> dict[str, int]:
    """Metadata can lag creation by a moment; wait until every topic shows its partitions
    (all of them, for the topics just created)."""
    deadline = time.monotonic() + timeout
    while True:
        counts = _partition_counts(admin, timeout)
        settled = all(counts.get(name, 0) >= created.get(name, 1) for name in names)
        if settled or time.monotonic() > deadline:
            return {name: counts[name] for name in names if name in counts}
        time.sleep(0.1)
