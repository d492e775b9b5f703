"""Serde: both framings round-trip, interoperate with confluent-kafka, and fail with typed errors."""

from __future__ import annotations

import datetime as dt
import io
import random
import struct

import avro.schema
import fastavro
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schemas
from streams import _avrocodec
from streams.errors import (
    CorruptPayload,
    DecodeError,
    IncompatibleSchema,
    OversizePayload,
    TruncatedPayload,
    UnknownFingerprint,
    UnknownFraming,
    UnknownSchemaId,
    ValidationError,
)
from streams.serde import AvroSerde, detect_framing

TOPIC = "bandit.decisions"
FRAMINGS = ["confluent", "single_object"]


# --- events -------------------------------------------------------------------------------


def decision(i: int = 0, *, seed: int = 7) -> dict:
    rng = random.Random(seed + i)
    weights = [rng.random() + 0.1 for _ in range(3)]
    total = sum(weights)
    return {
        "event_id": f"evt-{i:06d}",
        "tenant": "acme",
        "workspace": "main",
        "domain": "llm_routing",
        "timestamp": 1_700_000_000_000 + i,
        "context": {
            "numeric": {"prompt_len": float(rng.randint(1, 4000)), "temperature": rng.random()},
            "categorical": {"task": rng.choice(["code", "chat"]), "lang": "sv-SE ö"},
            "vector": [rng.gauss(0, 1) for _ in range(4)],
        },
        "actions": [
            {"id": f"model-{a}", "features": {"numeric": {"cost": rng.random()}, "categorical": {}, "vector": []}}
            for a in range(3)
        ],
        "chosen": rng.randrange(3),
        "probabilities": [w / total for w in weights],
        "policy_version": "2.0.1",
        "mode": "live",
        "deferred": False,
        "recommended": -1,
        "channel": "stable",
        "recommended_probabilities": [],
        "recommended_version": "",
    }


SAMPLES = {
    "decision": decision(),
    "reward": {
        "event_id": "evt-000000",
        "reward_id": "r-1",
        "tenant": "default",
        "workspace": "main",
        "domain": "llm_routing",
        "timestamp": 1_700_000_000_500,
        "signals": {"success": 1.0, "latency_ms": 812.5},
        "value": None,
    },
    "update": {
        "event_id": "evt-000000",
        "tenant": "default",
        "workspace": "main",
        "domain": "llm_routing",
        "arm": "model-1",
        "arm_index": 1,
        "actions": ["model-0", "model-1"],
        "probabilities": [0.4, 0.6],
        "probability": 0.6,
        "features": [0.5, -1.25, 3.0],
        "feature_hash": "abc123",
        "reward": 0.75,
        "signals": {"success": 1.0},
        "reward_count": 1,
        "join_status": "rewarded",
        "mode": "live",
        "policy_version": "2.0.1",
        "channel": "stable",
        "recommended_probabilities": [0.1, 0.9],
        "recommended_version": "2.1.0",
        "decision_time": 1_700_000_000_000,
        "reward_time": 1_700_000_000_500,
        "weight": 1.0,
        "candidate_features": [[1.0, 0.5, -1.25], [0.5, -1.25, 3.0]],  # a shared model's: every candidate's row
        "reset": False,
    },
    "posterior": {
        "tenant": "default",
        "workspace": "main",
        "domain": "llm_routing",
        "arm": "model-1",
        "policy": "lin_ts",
        "dimension": 3,
        "state": bytes(range(40)),
        "state_major": 1,
        "update_count": 12345,
        "watermark": [{"topic": "bandit.updates", "partition": 3, "offset": 99}],
        "feature_hash": "abc123",
        "drift_trace": 0.5,
        "drift_norm": 12.0,
        "emitted_at": 1_700_000_001_000,
        "reset_time": 1_700_000_000_500,
    },
    "deadletter": {
        "source_topic": "bandit.decisions",
        "source_partition": 2,
        "source_offset": 17,
        "key": b"evt-1",
        "value": b"\x07garbage",
        "error_class": "UnknownFraming",
        "reason": "unknown_framing",
        "message": "payload is <9 bytes: 07 ...>; neither ...",
        "worker": "join",
        "timestamp": 1_700_000_002_000,
    },
    "snapshot": {
        "tenant": "default", "workspace": "main", "domain": "llm_routing", "version": "1.0.3", "state_major": 1,
        "policy": "lin_ts", "params_json": '{"dim":4}', "dimension": 4, "policy_state": b"BSPS\x01\x00",
        "arms": [{"arm": "small", "prior_mean": 0.0, "prior_strength": 1.0, "count": 12, "cov_trace": 0.5,
                  "spectral_norm": 13.0, "drifted": False}],
        "feature_config_json": "{}", "feature_hash": "0123456789abcdef", "normalizer_json": None,
        "reward_config_json": "{}", "reward_hash": "fedcba9876543210", "samples": 12, "drift_flag": False,
        "drift_reason": "", "git_commit": "unknown", "created_at": 1_700_000_000_000,
        "source_offsets": [{"topic": "bandit.updates", "partition": 0, "offset": 12}], "derived_from": None,
    },  # fmt: skip
}


