"""One framing per deployment, on every topic: the SDK, replay, the join (updates, dead
letters, normaliser statistics) and the learner (posteriors, dead letters) all write what
``registry.framing`` says, so confluent-kafka's own ``AvroDeserializer`` (Confluent framing,
over HTTP to a registry with basic auth) or a plain fastavro reader (single-object) reads
every record of every topic back. The registry is ``tests.registry_server``: no registry
server installs here.
"""

from __future__ import annotations

import dataclasses
import io
import random
import threading
import time

import fastavro
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

import schemas
from banditstream.decider import Decider
from banditstream.replay import ReplayResult, produce
from learner.domain import DomainSettings
from streams.client import EventProducer
from streams.errors import RegistryError
from streams.learn import run_learner
from streams.settings import RegistrySettings
from streams.topics import ensure_topics
from tests import join_helpers as H
from tests.registry_server import RegistryServer, make_self_signed_cert

USER, PASSWORD = "banditstream", "registry-password-7f3a"
SERDE_OF = {"decisions": "decision", "rewards": "reward", "updates": "update", "posterior": "posterior",
            "deadletter": "deadletter"}


@pytest.fixture
def registry():
    with RegistryServer(basic_auth=(USER, PASSWORD)) as server:
        yield server


def _registry_settings(registry: RegistryServer, framing: str, password: str = PASSWORD) -> RegistrySettings:
    if framing == "single_object":
        return RegistrySettings()
    return RegistrySettings(url=registry.url, basic_auth_user_info=f"{USER}:{password}")


def _wait(what: str, predicate, timeout: float, state=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}: {state()}"
        time.sleep(0.5)


@pytest.mark.parametrize("framing", ["confluent", "single_object"])
def test_every_topic_reads_back_in_the_one_configured_framing(kafka, topics, tmp_path, registry, framing):
    ensure_topics(kafka, topics)
    events = _registry_settings(registry, framing)
    short = {name: {**d, "reward": {**d["reward"], "window_s": 0.5}} for name, d in H.DOMAINS.items()}
    settings = H.settings(kafka, topics, tmp_path / "state", domains=short).model_copy(update={"registry": events})
    config = dataclasses.replace(settings.worker_config(), extra={  # short windows; a few updates fold and publish
        "learn": {"block_size": 8, "emit_every_s": 0.3}, "join": {"grace_s": 0.5, "sweep_interval_s": 0.2}})
    rng = random.Random(5)

    # The SDK: decisions and rewards of a normalising domain (its statistics go to the posterior topic).
    decider = Decider("routing", kafka=kafka, settings=DomainSettings.model_validate(H.DOMAINS["routing"]), topics=topics,
                      schema_registry=events, spool_path=tmp_path / "spool", seed=1)
    for i in range(40):
        event_id = f"sdk-{i}"
        decider.decide({"tokens": rng.uniform(0, 500), "tier": rng.choice(["free", "pro"])}, list(H.ARMS), event_id)
        decider.reward(event_id, {"success": rng.random(), "latency_ms": rng.uniform(50, 900)})
    decider.close()
    # replay: logged events of another domain.
    now = H.now_ms()
    logged = ReplayResult(decisions=[H.decision(f"log-{i}", "prompts", rng, now) for i in range(20)],
                          rewards=[H.reward(f"log-{i}", "r0", "prompts", rng, now + 50) for i in range(20)])
    produce(logged, EventProducer(kafka), decisions_topic=topics.decisions, rewards_topic=topics.rewards, registry=events)
    # bad records for the join and the learner to dead-letter
    raw = Producer(kafka.producer_config())
    raw.produce(topics.decisions, key=b"bad-0", value=b"\x07not an event")
    raw.produce(topics.updates, key=b"bad-1", value=b"\x07not an update")
    raw.flush(10)

    stop = threading.Event()
    learner = threading.Thread(target=run_learner, args=(config,), kwargs={"stop": stop}, daemon=True)
    with H.JoinThread(config) as join:
        learner.start()
        try:
            _wait("60 updates", lambda: len(H.raw_records(kafka, topics.updates, topics.update_partitions)) >= 60, 120)
            _wait("the learner's posteriors and both dead letters",
                  lambda: len(H.raw_records(kafka, topics.deadletter, 1)) >= 2
                  and any(not m.key().startswith(b"~normalizer") for m in H.raw_records(kafka, topics.posterior, topics.update_partitions)), 60,
                  lambda: f"dead letters {[(m.key(), m.value()[:1]) for m in H.raw_records(kafka, topics.deadletter, 1)]}, "
                          f"posteriors {[m.key() for m in H.raw_records(kafka, topics.posterior, topics.update_partitions)]}")
        finally:
            join.check()
            stop.set()
            learner.join(60)

    if framing == "confluent":
        client = SchemaRegistryClient(events.client_config())
        read = {name: AvroDeserializer(client) for name in SERDE_OF.values()}
    seen: dict[str, int] = {}
    for role, name in SERDE_OF.items():
        topic = getattr(topics, role)
        partitions = {"updates": topics.update_partitions, "posterior": topics.update_partitions, "deadletter": 1}.get(role, topics.partitions)
        for message in H.raw_records(kafka, topic, partitions):
            if message.key() in (b"bad-0", b"bad-1"):
                continue  # the refused bytes, as written by hand
            value = message.value()
            if framing == "confluent":
                record = read[name](value, SerializationContext(topic, MessageField.VALUE))
            else:
                assert value[:2] == b"\xc3\x01", f"{topic}@{message.offset()} is not single-object framed: {value[:8]!r}"
                assert value[2:10] == schemas.fingerprint(name), f"{topic}@{message.offset()}: another schema's fingerprint"
                record = fastavro.schemaless_reader(io.BytesIO(value[10:]), schemas.parsed(name))
            assert record, f"{topic}@{message.offset()} read back empty"
            seen[role] = seen.get(role, 0) + 1
    assert seen["decisions"] == 60 and seen["rewards"] == 60, seen
    assert seen["updates"] >= 60 and seen["posterior"] >= 2 and seen["deadletter"] == 2, seen
    if framing == "confluent":
        subjects = set(client.get_subjects())
        assert {f"{getattr(topics, role)}-value" for role in SERDE_OF} <= subjects, subjects


