"""The compiled (C) Avro codec: same values and bytes as fastavro, typed errors, no crash on any input.

``streams._avrofast`` runs the programs ``streams._avrocodec`` compiles from a (writer,
reader) schema pair. These tests hold it to fastavro (``schemaless_reader`` with the reader
schema, ``schemaless_writer``; logical types stripped as serde does) and to the generated
Python it replaces, on every shipped schema, on v1 -> current resolution and on a pair of
schemas made to exercise every resolution rule; then feed it truncated, corrupted and random
bytes, and check that serde still works when the extension is missing.
"""

from __future__ import annotations

import copy
import gc
import io
import random
import struct

import fastavro
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import schemas
from streams import _avrocodec, _avrofast  # built by pip install; a missing build fails here
from streams.errors import CorruptPayload, DecodeError, IncompatibleSchema, TruncatedPayload
from streams.serde import AvroSerde
from tests.test_serde import decision, registry

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- schemas and data -------------------------------------------------------------------------

# A writer/reader pair that exercises every rule of Avro schema resolution the codec compiles:
# dropped writer fields (of every type), reordered fields, reader fields filled from
# defaults (mutable ones too), int/long/float promotions, string <-> bytes, enum symbols
# remapped with a reader default, writer unions matched branch by branch, a non-union read
# into a reader union, nested records that gain fields, maps and arrays of them, fixed, null.
_POINT_W = {"type": "record", "name": "Point", "fields": [{"name": "x", "type": "double"}]}
_POINT_R = {
    "type": "record",
    "name": "Point",
    "fields": [
        {"name": "y", "type": "float", "default": 1.5},
        {"name": "x", "type": "double"},
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": ["a", "b"]},
    ],
}
SINK_WRITER = {
    "type": "record",
    "name": "Sink",
    "namespace": "test.avrofast",
    "fields": [
        {
            "name": "dropped",
            "type": {
                "type": "record",
                "name": "Gone",
                "fields": [
                    {"name": "a", "type": "long"},
                    {"name": "b", "type": {"type": "array", "items": "string"}},
                    {"name": "c", "type": ["null", "bytes", "boolean"]},
                    {"name": "e", "type": {"type": "enum", "name": "GoneE", "symbols": ["x", "y"]}},
                    {"name": "f", "type": {"type": "fixed", "name": "GoneF", "size": 3}},
                    {"name": "m", "type": {"type": "map", "values": "float"}},
                    {"name": "s", "type": "string"},
                ],
            },
        },
        {"name": "i2l", "type": "int"},
        {"name": "i2d", "type": "int"},
        {"name": "l2f", "type": "long"},
        {"name": "f2d", "type": "float"},
        {"name": "s2b", "type": "string"},
        {"name": "b2s", "type": "bytes"},
        {"name": "moved", "type": "string"},
        {"name": "en", "type": {"type": "enum", "name": "Color", "symbols": ["red", "green", "blue", "mauve"]}},
        {"name": "wunion", "type": ["null", "int", "string", _POINT_W]},
        {"name": "to_union", "type": "int"},
        {"name": "points", "type": {"type": "array", "items": "Point"}},
        {"name": "by_name", "type": {"type": "map", "values": ["null", "Point"]}},
        {"name": "fx", "type": {"type": "fixed", "name": "Four", "size": 4}},
        {"name": "flag", "type": "boolean"},
        {"name": "doubles", "type": {"type": "array", "items": "double"}},
        {"name": "floats", "type": {"type": "array", "items": "float"}},
        {"name": "nothing", "type": "null"},
        {"name": "big", "type": "long"},
    ],
}
SINK_READER = {
    "type": "record",
    "name": "Sink",
    "namespace": "test.avrofast",
    "fields": [
        {"name": "moved", "type": "string"},
        {"name": "added_map", "type": {"type": "map", "values": "double"}, "default": {"k": 1.0}},
        {"name": "i2l", "type": "long"},
        {"name": "i2d", "type": "double"},
        {"name": "l2f", "type": "float"},
        {"name": "f2d", "type": "double"},
        {"name": "s2b", "type": "bytes"},
        {"name": "b2s", "type": "string"},
        {
            "name": "en",
            "type": {"type": "enum", "name": "Color", "symbols": ["blue", "red", "green", "other"], "default": "other"},
        },
        {"name": "wunion", "type": ["null", "long", "string", _POINT_R]},
        {"name": "to_union", "type": ["null", "double"]},
        {"name": "points", "type": {"type": "array", "items": "Point"}},
        {"name": "by_name", "type": {"type": "map", "values": ["null", "Point"]}},
        {"name": "fx", "type": {"type": "fixed", "name": "Four", "size": 4}},
        {"name": "flag", "type": "boolean"},
        {"name": "doubles", "type": {"type": "array", "items": "double"}},
        {"name": "floats", "type": {"type": "array", "items": "double"}},
        {"name": "nothing", "type": "null"},
        {"name": "big", "type": "long"},
        {"name": "added_union", "type": ["null", "string"], "default": None},
        {
            "name": "added_rec",
            "type": {
                "type": "record",
                "name": "Extra",
                "fields": [{"name": "n", "type": "int"}, {"name": "v", "type": {"type": "array", "items": "long"}}],
            },
            "default": {"n": 7, "v": [1, 2]},
        },
        {"name": "added_bytes", "type": "bytes", "default": "\u00ff\u0000"},
    ],
}


