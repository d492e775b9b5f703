"""Rebuild a shard the local store lacks from the compacted posterior topic.

When a partition moves to a worker whose disk does not hold its shard (in Kubernetes: a
StatefulSet pod with its own volume), the new owner reads partition ``p`` of the posterior
topic, where the learner publishes every model of updates partition ``p``, to its end and
keeps the latest PosteriorShard per key. Each is a model's exact state at its own watermark
``w_k`` (every update of the partition below ``w_k`` is in it, none at or above).

Where to resume: each model's updates from ``w_k`` on are still to learn; a model with no
published state has none before the group's committed offset ``C``, because the learner
commits ``C`` only after a whole publication at ``C`` was delivered, and every owner's first
publication carries every model it holds. So the rebuild resumes at
``R = min(C, min_k w_k)`` and learns an update of model ``k`` only if its offset is at least
``w_k`` (``R`` for unpublished models): nothing is lost and nothing counted twice.

End of the partition is found from the fetch responses (``enable.partition.eof``), never from
a queried end offset, which some brokers (Tansu) get wrong.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from learner.store import ArmKey
from streams.errors import DecodeError
from streams.serde import AvroSerde
from streams.settings import KafkaSettings


class RebuildError(RuntimeError):
    """The posterior topic could not be read to its end."""


@dataclass(frozen=True)
class Published:
    """The latest PosteriorShard of one model, and its watermark on the updates partition."""

    key: ArmKey
    record: dict
    watermark: int


def read_published(
    kafka: KafkaSettings,
    posterior_topic: str,
    updates_topic: str,
    partitions: list[int],
    serde: AvroSerde,
    *,
    timeout: float = 60.0,
) -> dict[int, dict[ArmKey, Published]]:
    """Per partition ``p`` of ``partitions``: the latest PosteriorShard per key in
    ``posterior_topic[p]`` for ``updates_topic[p]``, all partitions read in one pass.

    Records that do not decode, or carry no watermark for ``updates_topic[p]``, are skipped
    (a publication for another partition has no place here).
    """
    latest: dict[int, dict[ArmKey, Published]] = {p: {} for p in partitions}
    if not partitions:
        return latest
    consumer = Consumer(
        kafka.consumer_config(
            "banditstream-learn-rebuild",  # assign() only: never joins the group or commits
            **{"enable.partition.eof": True, "enable.auto.commit": False, "fetch.wait.max.ms": 50},
        )
    )
    try:
        consumer.assign([TopicPartition(posterior_topic, p, OFFSET_BEGINNING) for p in partitions])
        ended: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(ended) < len(partitions):
            if time.monotonic() > deadline:
                missing = sorted(set(partitions) - ended)
                raise RebuildError(f"{posterior_topic} partitions {missing} not read to their end within {timeout:.0f}s")
            good = []
            for message in consumer.consume(1000, 0.5):
                error = message.error()
                if error is None:
                    if message.value() is not None:  # a tombstone deletes nothing we keep
                        good.append(message)
                elif error.code() == KafkaError._PARTITION_EOF:
                    ended.add(message.partition())
                else:
                    raise RebuildError(f"reading {posterior_topic}[{message.partition()}]: {error.str()}")
            for message, record in zip(good, serde.decode_batch([m.value() for m in good])):
                if isinstance(record, DecodeError):
                    continue
                partition = message.partition()
                watermark = next(
                    (
                        w["offset"]
                        for w in record["watermark"]
                        if w["topic"] == updates_topic and w["partition"] == partition
                    ),
                    None,
                )
                if watermark is None:
                    continue
                key = ArmKey(record["tenant"], record["workspace"], record["domain"], record["arm"])
                latest[partition][key] = Published(key, record, watermark)
        return latest
    finally:
        consumer.close()
