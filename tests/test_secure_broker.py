"""librdkafka clients authenticate for real against a SASL/TLS broker (tests/secure_broker.py).

The broker is Tansu behind the authenticating proxy: right credentials produce and consume,
wrong ones are refused within milliseconds and reach the client's ``error_cb`` as
``KafkaError._AUTHENTICATION`` (or ``_SSL`` for an untrusted certificate), which is how an
application sees them fail fast. Every client here is a plain confluent-kafka one, configured
only with librdkafka's own ``security.protocol``, ``sasl.*`` and ``ssl.*`` settings.

One broker serves SASL_SSL for the module; a second, cheap one (its own Tansu, ~0.2 s to
start) also requires a client certificate, for the mutual-TLS tests.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition

from tests.secure_broker import Authentication, SecureBroker, make_certificates

pytestmark = pytest.mark.integration

USERS = {"alice": "alice-secret", "bob": "bob-secret"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> SecureBroker:
    """SASL_SSL: PLAIN, SCRAM-SHA-256/512 and OAUTHBEARER over TLS, no client certificate."""
    with SecureBroker(tmp_path_factory.mktemp("sasl-ssl"), tls=True, users=USERS) as secure:
        yield secure


@pytest.fixture(scope="module")
def mtls_broker(tmp_path_factory) -> SecureBroker:
    """SASL_SSL that also requires a client certificate signed by its CA."""
    with SecureBroker(tmp_path_factory.mktemp("sasl-mtls"), tls=True, mutual_tls=True, users=USERS) as secure:
        yield secure


class ErrorLog:
    """An ``error_cb`` that keeps each error with the seconds since the log was made."""

    def __init__(self):
        self.started = time.monotonic()
        self.errors: list[tuple[float, KafkaError]] = []

    def __call__(self, error: KafkaError) -> None:
        self.errors.append((time.monotonic() - self.started, error))


def topic_name() -> str:
    return f"secure-{uuid.uuid4().hex[:8]}"


def produce_one(bootstrap: str, security: dict, topic: str, value: bytes) -> Message:
    """Produce ``value`` and return its delivery report; fail with the client's errors."""
    errors = ErrorLog()
    producer = Producer({"bootstrap.servers": bootstrap, **security, "error_cb": errors, "message.timeout.ms": 10000})
    reports: list[tuple[KafkaError | None, Message]] = []
    producer.produce(topic, value, on_delivery=lambda err, msg: reports.append((err, msg)))
    producer.flush(15)
    producer.close()
    assert reports and reports[0][0] is None, f"not delivered: {reports}, client errors: {errors.errors}"
    return reports[0][1]


def read_back(bootstrap: str, security: dict, delivered: Message) -> bytes:
    """Fetch the delivered record from its partition (assigned, so no group join)."""
    errors = ErrorLog()
    consumer = Consumer({"bootstrap.servers": bootstrap, **security, "error_cb": errors,
                         "group.id": "unused", "enable.auto.commit": False})
    consumer.assign([TopicPartition(delivered.topic(), delivered.partition(), OFFSET_BEGINNING)])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                return message.value()
    finally:
        consumer.close()
    raise AssertionError(f"nothing read back from {delivered.topic()}; client errors: {errors.errors}")


def wait_for_error(bootstrap: str, security: dict, code: int, within: float) -> tuple[float, KafkaError]:
    """The first error with ``code`` a producer reports while trying to deliver one record,
    and the seconds it took; fails if none comes ``within`` seconds."""
    errors = ErrorLog()
    producer = Producer({"bootstrap.servers": bootstrap, **security, "error_cb": errors, "message.timeout.ms": 5000})
    producer.produce(topic_name(), b"never delivered")
    try:
        while time.monotonic() - errors.started < within:
            producer.poll(0.02)  # serves error_cb
            matching = [(seconds, error) for seconds, error in errors.errors if error.code() == code]
            if matching:
                return matching[0]
    finally:
        producer.purge()
        producer.close()
    raise AssertionError(f"no {KafkaError(code).name()} within {within} s; errors: {errors.errors}")


def test_scram_sha_512_over_tls_produces_and_consumes_a_record(broker):
    security = {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": broker.ca_path,
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": "alice-secret",
    }
    topic = topic_name()
    produce_one(broker.bootstrap, security, topic, b"over scram")

    errors = ErrorLog()
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, **security, "error_cb": errors,
                         "group.id": f"g-{topic}", "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    consumer.subscribe([topic])  # the group coordinator's connection authenticates too
    received = None
    try:
        deadline = time.monotonic() + 15
        while received is None and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                received = message.value()
    finally:
        consumer.close()

    assert received == b"over scram", f"client errors: {errors.errors}"
    assert Authentication("SCRAM-SHA-512", "alice", ok=True) in broker.authentications