def _plain(schema):
    return fastavro.parse_schema(_avrocodec.strip_logical_types(schema))


def _values(schema, named):
    """A hypothesis strategy for data of a fastavro-parsed, logical-types-stripped schema."""
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
    if kind == "float":
        return st.floats(allow_nan=False, width=32)
    if kind == "double":
        return st.floats(allow_nan=False)
    if kind == "string":
        return st.text(max_size=40)  # past the string cache's 32 bytes now and then
    if kind == "bytes":
        return st.text(max_size=12).map(str.encode)  # valid UTF-8, so bytes -> string reads
    if kind == "fixed":
        return st.binary(min_size=schema["size"], max_size=schema["size"])
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    if kind == "array":
        return st.lists(_values(schema["items"], named), max_size=5)
    if kind == "map":
        return st.dictionaries(st.text(max_size=8), _values(schema["values"], named), max_size=5)
    if kind == "record":
        return st.fixed_dictionaries({f["name"]: _values(f["type"], named) for f in schema["fields"]})
    raise AssertionError(kind)


def _write(schema, record) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, record)
    return buf.getvalue()


def _fastavro_read(payload, writer, reader=None):
    return fastavro.schemaless_reader(io.BytesIO(payload), writer, reader)


def _draw(data, schema):
    return data.draw(_values(schema, schema["__named_schemas"]))


def _c_reader(writer, reader=None):
    read = _avrocodec.build_reader(writer, reader)
    assert isinstance(read.__self__, _avrofast.Reader)
    return read


PAIRS = {name: (schemas.load(name), schemas.load(name)) for name in schemas.NAMES}
PAIRS["decision v1 -> current"] = (schemas.load("decision", 1), schemas.load("decision"))
PAIRS["resolution sink"] = (SINK_WRITER, SINK_READER)


# --- the same values and bytes as fastavro -----------------------------------------------------


