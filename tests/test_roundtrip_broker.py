"""10,000 DecisionEvents through the real broker and a consumer group, in each framing."""

from __future__ import annotations

import random
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from streams.client import BatchConsumer, EventProducer
from streams.serde import AvroSerde
from streams.topics import ensure_topics
from tests import factories

N_EVENTS = 10_000


def _serde(framing: str, topic: str) -> AvroSerde:
    if framing == "confluent":
        registry = SchemaRegistryClient.new_client({"url": f"mock://{uuid.uuid4().hex}"})
        return AvroSerde("decision", framing="confluent", registry=registry, subject=f"{topic}-value")
    return AvroSerde("decision", framing="single_object")


@pytest.mark.parametrize("framing", ["confluent", "single_object"])
def test_10k_decisions_round_trip_through_a_consumer_group(kafka, topics, framing):
    ensure_topics(kafka, topics)
    serde = _serde(framing, topics.decisions)
    rng = random.Random(11)
    sent = {}
    producer = EventProducer(kafka)
    for i in range(N_EVENTS):
        record = factories.decision(i, rng)
        sent[record["event_id"]] = record
        producer.send(topics.decisions, serde, record)
    producer.flush()
    assert producer.delivered == N_EVENTS and producer.failed == 0

    received: dict[str, dict] = {}
    partitions_seen = set()
    with BatchConsumer(kafka, f"roundtrip-{framing}", [topics.decisions]) as consumer:
        for batch in consumer.batches(serde, max_records=2000, idle_timeout=10):
            assert batch.failures == []
            for record, message in zip(batch.records, batch.messages):
                assert message.key().decode() == record["event_id"]  # keyed by event_id
                partitions_seen.add(message.partition())
                received[record["event_id"]] = record
            consumer.commit(batch)
            if len(received) == N_EVENTS:
                break
    assert len(received) == N_EVENTS
    assert received == sent
    assert partitions_seen == set(range(topics.partitions))  # the key spread them over every partition

    # the group committed its offsets: a new member of the same group, reading every partition
    # to its end from there, sees nothing more (exact, where an idle wait only waited long)
    again = Consumer(kafka.consumer_config(f"roundtrip-{framing}", **{"enable.partition.eof": True}))
    again.subscribe([topics.decisions])
    leftovers, ended = [], set()
    deadline = time.monotonic() + 60
    try:
        while len(ended) < topics.partitions:
            assert time.monotonic() < deadline, f"only partitions {sorted(ended)} were read to their end"
            for message in again.consume(1000, 0.5):
                if message.error() is None:
                    leftovers.append(message)
                elif message.error().code() == KafkaError._PARTITION_EOF:
                    ended.add(message.partition())
                else:
                    raise AssertionError(message.error().str())
    finally:
        again.close()
    assert leftovers == []


def test_confluent_serializer_interop_through_the_broker(kafka, topics):
    """Their serializer -> broker -> our decoder, and ours -> broker -> their deserializer."""
    ensure_topics(kafka, topics)
    registry = SchemaRegistryClient.new_client({"url": f"mock://{uuid.uuid4().hex}"})
    import schemas

    theirs_out = AvroSerializer(registry, schemas.schema_str("decision"))
    theirs_in = AvroDeserializer(registry, schemas.schema_str("decision"))
    ours = AvroSerde("decision", framing="confluent", registry=registry, subject=f"{topics.decisions}-value")
    rng = random.Random(5)
    records = [factories.decision(i, rng) for i in range(200)]
    ctx = SerializationContext(topics.decisions, MessageField.VALUE)
    producer = EventProducer(kafka)
    for i, record in enumerate(records):
        value = theirs_out(record, ctx) if i % 2 == 0 else ours.encode(record)
        producer.send_raw(topics.decisions, value, key=record["event_id"])
    producer.flush()

    got = {}
    with BatchConsumer(kafka, "interop", [topics.decisions]) as consumer:
        for batch in consumer.batches(ours, idle_timeout=6):
            assert batch.failures == []
            for record, message in zip(batch.records, batch.messages):
                got[record["event_id"]] = (record, theirs_in(message.value(), ctx))
            if len(got) == len(records):
                break
    assert len(got) == len(records)
    for original in records:
        ours_decoded, theirs_decoded = got[original["event_id"]]
        assert ours_decoded == original
        theirs_decoded["timestamp"] = int(theirs_decoded["timestamp"].timestamp() * 1000)  # they return datetimes
        assert theirs_decoded == original


def test_a_caught_up_consumer_gets_a_new_record_within_the_profiles_fetch_wait(kafka, topics):
    """The broker profile keeps fetch waits short where the broker answers a waiting fetch
    only when its wait runs out (Tansu): a record produced while a caught-up consumer's
    fetch waits arrives within about 0.1 s (with librdkafka's default wait, ~0.2 s in
    this test; with faust's, up to 1.5 s). And the join's own (aiokafka) consumer gets the same wait."""
    import time

    from confluent_kafka import Consumer, Producer, TopicPartition

    from streams.join import JoinWorker
    from tests import join_helpers as H

    ensure_topics(kafka, topics)
    producer = Producer(kafka.producer_config())
    consumer = Consumer(kafka.consumer_config(f"wait-{topics.decisions}"))
    consumer.assign([TopicPartition(topics.decisions, 0, 0)])
    producer.produce(topics.decisions, b"first", partition=0)
    producer.flush(10)
    deadline = time.monotonic() + 30
    while (message := consumer.poll(0.5)) is None or message.error() is not None:
        assert time.monotonic() < deadline, "the first record never arrived"
    took = []
    for _ in range(5):
        time.sleep(0.05)  # the consumer's next fetch is waiting at the log end by now
        sent = time.monotonic()
        producer.produce(topics.decisions, b"next", partition=0)
        producer.flush(10)
        while (message := consumer.poll(0.01)) is None or message.error() is not None:
            assert time.monotonic() - sent < 10, "a record never arrived"
        took.append(time.monotonic() - sent)
    consumer.close()
    took.sort()
    assert took[2] <= 0.12, took

    worker = JoinWorker(H.settings(kafka, topics, Path(tempfile.mkdtemp())).worker_config())
    assert worker.app.fetch_max_wait_ms == kafka.broker_profile.fetch_max_wait_ms
