"""The event contracts: they parse, share one namespace, are documented, and evolve compatibly."""

from __future__ import annotations

import avro.schema
import fastavro
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

import schemas
from streams import _avrocodec
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


#: fields the decision gained after version 1 (decoded with their defaults from older records)
#: what the current update schema added after v4, with its default
ADDED_SINCE_V4 = {"candidate_features": [], "reset": False}
SINCE_V1 = ("recommended", "channel", "recommended_probabilities", "recommended_version", "candidate_features", "reset")


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
    assert schemas.history("decision") == [1, 2, 3]
    v1_fields = [f["name"] for f in schemas.load("decision", 1)["fields"]]
    current = {f["name"]: f for f in schemas.load("decision")["fields"]}
    assert "recommended" not in v1_fields
    assert current["recommended"]["default"] == -1
    assert schemas.fingerprint("decision", 1) != schemas.fingerprint("decision")


def test_decision_history_holds_the_real_v2_with_recommended_and_without_channel():
    v2 = schemas.load("decision", 2)
    v3 = schemas.load("decision", 3)
    assert [f["name"] for f in v2["fields"]] == [f["name"] for f in v3["fields"]][:-1]
    assert v3["fields"][-1] == {**v3["fields"][-1], "name": "channel", "type": "string", "default": "stable"}
    assert len({schemas.fingerprint("decision", v) for v in (1, 2, 3, None)}) == 4


def test_update_history_holds_the_real_v1_without_channel():
    assert schemas.history("update") == [1, 2, 3, 4, 5]
    v1_fields = [f["name"] for f in schemas.load("update", 1)["fields"]]
    v2 = {f["name"]: f for f in schemas.load("update", 2)["fields"]}
    assert "channel" not in v1_fields
    assert [name for name in v2 if name not in v1_fields] == ["channel"]
    assert (v2["channel"]["type"], v2["channel"]["default"]) == ("string", "stable")
    assert len({schemas.fingerprint("update", v) for v in (1, 2, None)}) == 3


def test_update_v4_is_v5_without_candidate_features_and_reads_as_current_with_none():
    v4 = schemas.load("update", 4)
    v5 = schemas.load("update", 5)
    assert [f["name"] for f in v4["fields"]] == [f["name"] for f in v5["fields"]][:-1]
    assert v5["fields"][-1]["name"] == "candidate_features" and v5["fields"][-1]["default"] == []
    writer, reader = AvroSerde("update", framing="single_object", version=4), AvroSerde("update", framing="single_object")
    update = {f["name"]: f.get("default") for f in v4["fields"]}
    update.update(event_id="e", tenant="t", workspace="w", domain="d", arm="a", arm_index=0, actions=["a"], probabilities=[1.0],
                  probability=1.0, features=[1.0], feature_hash="h", reward=0.5, signals={}, reward_count=1, join_status="rewarded",
                  mode="live", policy_version="1.0.0", decision_time=1, reward_time=2)
    decoded = reader.decode(writer.encode(update))
    assert decoded["candidate_features"] == [] and decoded["reward"] == 0.5
    rows = [[1.0, 0.5], [1.0, -0.25]]
    assert reader.decode(reader.encode({**update, "candidate_features": rows}))["candidate_features"] == rows


def test_update_v6_adds_only_the_reset_marker_and_old_records_read_as_not_reset():
    v5, current = schemas.load("update", 5), schemas.load("update")
    assert [f["name"] for f in v5["fields"]] == [f["name"] for f in current["fields"]][:-1]
    assert current["fields"][-1] == {**current["fields"][-1], "name": "reset", "type": "boolean", "default": False}
    writer, reader = AvroSerde("update", framing="single_object", version=5), AvroSerde("update", framing="single_object")
    update = {f["name"]: f.get("default") for f in v5["fields"]}
    update.update(event_id="e", domain="d", arm="a", arm_index=0, probability=1.0, features=[1.0], reward=0.5,
                  join_status="rewarded", decision_time=1)
    assert reader.decode(writer.encode(update))["reset"] is False
    assert reader.decode(reader.encode({**update, "reset": True}))["reset"] is True


def test_current_reader_reads_v1_single_object_data_with_recommended_defaulted():
    writer = AvroSerde("decision", framing="single_object", version=1)
    reader = AvroSerde("decision", framing="single_object")
    payload = writer.encode(v1_decision())
    assert payload[2:10] == schemas.fingerprint("decision", 1)  # resolved from schemas/history

    event = reader.decode(payload)

    assert (event["recommended"], event["channel"]) == (-1, "stable")
    assert {k: v for k, v in event.items() if k not in SINCE_V1} == v1_decision()