@pytest.mark.parametrize("name", schemas.NAMES)
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_c_reader_and_writer_match_fastavro_on_every_schema(name, data):
    schema = _plain(schemas.load(name))
    record = _draw(data, schema)
    expected = _write(schema, record)
    write = _avrocodec.build_writer(schemas.load(name))
    read = _c_reader(schemas.load(name))

    assert write(record) == expected
    decoded, end = read(expected, 0)

    assert end == len(expected)
    assert decoded == _fastavro_read(expected, schema) == record


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_c_reader_resolves_decision_v1_into_the_current_schema_as_fastavro_does(data):
    v1, current = _plain(schemas.load("decision", 1)), _plain(schemas.load("decision"))
    payload = _write(v1, _draw(data, v1))

    decoded, _ = _c_reader(schemas.load("decision", 1), schemas.load("decision"))(payload, 0)

    assert decoded == _fastavro_read(payload, v1, current)
    assert decoded["recommended"] == -1


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_c_reader_applies_every_resolution_rule_as_fastavro_and_the_generated_reader_do(data):
    writer, reader = _plain(SINK_WRITER), _plain(SINK_READER)
    payload = _write(writer, _draw(data, writer))

    decoded, end = _c_reader(SINK_WRITER, SINK_READER)(payload, 0)

    expected = _fastavro_read(payload, writer, reader)
    # fastavro hands a bytes default over as its JSON string; the spec (and we) read bytes.
    expected["added_bytes"] = expected["added_bytes"].encode("latin-1")
    assert end == len(payload)
    assert decoded == expected
    assert decoded == _avrocodec.build_reader(SINK_WRITER, SINK_READER, native=False)(payload, 0)[0]
    assert list(decoded) == [f["name"] for f in SINK_READER["fields"]]  # the reader's field order


SINK_RECORD = {
    "dropped": {"a": 1, "b": ["x"], "c": b"\x00", "e": "y", "f": b"abc", "m": {"k": 0.5}, "s": "gone"},
    "i2l": -3,
    "i2d": 4,
    "l2f": 2**40,
    "f2d": 0.25,
    "s2b": "ö",
    "b2s": "ä".encode(),
    "moved": "here",
    "en": "mauve",
    "wunion": {"x": 2.0},
    "to_union": 9,
    "points": [{"x": 1.0}, {"x": -1.0}],
    "by_name": {"p": {"x": 3.0}, "q": None},
    "fx": b"\x00\x01\x02\x03",
    "flag": True,
    "doubles": [1.0, float("inf")],
    "floats": [0.5],
    "nothing": None,
    "big": -(2**63),
}


def test_the_resolution_sink_reads_as_its_reader_schema_says():
    payload = _write(_plain(SINK_WRITER), SINK_RECORD)

    decoded, _ = _c_reader(SINK_WRITER, SINK_READER)(payload, 0)

    assert decoded == {
        "moved": "here",
        "added_map": {"k": 1.0},
        "i2l": -3,
        "i2d": 4.0,
        "l2f": float(2**40),
        "f2d": 0.25,
        "s2b": "ö".encode(),
        "b2s": "ä",
        "en": "other",
        "wunion": {"y": 1.5, "x": 2.0, "tags": ["a", "b"]},
        "to_union": 9.0,
        "points": [{"y": 1.5, "x": 1.0, "tags": ["a", "b"]}, {"y": 1.5, "x": -1.0, "tags": ["a", "b"]}],
        "by_name": {"p": {"y": 1.5, "x": 3.0, "tags": ["a", "b"]}, "q": None},
        "fx": b"\x00\x01\x02\x03",
        "flag": True,
        "doubles": [1.0, float("inf")],
        "floats": [0.5],
        "nothing": None,
        "big": -(2**63),
        "added_union": None,
        "added_rec": {"n": 7, "v": [1, 2]},
        "added_bytes": b"\xff\x00",
    }
    assert isinstance(decoded["i2d"], float) and isinstance(decoded["to_union"], float)


def test_defaults_are_fresh_objects_in_every_record():
    payload = _write(_plain(SINK_WRITER), SINK_RECORD)
    read = _c_reader(SINK_WRITER, SINK_READER)

    first, _ = read(payload, 0)
    first["added_map"]["k"] = -1.0
    first["added_rec"]["v"].append(3)
    first["wunion"]["tags"].append("c")
    second, _ = read(payload, 0)

    assert second["added_map"] == {"k": 1.0}
    assert second["added_rec"] == {"n": 7, "v": [1, 2]}
    assert second["wunion"]["tags"] == ["a", "b"]
    assert second["added_bytes"] == b"\xff\x00"


