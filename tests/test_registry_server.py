"""The in-process schema registry works with confluent-kafka's own client and Avro serdes."""

from __future__ import annotations

import datetime
import json
import random
import struct
import time

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.common._httpx_compat import httpx  # httpx2 or httpx, as the client uses
from confluent_kafka.serialization import MessageField, SerializationContext

import schemas
from tests.join_helpers import decision
from tests.registry_server import RegistryServer, make_self_signed_cert

ORDER = json.dumps({
    "type": "record", "name": "Order", "namespace": "test",
    "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "double"}],
})  # fmt: skip
#: ORDER plus a field with a default: a backward-compatible next version.
ORDER_V2 = json.dumps({
    "type": "record", "name": "Order", "namespace": "test",
    "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "double"},
               {"name": "note", "type": "string", "default": "none"}],
})  # fmt: skip
CTX = SerializationContext("orders", MessageField.VALUE)  # subject "orders-value"


@pytest.fixture
def server():
    with RegistryServer() as running:
        yield running


def client(url: str, **conf) -> SchemaRegistryClient:
    """A fresh client (its own caches), failing fast on transport errors."""
    return SchemaRegistryClient({"url": url, "max.retries": 0, **conf})


def framed_id(data: bytes) -> int:
    """The schema id in Confluent's framing: magic byte 0, then the id as a big-endian int32."""
    assert data[0] == 0
    return struct.unpack(">I", data[1:5])[0]


def registry_error(call) -> SchemaRegistryError:
    with pytest.raises(SchemaRegistryError) as caught:
        call()
    return caught.value


def test_avro_record_round_trips_through_the_registry(server):
    record = {"id": "o-1", "amount": 12.5}
    data = AvroSerializer(client(server.url), ORDER)(record, CTX)
    reader = client(server.url)  # a second client: its cache does not know the id yet
    assert AvroDeserializer(reader)(data, CTX) == record
    assert framed_id(data) == reader.get_latest_version("orders-value").schema_id
    sent = [(r.method, r.path) for r in server.requests]
    # the default subject-name strategy asks for the topic's associations, then uses "orders-value"
    assert ("GET", "/associations/resources/-/orders?resourceType=topic&associationType=value") in sent
    assert ("POST", "/subjects/orders-value/versions?normalize=False") in sent
    assert ("GET", f"/schemas/ids/{framed_id(data)}?subject=orders-value") in sent


def test_decision_event_round_trips_through_the_registry(server):
    record = decision("evt-1", "routing", random.Random(3), 1_700_000_000_123)
    ctx = SerializationContext("decisions", MessageField.VALUE)
    data = AvroSerializer(client(server.url), schemas.schema_str("decision"))(record, ctx)
    decoded = AvroDeserializer(client(server.url))(data, ctx)
    # timestamp-millis comes back as a datetime; fields the record left out take their defaults
    assert decoded["timestamp"] == datetime.datetime.fromtimestamp(1_700_000_000.123, datetime.timezone.utc)
    assert {k: v for k, v in decoded.items() if k in record and k != "timestamp"} == {
        k: v for k, v in record.items() if k != "timestamp"
    }
    registered = client(server.url).get_version("decisions-value", 1)
    assert json.loads(registered.schema.schema_str) == schemas.load("decision")  # the serializer strips the text


def test_same_schema_gets_the_same_id_across_subjects(server):
    first = client(server.url).register_schema("a-value", Schema(ORDER, "AVRO"))
    assert client(server.url).register_schema("a-value", Schema(ORDER, "AVRO")) == first
    reformatted = json.dumps(json.loads(ORDER), indent=2)
    assert client(server.url).register_schema("b-value", Schema(reformatted, "AVRO")) == first
    other = client(server.url).register_schema("a-value", Schema(ORDER_V2, "AVRO"))
    assert other != first
    reader = client(server.url)
    assert reader.get_subjects() == ["a-value", "b-value"]
    assert reader.get_versions("a-value") == [1, 2]
    assert reader.get_versions("b-value") == [1]
    assert reader.get_latest_version("a-value").schema_id == other
    assert reader.get_schema(first).schema_str == ORDER
    assert reader.lookup_schema("b-value", Schema(ORDER, "AVRO")).version == 1