def test_current_reader_reads_v1_confluent_data_with_recommended_defaulted():
    registry = SchemaRegistryClient.new_client({"url": "mock://schemas-evolution"})
    v1_id = registry.register_schema("bandit.decisions-value", Schema(schemas.schema_str("decision", 1), "AVRO"))
    writer = AvroSerde("decision", registry=registry, topic="bandit.decisions", version=1)
    reader = AvroSerde("decision", registry=registry, topic="bandit.decisions")
    payload = writer.encode(v1_decision())
    assert payload[:5] == b"\x00" + v1_id.to_bytes(4, "big")

    event = reader.decode(payload)

    assert (event["recommended"], event["channel"]) == (-1, "stable")
    assert {k: v for k, v in event.items() if k not in SINCE_V1} == v1_decision()
    # The newer schema registers as a second version of the same subject.
    assert reader.schema_id() != v1_id
    assert sorted(registry.get_versions("bandit.decisions-value")) == [1, 2]  # the mock keeps a set


def test_current_reader_reads_v1_data_from_confluents_own_serializer():
    registry = SchemaRegistryClient.new_client({"url": "mock://schemas-evolution-confluent"})
    serializer = AvroSerializer(registry, schemas.schema_str("decision", 1))
    ctx = SerializationContext("bandit.decisions", MessageField.VALUE)
    payload = serializer(v1_decision(), ctx)

    event = AvroSerde("decision", registry=registry, topic="bandit.decisions").decode(payload)

    assert (event["recommended"], event["channel"]) == (-1, "stable")
    assert event["mode"] == "shadow" and event["tenant"] == "acme"


# -- version 3 of the decision and version 2 of the update: the channel that decided -----------


def v2_decision() -> dict:
    """A DecisionEvent as a version-2 producer writes it (``recommended``, no ``channel``)."""
    return {**v1_decision(), "event_id": "evt-v2", "mode": "live", "recommended": -1}


def v1_update() -> dict:
    """An UpdateEvent as a version-1 join writes it (no ``channel``)."""
    return {
        "event_id": "evt-v2",
        "tenant": "acme",
        "workspace": "staging",
        "domain": "llm_routing",
        "arm": "large",
        "arm_index": 1,
        "actions": ["small", "large"],
        "probabilities": [0.25, 0.75],
        "probability": 0.75,
        "features": [1.0, 0.5, -2.0],
        "feature_hash": "f00d",
        "reward": 0.8,
        "signals": {"success": 1.0},
        "reward_count": 1,
        "join_status": "rewarded",
        "mode": "live",
        "policy_version": "1.4.2",
        "decision_time": 1_700_000_000_123,
        "reward_time": 1_700_000_000_900,
        "weight": 1.0,
    }


OLD_WRITERS = [("decision", 1, v1_decision), ("decision", 2, v2_decision), ("update", 1, v1_update)]
TOPICS = {"decision": "bandit.decisions", "update": "bandit.updates"}


@pytest.fixture(params=["c", "python"])
def decode_path(request, monkeypatch):
    """Decode through the C extension's reader, or the generated Python one without it."""
    if request.param == "python":
        monkeypatch.setattr(_avrocodec, "_avrofast", None)
    return request.param


def _old_payloads(name: str, version: int, record: dict, framing: str, registry_name: str):
    registry = SchemaRegistryClient.new_client({"url": f"mock://{registry_name}"}) if framing == "confluent" else None
    writer = AvroSerde(name, framing=framing, registry=registry, topic=TOPICS[name], version=version)
    reader = AvroSerde(name, framing=framing, registry=registry, topic=TOPICS[name])
    return writer.encode(record), reader