def test_reader_reads_in_place_from_an_offset_and_from_any_buffer():
    schema = _plain(schemas.load("reward"))
    record = {
        "event_id": "e",
        "reward_id": "r",
        "tenant": "t",
        "workspace": "w",
        "domain": "d",
        "timestamp": 5,
        "signals": {"a": 1.0},
        "value": 0.5,
    }
    body = _write(schema, record)
    read = _c_reader(schemas.load("reward"))

    assert read(b"junk" + body, 4) == (record, 4 + len(body))
    assert read(memoryview(b"junk" + body)[4:], 0) == (record, len(body))
    assert read(bytearray(body)) == (record, len(body))


def test_repeated_strings_are_shared_and_still_equal():
    schema = _plain(schemas.load("reward"))
    record = {
        "event_id": "x" * 40,  # longer than the cache takes
        "reward_id": "r",
        "tenant": "tenant-ö",
        "workspace": "",
        "domain": "d",
        "timestamp": 1,
        "signals": {"latency_ms": 1.0, "é": 2.0},
        "value": None,
    }
    read = _c_reader(schemas.load("reward"))
    payload = _write(schema, record)
    a, _ = read(payload, 0)
    b, _ = read(payload, 0)
    assert a == b == record
    assert a["tenant"] is b["tenant"]
    assert [k for k in a["signals"]] == ["latency_ms", "é"]


def test_blocks_with_negative_counts_and_byte_sizes_are_read():
    schema = {"type": "record", "name": "B", "fields": [{"name": "xs", "type": {"type": "array", "items": "long"}}]}
    # (-2 items, 2 bytes) [1, 2] then (1 item) [3], then the end block.
    payload = b"\x03\x04" + b"\x02\x04" + b"\x02" + b"\x06" + b"\x00"
    assert _c_reader(schema)(payload, 0) == ({"xs": [1, 2, 3]}, len(payload))


def test_every_avro_long_reads_exactly():
    schema = {"type": "record", "name": "L", "fields": [{"name": "n", "type": "long"}]}
    read = _c_reader(schema)
    for n in (0, -1, 1, 63, -64, 64, 2**31, -(2**31) - 1, 2**63 - 1, -(2**63)):
        assert read(_write(_plain(schema), {"n": n}), 0)[0] == {"n": n}


_LIST = {
    "type": "record",
    "name": "Node",
    "fields": [{"name": "v", "type": "long"}, {"name": "next", "type": ["null", "Node"]}],
}


@pytest.mark.parametrize(
    ("writer", "reader", "error"),
    [
        (schemas.load("reward"), schemas.load("decision"), _avrocodec.Incompatible),
        (
            {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]},
            {"type": "record", "name": "R", "fields": [{"name": "a", "type": "string"}]},
            _avrocodec.Incompatible,
        ),
        (
            {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]},
            {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}, {"name": "b", "type": "int"}]},
            _avrocodec.Incompatible,
        ),
        (_LIST, _LIST, _avrocodec.Unsupported),
    ],
    ids=["another record", "int as string", "field without default", "recursive"],
)
def test_c_and_python_builds_refuse_the_same_schema_pairs(writer, reader, error):
    with pytest.raises(error):
        _avrocodec.build_reader(writer, reader)
    with pytest.raises(error):
        _avrocodec.build_reader(writer, reader, native=False)


# --- the writer ----------------------------------------------------------------------------------