def registry(name: str = "test-serde") -> SchemaRegistryClient:
    # new_client gives confluent-kafka's in-process mock for mock:// URLs; the plain
    # SchemaRegistryClient({"url": "mock://..."}) constructor is a real HTTP client in 2.16.
    return SchemaRegistryClient.new_client({"url": f"mock://{name}"})


def serde(framing: str, name: str = "decision", reg: SchemaRegistryClient | None = None, **kwargs) -> AvroSerde:
    if framing == "confluent":
        return AvroSerde(name, framing="confluent", registry=reg or registry(), topic=TOPIC, **kwargs)
    return AvroSerde(name, framing="single_object", registry=reg, **kwargs)


def as_millis(record: dict) -> dict:
    """confluent-kafka's deserializer returns timestamp-millis as datetimes; ours are ints."""
    out = {}
    for key, value in record.items():
        if isinstance(value, dt.datetime):
            value = round(value.timestamp() * 1000)
        out[key] = value
    return out


# --- round trips and framing --------------------------------------------------------------


@pytest.mark.parametrize("framing", FRAMINGS)
@pytest.mark.parametrize("name", schemas.NAMES)
def test_every_event_type_round_trips_in_both_framings(framing, name):
    s = serde(framing, name)
    payload = s.encode(SAMPLES[name])
    assert s.decode(payload) == SAMPLES[name]


@pytest.mark.parametrize("framing", FRAMINGS)
def test_skipped_fields_are_left_out_of_decoding_and_the_rest_decodes_the_same(framing):
    reg = registry("skip") if framing == "confluent" else None
    full = serde(framing, "update", reg)
    skipping = serde(framing, "update", reg, skip=("candidate_features",))
    shared = SAMPLES["update"] | {"candidate_features": [[0.5, -1.0, 2.0], [1.0, 0.0, -3.25]]}
    payloads = [full.encode(shared), full.encode(SAMPLES["update"])]
    expected = [{k: v for k, v in u.items() if k != "candidate_features"} for u in (shared, SAMPLES["update"])]
    assert skipping.decode_batch(payloads) == expected
    assert skipping.decode(payloads[0]) == expected[0]
    assert full.decode(payloads[0]) == shared
    assert skipping.encode(shared) == payloads[0]  # encoding is unchanged


def test_every_reader_steps_over_a_skipped_field():
    """The compiled reader, the generated Python one and fastavro's (for schemas the
    generator does not cover) all read past the skipped field's bytes to the fields after it."""
    from streams.serde import _fastavro_reader

    writer = schemas.load("update")
    reader = {**writer, "fields": [f for f in writer["fields"] if f["name"] != "candidate_features"]}
    record = SAMPLES["update"] | {"candidate_features": [[0.5, -1.0, 2.0], [1.0, 0.0, -3.25]]}
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(_avrocodec.strip_logical_types(writer)), record)
    body = b"#" + buf.getvalue()
    expected = {k: v for k, v in record.items() if k != "candidate_features"}
    readers = [_avrocodec.build_reader(writer, reader), _avrocodec.build_reader(writer, reader, native=False),
               _fastavro_reader(writer, reader)]
    for read in readers:
        assert read(body, 1) == (expected, len(body))


