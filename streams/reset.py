"""Model resets as markers in the updates log.

A reset returns a domain's models to their priors. The learner's state is a fold of the updates
log, so the reset is a record *in* that log: one marker (``reset = true``) on every partition
of the updates topic, since a domain's models are spread over all of them. Each learner shard
folds the updates before its marker, returns the domain's models to their priors at the marker
and learns on from there. A replay, a restart or a rebuild meets the marker at the same offset,
so the state after a reset is as exact as any other (see :mod:`streams._learn_shard`).

The updates before the marker stay in the log: they are still good evidence for evaluation. A
marker is not a decision, and every reader of decisions skips it (:func:`is_reset`); its
``mode`` is ``off``, so even a reader that does not know the field never learns from it.

    offsets = send_reset(kafka, "bandit.updates", serde, "default", "main", "llm_routing")
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from streams.errors import BanditstreamError
from streams.evaluation_log import topic_partitions
from streams.serde import AvroSerde
from streams.settings import KafkaSettings

__all__ = ["ResetError", "is_reset", "reset_marker", "send_reset"]


class ResetError(BanditstreamError):
    """The reset markers were not all written: the reset did not happen everywhere."""

    reason = "reset_not_written"


def is_reset(update: Mapping[str, Any]) -> bool:
    """Whether a decoded update is a reset marker rather than a decision."""
    return bool(update.get("reset"))


def reset_marker(tenant: str, workspace: str, domain: str, *, event_id: str | None = None, now_ms: int | None = None) -> dict[str, Any]:
    """The marker record: only the ids, the time and ``reset`` mean anything."""
    return {
        "event_id": event_id or f"reset-{uuid.uuid4().hex}",
        "tenant": tenant,
        "workspace": workspace,
        "domain": domain,
        "arm": "",
        "arm_index": 0,
        "actions": [],
        "probabilities": [],
        "probability": 1.0,
        "features": [],
        "feature_hash": "",
        "reward": 0.0,
        "signals": {},
        "reward_count": 0,
        "join_status": "default",
        "mode": "off",
        "policy_version": "",
        "channel": "stable",
        "recommended_probabilities": [],
        "recommended_version": "",
        "decision_time": int(time.time() * 1000) if now_ms is None else now_ms,
        "reward_time": None,
        "weight": 0.0,
        "candidate_features": [],
        "reset": True,
    }


def send_reset(
    kafka: KafkaSettings, topic: str, serde: AvroSerde, tenant: str, workspace: str, domain: str, *, timeout_s: float = 30.0
) -> dict[int, int]:
    """Write one reset marker of ``domain`` to every partition of ``topic``; returns the offset
    each landed at. Raises :class:`ResetError` unless every partition acknowledged its marker
    (the learners that did get one reset; sending again resets those once more, harmlessly)."""
    partitions = topic_partitions(kafka, topic)
    value = serde.encode(reset_marker(tenant, workspace, domain))
    key = f"{tenant}/{workspace}/{domain}"
    landed: dict[int, int] = {}
    errors: list[str] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is None:
            landed[message.partition()] = message.offset()
        else:
            errors.append(f"partition {message.partition()}: {error.str()}")

    producer = Producer(kafka.producer_config())
    for partition in partitions:
        producer.produce(topic, value=value, key=key, partition=partition, on_delivery=delivered)
    remaining = producer.flush(timeout_s)
    if remaining or errors or len(landed) != len(partitions):
        missing = sorted(set(partitions) - set(landed))
        why = "; ".join(errors) if errors else f"no acknowledgement within {timeout_s:g} s"
        raise ResetError(f"{topic} partitions", missing, f"the reset markers of {domain!r} were not written there ({why})")
    return landed