def test_writer_refuses_what_it_cannot_take_so_serde_falls_back_to_fastavro():
    write = _avrocodec.build_writer(schemas.load("reward"))
    good = {
        "event_id": "e",
        "reward_id": "r",
        "domain": "d",
        "timestamp": 1,
        "signals": {"a": 1.0},
        "value": None,
    }
    assert write(good) == _write(_plain(schemas.load("reward")), good)  # tenant, workspace: defaults
    for bad, error in [
        ({**good, "event_id": 3}, TypeError),
        ({**good, "timestamp": 2**63}, OverflowError),
        ({**good, "timestamp": 1.0}, TypeError),
        ({**good, "signals": {1: 1.0}}, TypeError),
        ({**good, "signals": {"a": "x"}}, TypeError),
        ({**good, "value": "x"}, TypeError),
        ({k: v for k, v in good.items() if k != "domain"}, KeyError),
    ]:
        with pytest.raises(error):
            write(bad)
    serde = AvroSerde("reward", framing="single_object")
    assert serde.decode(serde.encode({**good, "signals": {"a": 1}}))["signals"] == {"a": 1.0}


def test_writer_range_checks_ints_and_floats_like_struct_does():
    schema = {
        "type": "record",
        "name": "N",
        "fields": [{"name": "i", "type": "int"}, {"name": "f", "type": "float"}, {"name": "b", "type": "boolean"}],
    }
    write = _avrocodec.build_writer(schema)
    assert write({"i": 2**31 - 1, "f": 0.5, "b": True}) == _write(_plain(schema), {"i": 2**31 - 1, "f": 0.5, "b": True})
    with pytest.raises(OverflowError):
        write({"i": 2**31, "f": 0.5, "b": True})
    with pytest.raises(OverflowError):
        write({"i": 0, "f": 1e300, "b": True})
    with pytest.raises(TypeError):
        write({"i": 0, "f": 0.5, "b": 1})


# --- errors: truncated, corrupt, incompatible ----------------------------------------------------


def _decision_body() -> bytes:
    return AvroSerde("decision", framing="single_object").encode(decision())[10:]


def test_every_truncation_of_a_valid_payload_is_truncated():
    body = _decision_body()
    read = _c_reader(schemas.load("decision"))
    for keep in range(len(body)):
        with pytest.raises(_avrocodec.Truncated):
            read(body[:keep], 0)
        with pytest.raises(IndexError):  # what serde maps to TruncatedPayload
            read(body[:keep], 0)


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        (b"\x01", _avrocodec.CorruptData, "negative length -1 at offset 0"),
        (b"\x02\xff", _avrocodec.CorruptData, "invalid UTF-8 in a string at byte 1"),
        (b"\x00\x08", _avrocodec.CorruptData, "union index 4 out of range"),
        (b"\x00\x03", _avrocodec.CorruptData, "union index -2 out of range"),
        (b"\x00\x02\x02", _avrocodec.CorruptData, "boolean byte 2 at offset 2"),
        (b"\x00" + b"\x80" * 10 + b"\x00", _avrocodec.CorruptData, "varint longer than 10 bytes"),
        (b"\x00" + b"\xff" * 9 + b"\x02", _avrocodec.CorruptData, "overflows 64 bits"),
        (b"\x00\x04\x08", _avrocodec.CorruptData, "enum index 4 of t.E"),
        (b"\x00\x04\x04", _avrocodec.Incompatible, "t.E symbol 2 is unknown to the reader"),
        (b"\x00\x06", _avrocodec.Incompatible, "union branch 3 of the writer has no match"),
        (b"\x00\x04", _avrocodec.Truncated, "ends inside"),
    ],
)
def test_bytes_that_are_not_avro_of_the_schema_raise_typed_errors(body, error, message):
    writer = {
        "type": "record",
        "name": "t.R",
        "fields": [
            {"name": "s", "type": "string"},
            {"name": "u", "type": ["null", "boolean", {"type": "enum", "name": "E", "symbols": ["a", "b", "c"]}, "long"]},
        ],
    }
    reader = copy.deepcopy(writer)
    reader["fields"][1]["type"] = ["null", "boolean", {"type": "enum", "name": "E", "symbols": ["a", "b"]}]
    read = _c_reader(writer, reader)
    with pytest.raises(error, match=message):
        read(body, 0)


