"""Broker compatibility profiles: what a Kafka-compatible broker needs from our clients.

The code talks Kafka; everything a particular broker needs beyond the protocol lives here
and nowhere else. ``kafka`` is any real Apache Kafka (or a faithful service). ``tansu`` is
the Tansu broker the embedded stack and the tests run (memory storage), whose known
defects (shared/INFRA.md) we design around:

- a queried end offset (high watermark) is the base offset of the last batch + 1, so no
  code may rely on a queried end offset — workers track offsets from fetched records;
- faust table recovery trips on that unless the producer sends one record per batch;
- aborted transactions are delivered to read_committed readers, so exactly-once
  processing is off: delivery is at-least-once with deduplicated, idempotent state;
- group joins wait session.timeout/2, so the session timeout is kept short;
- a fetch waiting at the log end is answered only when its wait runs out, not when records
  arrive meanwhile (measured: with a 1.5 s wait a record produced into a waiting fetch
  reached the consumer ~0.4-1.5 s later; with 0.1 s, within 0.1 s), so every consumer's
  fetch wait is kept short: a caught-up join stalled up to 1.5 s on faust's default;
- a produce raises the partition's end before it stores its batch, so with two producers on
  a partition a fetch can step over records stored a moment later: readers read a gap again
  for ``gap_confirm_s`` before they take it as a hole (streams._gaps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BrokerProfile:
    """Client settings that depend on the broker implementation."""

    name: str
    #: librdkafka settings merged into every consumer (before user overrides).
    consumer: dict[str, Any] = field(default_factory=dict)
    #: librdkafka settings merged into every producer (before user overrides).
    producer: dict[str, Any] = field(default_factory=dict)
    #: faust.App settings for the stream processors.
    faust: dict[str, Any] = field(default_factory=dict)
    #: Longest wait of a fetch for records (ms) for the join's aiokafka consumer; None keeps
    #: faust's 1500. (librdkafka consumers take ``fetch.wait.max.ms`` from ``consumer``.)
    fetch_max_wait_ms: int | None = None
    #: Whether a queried end offset (list_offsets / get_watermark_offsets) can be trusted.
    trusts_queried_end_offsets: bool = True
    #: Whether transactional exactly-once processing works end to end.
    supports_exactly_once: bool = True
    #: How long a gap in a partition's offsets must last before a reader takes it as a hole in
    #: the log (seconds; streams._gaps): 0 for a broker whose fetches never step over records
    #: still being stored.
    gap_confirm_s: float = 0.0


PROFILES: dict[str, BrokerProfile] = {
    "kafka": BrokerProfile(
        name="kafka",
        consumer={"session.timeout.ms": 10_000},
        faust={"broker_session_timeout": 10.0, "broker_heartbeat_interval": 3.0},
    ),
    "tansu": BrokerProfile(
        name="tansu",
        consumer={"session.timeout.ms": 6_000, "heartbeat.interval.ms": 500, "fetch.wait.max.ms": 100},
        faust={
            "producer_max_batch_size": 1,
            "broker_session_timeout": 6.0,
            "broker_heartbeat_interval": 0.5,
        },
        fetch_max_wait_ms=100,
        trusts_queried_end_offsets=False,
        supports_exactly_once=False,
        gap_confirm_s=1.0,
    ),
}


def get_profile(name: str) -> BrokerProfile:
    """The profile called ``name``; a clear error listing the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown broker profile {name!r}; known: {known}") from None