@pytest.mark.parametrize("framing", ["single_object", "confluent"])
@pytest.mark.parametrize(("name", "version", "record"), OLD_WRITERS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_records_written_before_channel_decode_as_stable_in_both_framings_and_paths(
    name, version, record, framing, decode_path
):
    payload, reader = _old_payloads(name, version, record(), framing, f"channel-{name}-{version}-{framing}-{decode_path}")
    if framing == "single_object":
        assert payload[2:10] == schemas.fingerprint(name, version)  # resolved from schemas/history

    one = reader.decode(payload)
    batch = reader.decode_batch([payload, payload])

    assert one["channel"] == "stable"
    assert {k: v for k, v in one.items() if k not in SINCE_V1} == {k: v for k, v in record().items() if k != "recommended"}
    assert batch == [one, one]
    (read,) = reader._readers.values()
    assert hasattr(read, "__source__") == (decode_path == "python")  # the path the test meant


@pytest.mark.parametrize(("name", "version", "record"), OLD_WRITERS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_records_from_confluents_own_serializer_before_channel_decode_as_stable(name, version, record):
    registry = SchemaRegistryClient.new_client({"url": f"mock://channel-confluent-{name}-{version}"})
    serializer = AvroSerializer(registry, schemas.schema_str(name, version))
    payload = serializer(record(), SerializationContext(TOPICS[name], MessageField.VALUE))

    event = AvroSerde(name, registry=registry, topic=TOPICS[name]).decode(payload)

    assert event["channel"] == "stable"
    assert event["event_id"] == record()["event_id"]


@pytest.mark.parametrize("framing", ["single_object", "confluent"])
@pytest.mark.parametrize(("name", "record"), [("decision", v2_decision), ("update", v1_update)])
def test_current_writers_default_channel_to_stable_and_carry_canary(name, record, framing, decode_path):
    registry = SchemaRegistryClient.new_client({"url": f"mock://channel-now-{name}-{framing}"}) if framing == "confluent" else None
    serde = AvroSerde(name, framing=framing, registry=registry, topic=TOPICS[name])

    implicit = serde.decode(serde.encode(record()))  # a writer that predates the field
    canary = serde.decode(serde.encode({**record(), "channel": "canary"}))

    assert implicit["channel"] == "stable"
    assert canary == {**implicit, "channel": "canary"}


@pytest.mark.parametrize(("name", "old", "record"), [("decision", 2, v2_decision), ("update", 1, v1_update)])
def test_a_reader_still_on_the_previous_schema_reads_channel_events(name, old, record, decode_path):
    """Forward compatibility, for rolling upgrades: a consumer not yet upgraded skips the field."""
    payload = AvroSerde(name, framing="single_object").encode({**record(), "channel": "canary"})
    read = _avrocodec.build_reader(schemas.load(name), schemas.load(name, old))

    event, end = read(payload, 10)

    assert end == len(payload)
    assert event == record()  # everything but the channel, which this reader does not know


# -- version 4 of the decision and version 3 of the update: a shadow policy's recommendation ----

NO_RECOMMENDATION = {"recommended_probabilities": [], "recommended_version": ""}
SHADOW = {"recommended_probabilities": [0.125, 0.875], "recommended_version": "2.0.0"}


def v3_decision() -> dict:
    """A DecisionEvent as a version-3 producer writes it (``channel``, no recommendation)."""
    return {**v2_decision(), "event_id": "evt-v3", "channel": "canary"}


def v2_update() -> dict:
    """An UpdateEvent as a version-2 join writes it (``channel``, no recommendation)."""
    return {**v1_update(), "event_id": "evt-v3", "channel": "canary"}


BEFORE_SHADOW = OLD_WRITERS + [("decision", 3, v3_decision), ("update", 2, v2_update)]


def test_history_holds_the_real_decision_v3_and_update_v2_without_the_recommendation():
    for name, previous in (("decision", 3), ("update", 2)):
        old = [f["name"] for f in schemas.load(name, previous)["fields"]]
        current = {f["name"]: f for f in schemas.load(name)["fields"] if f["name"] not in ADDED_SINCE_V4}
        assert [n for n in current if n not in old] == list(NO_RECOMMENDATION)
        assert [n for n in current if n in old] == old  # nothing else moved
        assert {n: current[n]["default"] for n in NO_RECOMMENDATION} == NO_RECOMMENDATION
        assert current["recommended_probabilities"]["type"] == {"type": "array", "items": "double"}
        assert schemas.fingerprint(name, previous) != schemas.fingerprint(name)


@pytest.mark.parametrize("framing", ["single_object", "confluent"])
@pytest.mark.parametrize(("name", "version", "record"), BEFORE_SHADOW, ids=lambda v: getattr(v, "__name__", str(v)))
def test_records_written_before_the_recommendation_decode_without_one_in_both_framings_and_paths(
    name, version, record, framing, decode_path
):
    payload, reader = _old_payloads(name, version, record(), framing, f"shadow-{name}-{version}-{framing}-{decode_path}")
    if framing == "single_object":
        assert payload[2:10] == schemas.fingerprint(name, version)  # resolved from schemas/history

    one = reader.decode(payload)
    batch = reader.decode_batch([payload, payload])

    assert {k: one[k] for k in NO_RECOMMENDATION} == NO_RECOMMENDATION
    assert one["event_id"] == record()["event_id"] and one["channel"] == record().get("channel", "stable")
    assert batch == [one, one]
    (read,) = reader._readers.values()
    assert hasattr(read, "__source__") == (decode_path == "python")  # the path the test meant


@pytest.mark.parametrize(("name", "version", "record"), BEFORE_SHADOW, ids=lambda v: getattr(v, "__name__", str(v)))
def test_records_from_confluents_own_serializer_before_the_recommendation_decode_without_one(name, version, record):
    registry = SchemaRegistryClient.new_client({"url": f"mock://shadow-confluent-{name}-{version}"})
    serializer = AvroSerializer(registry, schemas.schema_str(name, version))
    payload = serializer(record(), SerializationContext(TOPICS[name], MessageField.VALUE))

    event = AvroSerde(name, registry=registry, topic=TOPICS[name]).decode(payload)

    assert {k: event[k] for k in NO_RECOMMENDATION} == NO_RECOMMENDATION
    assert event["event_id"] == record()["event_id"]


@pytest.mark.parametrize("framing", ["single_object", "confluent"])
@pytest.mark.parametrize(("name", "record"), [("decision", v3_decision), ("update", v2_update)])
def test_current_writers_default_the_recommendation_to_none_and_carry_a_shadows(name, record, framing, decode_path):
    registry = SchemaRegistryClient.new_client({"url": f"mock://shadow-now-{name}-{framing}"}) if framing == "confluent" else None
    serde = AvroSerde(name, framing=framing, registry=registry, topic=TOPICS[name])

    implicit = serde.decode(serde.encode(record()))  # a writer that predates the fields
    shadow = serde.decode(serde.encode({**record(), **SHADOW}))

    later = ADDED_SINCE_V4 if name == "update" else {}
    assert implicit == {**record(), **NO_RECOMMENDATION, **later}
    assert shadow == {**record(), **SHADOW, **later}


@pytest.mark.parametrize(("name", "old", "record"), [("decision", 3, v3_decision), ("update", 2, v2_update)])
def test_a_reader_still_on_the_previous_schema_reads_events_with_a_recommendation(name, old, record, decode_path):
    """Forward compatibility, for rolling upgrades: a consumer not yet upgraded skips the fields."""
    payload = AvroSerde(name, framing="single_object").encode({**record(), **SHADOW})
    read = _avrocodec.build_reader(schemas.load(name), schemas.load(name, old))

    event, end = read(payload, 10)

    assert end == len(payload)
    assert event == record()


# -- version 4 of the update: a deferred decision never activated ---------------------------


def v3_update() -> dict:
    """An UpdateEvent as a version-3 join writes it (a shadow's recommendation)."""
    return {**v2_update(), "event_id": "evt-v3u", **SHADOW}


def test_update_v4_adds_only_the_not_activated_status():
    v3, current = schemas.load("update", 3), schemas.load("update", 4)
    old_fields = {f["name"]: f for f in v3["fields"]}
    new_fields = {f["name"]: f for f in current["fields"]}
    assert list(old_fields) == list(new_fields)
    changed = [name for name in new_fields if new_fields[name] != old_fields[name]]
    assert changed == ["join_status"]
    assert old_fields["join_status"]["type"]["symbols"] == ["rewarded", "default"]
    assert new_fields["join_status"]["type"]["symbols"] == ["rewarded", "default", "not_activated"]
    assert schemas.fingerprint("update", 3) != schemas.fingerprint("update", 4)


@pytest.mark.parametrize("framing", ["single_object", "confluent"])
def test_updates_written_before_not_activated_decode_unchanged(framing, decode_path):
    payload, reader = _old_payloads("update", 3, v3_update(), framing, f"deferred-update-{framing}-{decode_path}")
    if framing == "single_object":
        assert payload[2:10] == schemas.fingerprint("update", 3)

    assert reader.decode(payload) == {**v3_update(), **ADDED_SINCE_V4}
    assert AvroSerde("update", framing="single_object").decode(
        AvroSerde("update", framing="single_object").encode({**v3_update(), "join_status": "not_activated"})
    )["join_status"] == "not_activated"