def test_skipping_a_field_the_schema_does_not_have_is_refused():
    with pytest.raises(ValueError, match="skip names fields update does not have: candidates"):
        AvroSerde("update", framing="single_object", skip=("candidates",))


@pytest.mark.parametrize("framing", FRAMINGS)
def test_encode_writes_the_framing_header(framing):
    s = serde(framing)
    payload = s.encode(decision())
    if framing == "confluent":
        assert payload[0] == 0 and int.from_bytes(payload[1:5], "big") == s.schema_id()
        assert s.subject == "bandit.decisions-value"
    else:
        assert payload[:2] == b"\xc3\x01" and payload[2:10] == schemas.fingerprint("decision")
    assert detect_framing(payload) == framing


def test_decoding_detects_the_framing_whatever_the_serde_writes():
    reg = registry("detect")
    confluent, single = serde("confluent", reg=reg), serde("single_object", reg=reg)
    events = [decision(i) for i in range(4)]
    mixed = [confluent.encode(events[0]), single.encode(events[1]), confluent.encode(events[2]), single.encode(events[3])]
    assert confluent.decode_batch(mixed) == events
    assert single.decode_batch(mixed) == events


def test_timestamps_are_int_millis_and_datetimes_are_accepted_on_encode():
    s = serde("single_object")
    moment = dt.datetime(2024, 5, 1, 12, 0, 0, 250_000, tzinfo=dt.timezone.utc)
    event = decision() | {"timestamp": moment}
    decoded = s.decode(s.encode(event))
    assert decoded["timestamp"] == 1_714_564_800_250
    assert isinstance(decoded["timestamp"], int)


def test_missing_fields_with_defaults_are_written_as_their_defaults():
    s = serde("single_object")
    event = decision()
    defaulted = ("tenant", "workspace", "policy_version", "recommended", "recommended_probabilities", "recommended_version")
    sparse = {k: v for k, v in event.items() if k not in defaulted}
    decoded = s.decode(s.encode(sparse))
    assert [decoded[k] for k in defaulted] == ["default", "main", "", -1, [], ""]


def test_encoding_an_event_without_a_required_field_fails():
    event = decision()
    del event["event_id"]
    with pytest.raises(ValueError, match="event_id"):
        serde("single_object").encode(event)


# --- the single-object fingerprint -----------------------------------------------------------


