"""Which partition a keyed record belongs to, as the producers place it.

The join needs a decision and its rewards on one partition: both are keyed by ``event_id``
and placed by the same partitioner. A producer that uses another partitioner, or sets the
partition by hand, or sends no key, puts a reward where its decision never is; the join
dead-letters such records (``null_key``, ``wrong_partition``) instead of learning the
decision with the default reward.

Two partitioners are known, by their librdkafka names (``kafka.partitioner`` in the config):

* ``murmur2_random`` (the default): Kafka's own, as the Java client and most of the
  ecosystem place keys: ``(murmur2(key) & 0x7fffffff) % partitions``;
* ``consistent_random``: librdkafka's default, ``crc32(key) % partitions``.

>>> key_partition(b"event-1", 4, "murmur2_random") == (murmur2(b"event-1") & 0x7FFFFFFF) % 4
True
"""

from __future__ import annotations

import zlib

from streams._avrofast import murmur2

__all__ = ["PARTITIONERS", "key_partition", "murmur2", "murmur2_reference"]

PARTITIONERS = ("murmur2_random", "consistent_random")


def key_partition(key: bytes, partitions: int, partitioner: str = "murmur2_random") -> int:
    """The partition the named partitioner places a non-empty ``key`` in."""
    if partitioner == "murmur2_random":
        return (murmur2(key) & 0x7FFFFFFF) % partitions
    if partitioner == "consistent_random":
        return zlib.crc32(key) % partitions
    raise ValueError(f"partitioner must be one of {', '.join(PARTITIONERS)}, got {partitioner!r}")


def murmur2_reference(key: bytes) -> int:
    """Kafka's murmur2 in plain Python (the compiled :func:`murmur2` is checked against it)."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    length = len(key)
    h = (0x9747B28C ^ length) & mask
    full = length - length % 4
    for i in range(0, full, 4):
        k = int.from_bytes(key[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = (h * m) & mask
        h ^= k
    tail = length % 4
    if tail == 3:
        h ^= key[full + 2] << 16
    if tail >= 2:
        h ^= key[full + 1] << 8
    if tail >= 1:
        h ^= key[full]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h
