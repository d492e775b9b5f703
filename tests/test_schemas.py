"""The event contracts: they parse, share one namespace, are documented, and evolve compatibly."""

from __future__ import annotations

import avro.schema
import fastavro
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

import schemas
from streams.serde import AvroSerde

ALL_VERSIONS = [(name, None) for name in schemas.NAMES] + [
    (name, version) for name in schemas.NAMES for version in schemas.history(name)
]


def _ids(param: tuple[str, int | None]) -> str:
    name, version = param
    return name if version is None else f"{name}.v{version}"


def _records(schema: object):
    """Every record schema defined inside ``schema`` (JSON form), outermost first."""
    if isinstance(schema, dict):
        if schema.get("type") == "record":
            yield schema
            for field in schema["fields"]:
                yield from _records(field["type"])
        elif schema.get("type") == "array":
            yield from _records(schema["items"])
        elif schema.get("type") == "map":
            yield from _records(schema["values"])
    elif isinstance(schema, list):
        for branch in schema:
            yield from _records(branch)


def v1_decision() -> dict:
    """A DecisionEvent as a version-1 producer writes it (no ``recommended``)."""
    return {
        "event_id": "evt-v1",
        "tenant": "acme",
        "workspace": "staging",
        "domain": "llm_routing",
        "timestamp": 1_700_000_000_123,
        "context": {"numeric": {"prompt_len": 412.0}, "categorical": {"lang": "en"}, "vector": []},
        "actions": [
            {"id": "small", "features": {"numeric": {"cost": 0.1}, "categorical": {}, "vector": []}},
            {"id": "large", "features": {"numeric": {"cost": 1.5}, "categorical": {}, "vector": []}},
        ],
        "chosen": 1,
        "probabilities": [0.25, 0.75],
        "policy_version": "1.4.2",
        "mode": "shadow",
        "deferred": False,
    }


@pytest.mark.parametrize("param", ALL_VERSIONS, ids=_ids)
def test_every_schema_parses_with_fastavro_and_the_reference_avro_library(param):
    name, version = param
    parsed = fastavro.parse_schema(schemas.load(name, version))
    assert parsed["type"] == "record"
    assert avro.schema.parse(schemas.schema_str(name, version)).type == "record"


@pytest.mark.parametrize("param", ALL_VERSIONS, ids=_ids)
def test_every_named_type_lives_in_the_one_namespace(param):
    name, version = param
    schema = schemas.load(name, version)
    assert schema["namespace"] == schemas.NAMESPACE == "io.banditstream.v1"
    named = fastavro.parse_schema(schema)["__named_schemas"]
    assert named, "a schema defines at least its own record"
    outside = [full for full in named if full.rsplit(".", 1)[0] != schemas.NAMESPACE]
    assert outside == []


@pytest.mark.parametrize("param", ALL_VERSIONS, ids=_ids)
def test_every_field_is_documented(param):
    name, version = param
    undocumented = [
        f"{record['name']}.{field['name']}"
        for record in _records(schemas.load(name, version))
        for field in record["fields"]
        if not str(field.get("doc", "")).strip()
    ]
    assert undocumented == []


@pytest.mark.parametrize("name", [n for n in schemas.NAMES if schemas.history(n)])
def test_every_field_added_after_v1_has_a_default(name):
    versions = schemas.history(name)
    older = {f["name"] for f in schemas.load(name, versions[0])["fields"]}
    added = [f for f in schemas.load(name)["fields"] if f["name"] not in older]
    assert added, f"{name} has history, so some field was added since v{versions[0]}"
    assert [f["name"] for f in added if "default" not in f] == []


def test_decision_history_holds_the_real_v1_without_recommended():
    assert schemas.history("decision") == [1]
    v1_fields = [f["name"] for f in schemas.load("decision", 1)["fields"]]
    current = {f["name"]: f for f in schemas.load("decision")["fields"]}
    assert "recommended" not in v1_fields
    assert current["recommended"]["default"] == -1
    assert schemas.fingerprint("decision", 1) != schemas.fingerprint("decision")


def test_current_reader_reads_v1_single_object_data_with_recommended_defaulted():
    writer = AvroSerde("decision", framing="single_object", version=1)
    reader = AvroSerde("decision", framing="single_object")
    payload = writer.encode(v1_decision())
    assert payload[2:10] == schemas.fingerprint("decision", 1)  # resolved from schemas/history

    event = reader.decode(payload)

    assert event["recommended"] == -1
    assert {k: v for k, v in event.items() if k != "recommended"} == v1_decision()


def test_current_reader_reads_v1_confluent_data_with_recommended_defaulted():
    registry = SchemaRegistryClient.new_client({"url": "mock://schemas-evolution"})
    v1_id = registry.register_schema("bandit.decisions-value", Schema(schemas.schema_str("decision", 1), "AVRO"))
    writer = AvroSerde("decision", registry=registry, topic="bandit.decisions", version=1)
    reader = AvroSerde("decision", registry=registry, topic="bandit.decisions")
    payload = writer.encode(v1_decision())
    assert payload[:5] == b"\x00" + v1_id.to_bytes(4, "big")

    event = reader.decode(payload)

    assert event["recommended"] == -1
    assert {k: v for k, v in event.items() if k != "recommended"} == v1_decision()
    # The newer schema registers as a second version of the same subject.
    assert reader.schema_id() != v1_id
    assert sorted(registry.get_versions("bandit.decisions-value")) == [1, 2]  # the mock keeps a set


def test_current_reader_reads_v1_data_from_confluents_own_serializer():
    registry = SchemaRegistryClient.new_client({"url": "mock://schemas-evolution-confluent"})
    serializer = AvroSerializer(registry, schemas.schema_str("decision", 1))
    ctx = SerializationContext("bandit.decisions", MessageField.VALUE)
    payload = serializer(v1_decision(), ctx)

    event = AvroSerde("decision", registry=registry, topic="bandit.decisions").decode(payload)

    assert event["recommended"] == -1
    assert event["mode"] == "shadow" and event["tenant"] == "acme"
