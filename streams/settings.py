"""The Kafka-side sections of the configuration tree: broker, schema registry, topics.

``banditstream.config`` composes these into the one tree it loads (file, then environment)
and passes down; this module only says what the sections are and what values are valid.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from streams.profiles import BrokerProfile, get_profile, PROFILES


#: Where every client's librdkafka log lines go (served by its poll()), not straight to stderr.
LIBRDKAFKA_LOG = logging.getLogger("banditstream.librdkafka")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KafkaSettings(_Section):
    """How to reach the broker."""

    bootstrap_servers: str = Field("127.0.0.1:9092", min_length=1, description="host:port[,host:port...]")
    profile: str = Field("kafka", description=f"broker compatibility profile: {', '.join(sorted(PROFILES))}")
    client_id: str = "banditstream"
    #: How producers place keyed records; the join refuses a record not where its key belongs.
    partitioner: Literal["murmur2_random", "consistent_random"] = Field(
        "murmur2_random",
        description="key placement of every producer: murmur2_random (Kafka's, as the Java client) or consistent_random",
    )
    #: Extra librdkafka settings for every client (security.protocol, sasl.*, ...).
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        get_profile(value)
        return value

    @field_validator("bootstrap_servers")
    @classmethod
    def _host_port_list(cls, value: str) -> str:
        for server in value.split(","):
            host, sep, port = server.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{server.strip()!r} is not host:port")
        return value

    @property
    def broker_profile(self) -> BrokerProfile:
        return get_profile(self.profile)

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """A plain librdkafka config dict for an admin client (no profile extras)."""
        base = {"bootstrap.servers": self.bootstrap_servers, "client.id": self.client_id, "logger": LIBRDKAFKA_LOG}
        return {**base, **self.extra, **overrides}

    def producer_config(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka producer settings: idempotent, profile extras, then user extras."""
        # Back within a second of a broker's return (librdkafka waits up to 10 s between
        # reconnects): what a producer spooled meanwhile is late by the outage, not by that.
        base = {"enable.idempotence": True, "linger.ms": 5, "partitioner": self.partitioner,
                "reconnect.backoff.max.ms": 1000, **self.broker_profile.producer}
        return {**base, **self.client_config(), **overrides}

    def consumer_config(self, group_id: str, **overrides: Any) -> dict[str, Any]:
        """librdkafka consumer settings for a group; offsets are committed explicitly."""
        base = {
            "group.id": group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **self.broker_profile.consumer,
        }
        return {**base, **self.client_config(), **overrides}


class RegistrySettings(_Section):
    """Schema registry, or none: without a URL events use the Avro single-object encoding."""

    url: str | None = Field(
        None, description="http(s)://... of a Confluent-compatible registry, or mock://NAME: confluent-kafka's registry "
        "inside one process, for tests and the demo only (the workers and serve refuse it)",
    )  # fmt: skip
    framing: Literal["confluent", "single_object"] | None = Field(
        None, description="wire framing for produced events; default: confluent with a registry, else single_object"
    )
    subject_strategy: Literal["topic", "record", "topic_record"] = "topic"

    @model_validator(mode="after")
    def _framing_needs_registry(self) -> "RegistrySettings":
        if self.framing == "confluent" and not self.url:
            raise ValueError("framing 'confluent' needs registry.url")
        return self

    @property
    def effective_framing(self) -> str:
        return self.framing or ("confluent" if self.url else "single_object")


class TopicSettings(_Section):
    """Names and shapes of the project's topics."""

    decisions: str = "bandit.decisions"
    rewards: str = "bandit.rewards"
    updates: str = "bandit.updates"
    posterior: str = "bandit.posterior"
    deadletter: str = "bandit.deadletter"
    #: Partitions of decisions and rewards (they must be equal: co-partitioned by event_id).
    partitions: int = Field(8, ge=1, le=10_000)
    #: Partitions of the updates topic: one learner shard each.
    update_partitions: int = Field(8, ge=1, le=10_000)
    replication: int = Field(1, ge=1, le=16)
    #: Retention of the event topics (decisions, rewards, updates, deadletter); -1 keeps forever.
    retention_ms: int = Field(7 * 24 * 3600 * 1000, ge=-1)

    @model_validator(mode="after")
    def _distinct_names(self) -> "TopicSettings":
        names = [self.decisions, self.rewards, self.updates, self.posterior, self.deadletter]
        if len(set(names)) != len(names):
            raise ValueError(f"topic names must be distinct, got {names}")
        return self

    def names(self) -> dict[str, str]:
        """Role -> topic name."""
        return {
            "decisions": self.decisions,
            "rewards": self.rewards,
            "updates": self.updates,
            "posterior": self.posterior,
            "deadletter": self.deadletter,
        }
