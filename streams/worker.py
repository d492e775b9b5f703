"""What every worker process is given: one value built from the configuration tree.

The CLI builds it (``Settings.worker_config()``) and passes it down; workers read nothing
else (no globals, no environment).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from learner.domain import DomainSettings
from streams.serde import AvroSerde
from streams.settings import KafkaSettings, RegistrySettings, TopicSettings
from streams.validation import ValidationLimits


#: ``policy`` of the PosteriorShards that carry a join partition's normaliser statistics (its
#: ``state``: the JSON of :meth:`learner.features.Normalizer.export`; its ``arm``: ``p<partition>``)
#: next to the learners' models on the posterior topic; the publisher merges a domain's into
#: its snapshots, so the SDK z-scores features as the join did.
NORMALIZER_POLICY = "normalizer"

#: Room a dead letter needs around the refused bytes it carries (source, reason, message).
DEAD_LETTER_OVERHEAD = 64 << 10


def join_group(topics: TopicSettings) -> str:
    """The join's consumer group (its faust app's id), where it commits the offsets its state
    resumes from: what Kafka's tools and ``banditstream monitor`` measure its lag by."""
    return f"banditstream-join.{topics.decisions}"


@dataclass(frozen=True)
class WorkerConfig:
    kafka: KafkaSettings
    topics: TopicSettings
    registry: RegistrySettings
    domains: Mapping[str, DomainSettings]
    limits: ValidationLimits
    #: Root of this worker's local state (RocksDB files); each worker kind uses a subfolder.
    state_dir: Path
    #: Prometheus port; 0 picks a free one (the worker logs which).
    metrics_port: int = 0
    #: Address the metrics endpoint binds to (loopback unless a scraper elsewhere needs it).
    metrics_host: str = "127.0.0.1"
    tenant: str = "default"
    workspace: str = "main"
    extra: Mapping[str, Any] = field(default_factory=dict)

    def registry_client(self):
        """A schema registry client, or None when events use the single-object encoding."""
        return self.registry.client()

    def serde(self, name: str, topic: str | None = None, registry=None, skip: Collection[str] = ()) -> AvroSerde:
        """The serde for one event type in the configured framing (decoding reads both,
        leaving out the fields in ``skip``)."""
        return self.registry.serde(name, topic, client=registry, max_payload_bytes=self.limits.max_payload_bytes,
                                   skip=skip)

    def deadletter_serde(self, registry=None) -> AvroSerde:
        """The dead letters' serde: they carry the refused bytes, up to the payload limit."""
        return self.registry.serde("deadletter", self.topics.deadletter, client=registry,
                                   max_payload_bytes=self.limits.max_payload_bytes + DEAD_LETTER_OVERHEAD)