def test_plain_credentials_authenticate(broker):
    security = {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": broker.ca_path,
        "sasl.mechanism": "PLAIN",
        "sasl.username": "bob",
        "sasl.password": "bob-secret",
    }
    delivered = produce_one(broker.bootstrap, security, topic_name(), b"over plain")

    assert read_back(broker.bootstrap, security, delivered) == b"over plain"
    assert Authentication("PLAIN", "bob", ok=True) in broker.authentications


def test_oauthbearer_token_from_the_oidc_endpoint_authenticates(broker):
    security = {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": broker.ca_path,
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.client.id": broker.oauth_client_id,
        "sasl.oauthbearer.client.secret": broker.oauth_client_secret,
        "sasl.oauthbearer.token.endpoint.url": broker.token_endpoint_url,
    }
    delivered = produce_one(broker.bootstrap, security, topic_name(), b"over oauth")

    assert read_back(broker.bootstrap, security, delivered) == b"over oauth"
    # the principal is the token's subject, which the token endpoint set to the client id
    assert Authentication("OAUTHBEARER", broker.oauth_client_id, ok=True) in broker.authentications


def test_wrong_password_reaches_error_cb_as_authentication_error_within_two_seconds(broker):
    security = {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": broker.ca_path,
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "alice",
        "sasl.password": "not-alices-password",
    }
    seconds, error = wait_for_error(broker.bootstrap, security, KafkaError._AUTHENTICATION, within=2.0)

    assert seconds < 2.0
    assert "invalid credentials" in error.str()
    assert Authentication("SCRAM-SHA-256", "alice", ok=False, reason="wrong password for 'alice'") in broker.authentications


def test_wrong_oauth_client_secret_fails_at_the_token_endpoint(broker):
    before = len(broker.authentications)
    security = {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": broker.ca_path,
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.client.id": broker.oauth_client_id,
        "sasl.oauthbearer.client.secret": "not-the-secret",
        "sasl.oauthbearer.token.endpoint.url": broker.token_endpoint_url,
    }
    seconds, error = wait_for_error(broker.bootstrap, security, KafkaError._AUTHENTICATION, within=2.0)

    assert seconds < 2.0
    assert "invalid_client" in error.str()
    # no token, so the client never presented one to the broker
    assert not [a for a in broker.authentications[before:] if a.mechanism == "OAUTHBEARER"]


def test_untrusted_ca_fails_the_tls_handshake_quickly(broker, tmp_path):
    other_ca = make_certificates(tmp_path).ca_path  # a CA that did not sign the broker's certificate
    before = len(broker.authentications)
    security = {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": other_ca,
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": "alice-secret",
    }
    # librdkafka 2.16 reports the first failed handshake as _SSL or, racily, as _TRANSPORT with
    # the same text; the retry ~50 ms later is _SSL
    seconds, error = wait_for_error(broker.bootstrap, security, KafkaError._SSL, within=2.0)

    assert seconds < 2.0
    assert "certificate verify failed" in error.str()
    assert broker.authentications[before:] == []  # refused before SASL began


def test_mutual_tls_with_an_encrypted_client_key_authenticates(mtls_broker):
    security = {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": mtls_broker.ca_path,
        "ssl.certificate.location": mtls_broker.client_cert_path,
        "ssl.key.location": mtls_broker.client_key_path,
        "ssl.key.password": mtls_broker.client_key_password,
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "alice",
        "sasl.password": "alice-secret",
    }
    delivered = produce_one(mtls_broker.bootstrap, security, topic_name(), b"over mtls")

    assert read_back(mtls_broker.bootstrap, security, delivered) == b"over mtls"
    expected = Authentication("SCRAM-SHA-256", "alice", ok=True, client_cert_subject=mtls_broker.client_cert_subject)
    assert expected in mtls_broker.authentications


def test_mutual_tls_refuses_a_client_without_a_certificate(mtls_broker):
    before = len(mtls_broker.authentications)
    security = {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": mtls_broker.ca_path,
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "alice",
        "sasl.password": "alice-secret",
    }
    # TLS 1.3: the client finishes its side of the handshake, then the proxy drops the
    # connection (asyncio sends no alert), which librdkafka logs as a disconnect and reports
    # through error_cb only as "all brokers down"
    seconds, _ = wait_for_error(mtls_broker.bootstrap, security, KafkaError._ALL_BROKERS_DOWN, within=2.0)

    assert seconds < 2.0
    assert mtls_broker.authentications[before:] == []  # the handshake failed, SASL never began