def test_missing_things_and_invalid_schemas_get_the_registry_error_codes(server):
    reader = client(server.url)
    reader.register_schema("a-value", Schema(ORDER, "AVRO"))
    cases = {
        40401: lambda: reader.get_latest_version("nobody-value"),
        40402: lambda: reader.get_version("a-value", 9),
        40403: lambda: reader.get_schema(999),
    }
    for code, call in cases.items():
        error = registry_error(call)
        assert (error.http_status_code, error.error_code) == (404, code)
    assert registry_error(lambda: reader.lookup_schema("a-value", Schema(ORDER_V2, "AVRO"))).error_code == 40403
    for bad in ("not json", json.dumps({"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]})):
        error = registry_error(lambda: reader.register_schema("a-value", Schema(bad, "AVRO")))
        assert (error.http_status_code, error.error_code) == (422, 42201)


def test_serializer_without_auto_register_needs_a_registered_schema(server):
    conf = {"auto.register.schemas": False}
    error = registry_error(lambda: AvroSerializer(client(server.url), ORDER, conf=conf)({"id": "o", "amount": 1.0}, CTX))
    assert error.error_code == 40401
    schema_id = client(server.url).register_schema("orders-value", Schema(ORDER, "AVRO"))
    data = AvroSerializer(client(server.url), ORDER, conf=conf)({"id": "o", "amount": 1.0}, CTX)
    assert framed_id(data) == schema_id
    assert client(server.url).get_versions("orders-value") == [1]  # looked up, not registered again


def test_use_latest_version_writes_and_reads_with_the_latest_schema(server):
    admin = client(server.url)
    admin.register_schema("orders-value", Schema(ORDER, "AVRO"))
    latest = admin.register_schema("orders-value", Schema(ORDER_V2, "AVRO"))
    conf = {"auto.register.schemas": False, "use.latest.version": True}
    data = AvroSerializer(client(server.url), ORDER, conf=conf)({"id": "o", "amount": 2.0}, CTX)
    assert framed_id(data) == latest
    assert AvroDeserializer(client(server.url))(data, CTX) == {"id": "o", "amount": 2.0, "note": "none"}
    # written with version 1, read with the latest: the reader fills in the new field
    old = AvroSerializer(client(server.url), ORDER)({"id": "p", "amount": 3.0}, CTX)
    reader = AvroDeserializer(client(server.url), conf={"use.latest.version": True})
    assert reader(old, CTX) == {"id": "p", "amount": 3.0, "note": "none"}
    assert admin.get_versions("orders-value") == [1, 2]


def test_deleted_subject_is_hidden_then_removed(server):
    admin = client(server.url)
    first = admin.register_schema("orders-value", Schema(ORDER, "AVRO"))
    admin.register_schema("orders-value", Schema(ORDER_V2, "AVRO"))
    assert registry_error(lambda: admin.delete_subject("orders-value", permanent=True)).error_code == 40405
    assert admin.delete_subject("orders-value") == [1, 2]
    assert admin.get_subjects() == []
    assert admin.get_subjects(deleted=True) == ["orders-value"]
    assert registry_error(lambda: admin.get_latest_version("orders-value")).error_code == 40401
    assert admin.get_version("orders-value", 1, deleted=True).schema_id == first
    assert admin.delete_subject("orders-value", permanent=True) == [1, 2]
    assert admin.get_subjects(deleted=True) == []


def test_basic_auth_accepts_the_right_credentials_only():
    with RegistryServer(basic_auth=("alice", "s3cret")) as server:
        good = client(server.url, **{"basic.auth.user.info": "alice:s3cret"})
        assert good.register_schema("orders-value", Schema(ORDER, "AVRO")) == 1
        assert server.requests[-1].authorization == "Basic YWxpY2U6czNjcmV0"  # base64 "alice:s3cret"
        for conf in ({"basic.auth.user.info": "alice:wrong"}, {}):
            started = time.monotonic()
            error = registry_error(lambda: client(server.url, **conf).get_subjects())
            assert (error.http_status_code, error.error_code) == (401, 401)
            assert time.monotonic() - started < 2.0


def test_bearer_token_accepts_the_right_token_only():
    bearer = {"bearer.auth.credentials.source": "STATIC_TOKEN", "bearer.auth.logical.cluster": "lsrc-1"}
    with RegistryServer(bearer_token="tok-1") as server:
        good = client(server.url, **bearer, **{"bearer.auth.token": "tok-1"})
        assert good.register_schema("orders-value", Schema(ORDER, "AVRO")) == 1
        assert server.requests[-1].authorization == "Bearer tok-1"
        assert server.requests[-1].headers["target-sr-cluster"] == "lsrc-1"
        started = time.monotonic()
        error = registry_error(lambda: client(server.url, **bearer, **{"bearer.auth.token": "tok-2"}).get_subjects())
        assert (error.http_status_code, error.error_code) == (401, 401)
        assert time.monotonic() - started < 2.0


def test_https_works_with_the_ca_and_fails_verification_without_it(tmp_path):
    ca, cert, key = make_self_signed_cert(tmp_path)
    with RegistryServer(tls=(cert, key)) as server:
        assert server.url.startswith("https://127.0.0.1:")
        trusting = client(server.url, **{"ssl.ca.location": ca})
        assert trusting.register_schema("orders-value", Schema(ORDER, "AVRO")) == 1
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            client(server.url).get_subjects()
        assert len(server.requests) == 1  # the rejected connection never became a request