def test_serde_maps_the_c_readers_errors_to_its_typed_errors():
    serde = AvroSerde("decision", framing="single_object")
    payload = serde.encode(decision())
    event_id_at = payload.index(b"evt-000000")
    bad_utf8 = payload[:event_id_at] + b"\xff" + payload[event_id_at + 1 :]
    reward = AvroSerde("reward", framing="single_object").encode(
        {"event_id": "e", "reward_id": "r", "domain": "d", "timestamp": 1}
    )

    with pytest.raises(TruncatedPayload):
        serde.decode(payload[:-4])
    with pytest.raises(CorruptPayload, match="invalid UTF-8"):
        serde.decode(bad_utf8)
    with pytest.raises(IncompatibleSchema):
        serde.decode(reward)
    results = serde.decode_batch([payload, payload[:-4], bad_utf8, payload])
    assert [type(r).__name__ for r in results] == ["dict", "TruncatedPayload", "CorruptPayload", "dict"]


def test_an_array_of_zero_width_items_cannot_claim_unbounded_items():
    schema = {"type": "record", "name": "Z", "fields": [{"name": "z", "type": {"type": "array", "items": "null"}}]}
    read = _c_reader(schema)
    assert read(b"\x06\x00", 0) == ({"z": [None, None, None]}, 2)
    with pytest.raises(_avrocodec.CorruptData, match="zero-width"):
        read(b"\xfe\xff\xff\xff\xff\xff\xff\xff\x7f\x00", 0)


# --- no crash, no hang, and the same outcome as the generated Python on any bytes ---------------


def _outcome(read, payload):
    try:
        value, end = read(payload, 0)
    except (IndexError, struct.error):
        return ("truncated",)
    except (_avrocodec.CorruptData, UnicodeDecodeError) as exc:
        return ("corrupt", str(exc))
    except _avrocodec.Incompatible:
        return ("incompatible",)
    return ("ok", value, end)


def _agree(pair, payload):
    c = _outcome(_c_reader(*pair), payload)
    python = _outcome(_avrocodec.build_reader(*pair, native=False), payload)
    if c[0] == "corrupt" and "overflows 64 bits" in c[1]:
        return  # Python reads a 10-byte varint past 64 bits as an int too large for Avro
    assert c[0] == python[0], (c, python)
    if c[0] == "ok":
        assert repr(c[1:]) == repr(python[1:])  # repr: flipped bits make NaNs, which are != themselves


@pytest.mark.parametrize("pair", list(PAIRS), ids=str)
@FUZZ
@given(payload=st.binary(max_size=300))
def test_random_bytes_never_crash_and_decode_as_the_generated_reader_does(pair, payload):
    _agree(PAIRS[pair], payload)


@pytest.mark.parametrize("pair", list(PAIRS), ids=str)
@FUZZ
@given(data=st.data())
def test_mutated_payloads_never_crash_and_decode_as_the_generated_reader_does(pair, data):
    writer = _plain(PAIRS[pair][0])
    payload = bytearray(_write(writer, _draw(data, writer)))
    assume(payload)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(payload) - 1))
        action = data.draw(st.sampled_from(["flip", "set", "insert", "delete", "cut"]))
        if action == "flip":
            payload[at] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "set":
            payload[at] = data.draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]))
        elif action == "insert":
            payload[at:at] = data.draw(st.binary(min_size=1, max_size=4))
        elif action == "delete":
            del payload[at]
        else:
            del payload[at:]
        if not payload:
            break
    _agree(PAIRS[pair], bytes(payload))


# --- serde: the batch path, and the fallback when the extension is missing ----------------------


def _events(n=20):
    return [decision(i) for i in range(n)]