def _rabin(data: bytes) -> int:
    """CRC-64-AVRO as the Avro specification writes it out ("Schema Fingerprints")."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def test_crc64_avro_matches_the_published_test_vectors():
    # share/test/data/schema-tests.txt in apache/avro: fingerprints as Java signed longs.
    assert struct.unpack("<q", _rabin(b'"null"').to_bytes(8, "little"))[0] == 7195948357588979594
    assert struct.unpack("<q", _rabin(b'"string"').to_bytes(8, "little"))[0] == -8142146995180207161


@pytest.mark.parametrize("name", schemas.NAMES)
def test_single_object_header_is_the_little_endian_fingerprint_of_the_canonical_form(name):
    canonical = fastavro.schema.to_parsing_canonical_form(schemas.parsed(name))
    expected = _rabin(canonical.encode()).to_bytes(8, "little")
    assert schemas.fingerprint(name) == expected
    # The reference Python implementation agrees on the byte order for the same form. (Its own
    # canonical form keeps {"type": "long"} for logical types where the spec and Java write
    # "long", so it is fed fastavro's form here.)
    assert avro.schema._crc_64_fingerprint(canonical.encode()) == expected
    payload = serde("single_object", name).encode(SAMPLES[name])
    assert payload[2:10] == expected


# --- interop with confluent-kafka's own serializer ----------------------------------------------


@pytest.mark.parametrize("name", ["decision", "reward", "update"])
def test_confluent_deserializer_reads_what_we_encode(name):
    reg = registry(f"interop-ours-{name}")
    ours = serde("confluent", name, reg=reg)
    ctx = SerializationContext(TOPIC, MessageField.VALUE)
    theirs = AvroDeserializer(reg)

    decoded = theirs(ours.encode(SAMPLES[name]), ctx)

    assert as_millis(decoded) == SAMPLES[name]


@pytest.mark.parametrize("name", ["decision", "reward", "update"])
def test_we_decode_what_confluents_serializer_writes(name):
    reg = registry(f"interop-theirs-{name}")
    ctx = SerializationContext(TOPIC, MessageField.VALUE)
    theirs = AvroSerializer(reg, schemas.schema_str(name))

    payload = theirs(SAMPLES[name], ctx)

    assert payload[0] == 0
    assert serde("confluent", name, reg=reg).decode(payload) == SAMPLES[name]


def test_our_encoder_and_confluents_serializer_share_the_subject():
    reg = registry("interop-subject")
    ctx = SerializationContext(TOPIC, MessageField.VALUE)
    AvroSerializer(reg, schemas.schema_str("decision"))(decision(), ctx)
    ours = serde("confluent", reg=reg)
    ours.encode(decision())
    assert reg.get_subjects() == ["bandit.decisions-value"]


# --- typed errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("framing", FRAMINGS)
@pytest.mark.parametrize("keep", [1, 3, 7, 12, 40, -1])
def test_truncated_payloads_raise_truncated_payload(framing, keep):
    s = serde(framing)
    payload = s.encode(decision())
    cut = payload[:keep]
    with pytest.raises(TruncatedPayload) as err:
        s.decode(cut)
    assert err.value.reason == "truncated"
    assert f"{len(cut)} byte" in str(err.value)
    assert "\n" not in str(err.value)


def test_empty_payload_is_truncated():
    with pytest.raises(TruncatedPayload, match="empty"):
        serde("single_object").decode(b"")


def test_unknown_schema_id_raises_unknown_schema_id():
    s = serde("confluent")
    body = s.encode(decision())[5:]
    with pytest.raises(UnknownSchemaId) as err:
        s.decode(b"\x00" + (4242).to_bytes(4, "big") + body)
    assert err.value.value == 4242
    assert "schema_id is 4242" in str(err.value)


def test_confluent_payload_without_a_registry_raises_unknown_schema_id():
    payload = serde("confluent").encode(decision())
    with pytest.raises(UnknownSchemaId, match="no schema registry"):
        AvroSerde("decision", framing="single_object").decode(payload)


@pytest.mark.parametrize("payload", [b'{"event_id": "e1"}', b"\x01\x00\x00\x00\x01abc", b"\xc3\x02" + bytes(12)])
def test_unknown_framing_raises_unknown_framing(payload):
    with pytest.raises(UnknownFraming) as err:
        serde("single_object").decode(payload)
    assert payload[:2].hex(" ") in str(err.value)


def test_unknown_fingerprint_raises_unknown_fingerprint():
    body = serde("single_object").encode(decision())[10:]
    forged = b"\xc3\x01" + bytes.fromhex("0123456789abcdef") + body
    with pytest.raises(UnknownFingerprint) as err:
        serde("single_object").decode(forged)
    assert "0123456789abcdef" in str(err.value)


def test_oversize_payload_is_refused_on_decode_and_on_encode():
    small = serde("single_object", max_payload_bytes=200)
    payload = serde("single_object").encode(decision())
    assert len(payload) > 200
    with pytest.raises(OversizePayload) as err:
        small.decode(payload)
    assert isinstance(err.value, DecodeError) and isinstance(err.value, ValidationError)
    assert err.value.value == len(payload) and "200" in str(err.value)
    with pytest.raises(OversizePayload):
        small.encode(decision())


def test_another_event_type_is_incompatible_not_misread():
    reward = serde("single_object", "reward").encode(SAMPLES["reward"])
    with pytest.raises(IncompatibleSchema, match="DecisionEvent"):
        serde("single_object").decode(reward)


def test_bytes_that_are_not_avro_of_the_schema_are_corrupt():
    s = serde("single_object")
    payload = bytearray(s.encode(decision()))
    # The mode enum sits just before `deferred`, `recommended` (one byte each), `channel` ("stable": 7 bytes),
    # `recommended_probabilities` and `recommended_version` (empty: one byte each).
    assert payload[-12] == 0  # index of "live"
    payload[-12] = 0x0A  # index 5: not a Mode symbol
    with pytest.raises(CorruptPayload, match="enum index 5"):
        s.decode(bytes(payload))


def test_decode_batch_returns_errors_in_place_among_good_records():
    s = serde("single_object")
    good = [decision(i) for i in range(3)]
    payloads = [
        s.encode(good[0]),
        s.encode(good[1])[:30],
        s.encode(good[1]),
        b"not avro",
        memoryview(s.encode(good[2])),
        b"\xc3\x01" + bytes(8),
    ]

    results = s.decode_batch(payloads)

    assert [type(r).__name__ for r in results] == [
        "dict",
        "TruncatedPayload",
        "dict",
        "UnknownFraming",
        "dict",
        "UnknownFingerprint",
    ]
    assert [r for r in results if isinstance(r, dict)] == good


def test_a_registry_outage_is_raised_not_dead_lettered():
    class Down:
        def get_schema(self, schema_id):
            raise ConnectionError("registry unreachable")

    payload = serde("confluent").encode(decision())
    with pytest.raises(ConnectionError):
        AvroSerde("decision", registry=Down(), topic=TOPIC).decode_batch([payload])


# --- the generated codec against fastavro ---------------------------------------------------------


def _values(schema, named):
    """A hypothesis strategy for data of a (fastavro-parsed, logical-types-stripped) schema."""
    if isinstance(schema, str) and schema in named:
        return st.deferred(lambda: _values(named[schema], named))
    if isinstance(schema, list):
        return st.one_of([_values(branch, named) for branch in schema])
    kind = schema if isinstance(schema, str) else schema["type"]
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "int":
        return st.integers(-(2**31), 2**31 - 1)
    if kind == "long":
        return st.integers(-(2**63), 2**63 - 1)
    if kind == "double":
        return st.floats(allow_nan=False)
    if kind == "string":
        return st.text(max_size=12)
    if kind == "bytes":
        return st.binary(max_size=12)
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    if kind == "array":
        return st.lists(_values(schema["items"], named), max_size=4)
    if kind == "map":
        return st.dictionaries(st.text(max_size=8), _values(schema["values"], named), max_size=4)
    if kind == "record":
        return st.fixed_dictionaries({f["name"]: _values(f["type"], named) for f in schema["fields"]})
    raise AssertionError(kind)


def _plain(name, version=None):
    return fastavro.parse_schema(_avrocodec.strip_logical_types(schemas.load(name, version)))


def _fastavro_bytes(schema, record) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, record)
    return buf.getvalue()


@pytest.mark.parametrize("name", schemas.NAMES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_generated_codec_writes_and_reads_exactly_what_fastavro_does(name, data):
    schema = _plain(name)
    record = data.draw(_values(schema, schema["__named_schemas"]))
    write = _avrocodec.build_writer(schemas.load(name))
    read = _avrocodec.build_reader(schemas.load(name))

    expected = _fastavro_bytes(schema, record)

    assert write(record) == expected
    decoded, end = read(expected, 0)
    assert end == len(expected)
    assert decoded == fastavro.schemaless_reader(io.BytesIO(expected), schema, None)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_generated_resolution_from_v1_matches_fastavro(data):
    v1, current = _plain("decision", 1), _plain("decision")
    record = data.draw(_values(v1, v1["__named_schemas"]))
    payload = _fastavro_bytes(v1, record)
    read = _avrocodec.build_reader(schemas.load("decision", 1), schemas.load("decision"))

    decoded, _ = read(payload, 0)

    assert decoded == fastavro.schemaless_reader(io.BytesIO(payload), v1, current)
    assert (decoded["recommended"], decoded["recommended_probabilities"], decoded["recommended_version"]) == (-1, [], "")


def test_reader_follows_blocks_with_negative_counts_and_byte_sizes():
    # Java's encoders may write a block as (-count, size in bytes, items); readers must take it.
    s = serde("single_object", "reward")
    record = SAMPLES["reward"] | {"signals": {"a": 1.5, "b": -2.0}}
    plain = s.encode(record)
    head, signals_at = plain[:10], plain.index(b"\x04\x02a")  # count 2, then key "a"
    entries = b"\x02a" + struct.pack("<d", 1.5) + b"\x02b" + struct.pack("<d", -2.0)
    block = b"\x03" + bytes([len(entries) * 2]) + entries + b"\x00"  # zig-zag: -2 -> 3
    rest = plain[signals_at + 1 + len(entries) + 1 :]
    blocked = head + plain[10:signals_at] + block + rest
    assert s.decode(blocked) == record
