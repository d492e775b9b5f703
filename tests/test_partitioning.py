"""Where a key belongs: the compiled murmur2 against Kafka's published values, and both
partitioners against where librdkafka itself places keys on the real broker."""

from __future__ import annotations

import os
import random
import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from streams.partitioning import key_partition, murmur2, murmur2_reference
from streams.topics import ensure_topics
from streams.settings import TopicSettings

# Kafka's own test vectors (clients/src/test/.../UtilsTest.testMurmur2), as signed 32-bit ints.
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_murmur2_matches_kafkas_published_values():
    for key, signed in KAFKA_VECTORS.items():
        assert murmur2(key) == signed & 0xFFFFFFFF == murmur2_reference(key)


def test_compiled_murmur2_equals_the_reference_on_every_length():
    rng = random.Random(1)
    for length in range(0, 70):
        for _ in range(20):
            key = bytes(rng.randrange(256) for _ in range(length))
            assert murmur2(key) == murmur2_reference(key)


def test_an_unknown_partitioner_is_refused_by_name():
    with pytest.raises(ValueError, match="partitioner must be one of"):
        key_partition(b"k", 4, "random")


@pytest.mark.parametrize("partitioner", ["murmur2_random", "consistent_random"])
def test_keys_land_where_key_partition_says(kafka, partitioner):
    topic = f"t-{uuid.uuid4().hex[:8]}.placement"
    ensure_topics(kafka, TopicSettings(decisions=topic, rewards=topic + "r", updates=topic + "u", posterior=topic + "p",
                                       deadletter=topic + "d", partitions=7, update_partitions=7))
    settings = kafka.model_copy(update={"partitioner": partitioner})
    producer = Producer(settings.producer_config())
    keys = [os.urandom(1 + i % 40).hex().encode() for i in range(300)]
    for key in keys:
        producer.produce(topic, value=b"x", key=key)
    assert producer.flush(30) == 0
    consumer = Consumer(kafka.consumer_config(f"placement-{topic}"))
    # assigned, not subscribed: a group join waited up to 30 s for a rebalance here
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(7)])
    placed = {}
    deadline = time.monotonic() + 30
    while len(placed) < len(keys) and time.monotonic() < deadline:
        for message in consumer.consume(500, 0.5):
            if message.error() is None:
                placed[message.key()] = message.partition()
    consumer.close()
    assert placed == {key: key_partition(key, 7, partitioner) for key in keys}