def test_batch_decode_keeps_order_errors_and_other_framings_in_place():
    reg = registry("avrofast-batch")
    single = AvroSerde("decision", framing="single_object", registry=reg)
    confluent = AvroSerde("decision", framing="confluent", registry=reg, topic="t")
    events = _events(6)
    payloads = [
        single.encode(events[0]),
        confluent.encode(events[1]),
        single.encode(events[2])[:50],
        bytearray(single.encode(events[3])),
        single.encode(events[4]),
        b"\xc3\x01" + bytes(8),
        single.encode(events[5]),
    ]

    results = single.decode_batch(iter(payloads))

    assert [type(r).__name__ for r in results] == [
        "dict",
        "dict",
        "TruncatedPayload",
        "dict",
        "dict",
        "UnknownFingerprint",
        "dict",
    ]
    assert [r for r in results if isinstance(r, dict)] == [events[i] for i in (0, 1, 3, 4, 5)]
    assert all(isinstance(r, DecodeError) for r in results if not isinstance(r, dict))
    small = AvroSerde("decision", framing="single_object", max_payload_bytes=100)
    assert type(small.decode_batch(payloads[:1])[0]).__name__ == "OversizePayload"


def test_batch_decode_leaves_the_garbage_collector_as_it_found_it():
    serde = AvroSerde("decision", framing="single_object")
    payloads = [serde.encode(e) for e in _events(50)]
    assert gc.isenabled()
    serde.decode_batch(payloads)
    assert gc.isenabled()
    gc.disable()
    try:
        serde.decode_batch(payloads)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_serde_uses_the_c_codec_when_built():
    serde = AvroSerde("decision", framing="single_object")
    payload = serde.encode(_events(1)[0])
    serde.decode(payload)
    (read,) = serde._readers.values()
    assert _avrocodec.batch_decoder(read) is not None
    assert isinstance(serde._write_fast.__self__, _avrofast.Writer)


def test_without_the_extension_serde_uses_the_generated_python(monkeypatch):
    monkeypatch.setattr(_avrocodec, "_avrofast", None)
    events = _events()
    serde = AvroSerde("decision", framing="single_object")
    payloads = serde.encode_batch(events)

    assert serde.decode_batch(payloads) == events
    assert serde.decode_batch([payloads[0][:30]])[0].reason == "truncated"
    (read,) = serde._readers.values()
    assert hasattr(read, "__source__") and _avrocodec.batch_decoder(read) is None
    assert hasattr(serde._write_fast, "__source__")
    monkeypatch.undo()
    assert AvroSerde("decision", framing="single_object").decode_batch(payloads) == events


def test_a_schema_nested_deeper_than_the_c_reader_takes_falls_back_to_python():
    schema: dict = {"type": "record", "name": "Leaf", "fields": [{"name": "v", "type": "long"}]}
    record: dict = {"v": 3}
    for depth in range(_avrofast.MAX_DEPTH + 5):
        schema = {"type": "record", "name": f"N{depth}", "fields": [{"name": "c", "type": schema}]}
        record = {"c": record}
    payload = _write(_plain(schema), record)

    read = _avrocodec.build_reader(schema)

    assert hasattr(read, "__source__")
    assert read(payload, 0) == (record, len(payload))
    assert _avrocodec.build_writer(schema)(record) == payload


def test_fuzzed_payloads_through_serde_are_values_or_decode_errors():
    rng = random.Random(5)
    serde = AvroSerde("decision", framing="single_object")
    payloads = [serde.encode(e) for e in _events(40)]
    mutated = []
    for payload in payloads:
        raw = bytearray(payload)
        for _ in range(rng.randint(1, 3)):
            raw[rng.randrange(10, len(raw))] = rng.randrange(256)
        mutated.append(bytes(raw))
    for result in serde.decode_batch(mutated):
        assert isinstance(result, (dict, DecodeError))