def test_wrong_registry_credentials_fail_the_sdk_at_once_with_the_reason(kafka, topics, tmp_path, registry):
    started = time.monotonic()
    with pytest.raises(RegistryError, match="answered 401") as refused:
        Decider("routing", kafka=kafka, topics=topics, spool_path=tmp_path / "spool",
                schema_registry=_registry_settings(registry, "confluent", password="not-the-password"))
    assert time.monotonic() - started < 5
    assert "not-the-password" not in str(refused.value) and topics.decisions in str(refused.value)


def _decision_record(rng: random.Random) -> dict:
    return H.decision("e-1", "routing", rng, H.now_ms())


def test_registry_tls_and_a_bearer_token_come_from_the_settings(tmp_path):
    ca, cert, key = make_self_signed_cert(tmp_path)
    with RegistryServer(bearer_token="token-5d2e", tls=(cert, key)) as server:
        settings = RegistrySettings(url=server.url, bearer_token="token-5d2e", bearer_logical_cluster="lsrc-1",
                                    ssl_ca_location=ca)
        serde = settings.serde("decision", "t.decisions")
        encoded = serde.encode(_decision_record(random.Random(1)))
        assert encoded[:1] == b"\x00" and serde.subject == "t.decisions-value"
        assert all(r.authorization == "Bearer token-5d2e" for r in server.requests)
        untrusted = RegistrySettings(url=server.url, bearer_token="token-5d2e", bearer_logical_cluster="lsrc-1")
        with pytest.raises(RegistryError, match="could not be reached"):  # the system CAs do not know the test CA
            untrusted.serde("decision", "t.decisions").header()


def test_without_auto_registration_the_subject_must_exist_and_use_latest_version_writes_what_is_registered(registry):
    settings = RegistrySettings(url=registry.url, basic_auth_user_info=f"{USER}:{PASSWORD}", auto_register_schemas=False)
    with pytest.raises(RegistryError, match="answered 404.*auto_register_schemas"):
        settings.serde("decision", "t.decisions").header()
    client = SchemaRegistryClient(settings.client_config())
    older = client.register_schema("t.decisions-value", Schema(schemas.schema_str("decision", 1), "AVRO"))
    latest = settings.model_copy(update={"use_latest_version": True}).serde("decision", "t.decisions")
    encoded = latest.encode(_decision_record(random.Random(2)))
    assert int.from_bytes(encoded[1:5], "big") == older  # written as the registered (older) version says
    read = AvroDeserializer(client)(encoded, SerializationContext("t.decisions", MessageField.VALUE))
    assert read["event_id"] == "e-1" and set(read) == {f["name"] for f in schemas.load("decision", 1)["fields"]}
    with pytest.raises(ValueError, match="auto_register_schemas false"):
        RegistrySettings(url=registry.url, use_latest_version=True)
