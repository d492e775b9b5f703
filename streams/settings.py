"""The Kafka-side sections of the configuration tree: broker, schema registry, topics.

``banditstream.config`` composes these into the one tree it loads (file, then environment)
and passes down; this module only says what the sections are and what values are valid.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from streams.profiles import BrokerProfile, get_profile, PROFILES
from streams.serde import DEFAULT_MAX_PAYLOAD_BYTES, AvroSerde


#: Where every client's librdkafka log lines go (served by its poll()), not straight to stderr.
LIBRDKAFKA_LOG = logging.getLogger("banditstream.librdkafka")


class ConfigSection(BaseModel):
    """A section of the tree. Its secret fields (``SecretStr``: shown as ``**********`` by
    ``config show``, in errors and in reprs) also take ``<field>_file``, a file holding the
    value (a mounted Kubernetes Secret), e.g. ``BANDITSTREAM_KAFKA__SASL_PASSWORD_FILE``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _secret_files(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name in cls.secret_fields():
            path = data.get(f"{name}_file")
            if path is None:
                continue
            data = {key: value for key, value in data.items() if key != f"{name}_file"}
            if data.get(name) is not None:
                raise ValueError(f"{name} and {name}_file are both set: give one")
            try:
                data[name] = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"{name}_file {path}: {getattr(exc, 'strerror', None) or exc}") from None
        return data

    @classmethod
    def secret_fields(cls) -> list[str]:
        """The fields holding one secret (``SecretStr``, or it or None)."""
        return [name for name, info in cls.model_fields.items()
                if info.annotation is SecretStr or set(get_args(info.annotation)) == {SecretStr, type(None)}]


def _revealed(value: SecretStr | None) -> str | None:
    return None if value is None else value.get_secret_value()


def _tls(section: Any) -> dict[str, Any]:
    """A section's ``ssl_*`` fields checked whole (a client certificate needs its key) and as the
    client settings librdkafka and the registry client both name ``ssl.*`` (secrets revealed)."""
    if (section.ssl_certificate_location is None) != (section.ssl_key_location is None):
        raise ValueError("ssl_certificate_location and ssl_key_location go together (mutual TLS)")
    return {
        "ssl.ca.location": section.ssl_ca_location,
        "ssl.certificate.location": section.ssl_certificate_location,
        "ssl.key.location": section.ssl_key_location,
        "ssl.key.password": _revealed(section.ssl_key_password),
    }


#: librdkafka settings that hold secrets: set through the typed fields (never shown), not ``extra``.
_SECRET_LIBRDKAFKA_KEYS = ("password", "secret", "sasl.oauthbearer.config", "sasl.jaas.config", "ssl.key.pem")


class KafkaSettings(ConfigSection):
    """How to reach the broker."""

    bootstrap_servers: str = Field("127.0.0.1:9092", min_length=1, description="host:port[,host:port...]")
    profile: str = Field("kafka", description=f"broker compatibility profile: {', '.join(sorted(PROFILES))}")
    client_id: str = "banditstream"
    #: How producers place keyed records; the join refuses a record not where its key belongs.
    partitioner: Literal["murmur2_random", "consistent_random"] = Field(
        "murmur2_random",
        description="key placement of every producer: murmur2_random (Kafka's, as the Java client) or consistent_random",
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] | None = Field(
        None, description="how every client (producers, consumers, the join's faust app) talks to the brokers"
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = None
    sasl_username: str | None = Field(None, description="PLAIN and SCRAM")
    sasl_password: SecretStr | None = Field(None, description="PLAIN and SCRAM; or sasl_password_file")
    sasl_oauthbearer_token_endpoint_url: str | None = Field(None, description="OAUTHBEARER: the OIDC token endpoint")
    sasl_oauthbearer_client_id: str | None = None
    sasl_oauthbearer_client_secret: SecretStr | None = Field(None, description="or sasl_oauthbearer_client_secret_file")
    sasl_oauthbearer_scope: str | None = None
    ssl_ca_location: str | None = Field(None, description="CA bundle (PEM) that signed the brokers' certificates")
    ssl_certificate_location: str | None = Field(None, description="client certificate (PEM), for mutual TLS")
    ssl_key_location: str | None = Field(None, description="client key (PEM), for mutual TLS")
    ssl_key_password: SecretStr | None = Field(None, description="or ssl_key_password_file")
    #: Extra librdkafka settings for every client (tuning; secrets go in the typed fields above).
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        get_profile(value)
        return value

    @field_validator("bootstrap_servers")
    @classmethod
    def _host_port_list(cls, value: str) -> str:
        for server in value.split(","):
            host, sep, port = server.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{server.strip()!r} is not host:port")
        return value

    @field_validator("extra")
    @classmethod
    def _no_secrets_in_extra(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if any(word in key for word in _SECRET_LIBRDKAFKA_KEYS):
                raise ValueError(f"{key!r} holds a secret, which extra would show: use the secret fields "
                                 "kafka.sasl_password, kafka.sasl_oauthbearer_client_secret or kafka.ssl_key_password "
                                 "(from the environment or a <field>_file)")
        return value

    @model_validator(mode="after")
    def _security_is_whole(self) -> "KafkaSettings":
        sasl = (self.security_protocol or "").startswith("SASL")
        if self.sasl_mechanism and not sasl:
            raise ValueError(f"sasl_mechanism {self.sasl_mechanism} needs security_protocol SASL_SSL (or SASL_PLAINTEXT)")
        if sasl and not self.sasl_mechanism:
            raise ValueError(f"security_protocol {self.security_protocol} needs sasl_mechanism")
        if self.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and not (self.sasl_username and self.sasl_password):
            raise ValueError(f"sasl_mechanism {self.sasl_mechanism} needs sasl_username and sasl_password")
        if self.sasl_mechanism == "OAUTHBEARER" and not (
            self.sasl_oauthbearer_token_endpoint_url and self.sasl_oauthbearer_client_id and self.sasl_oauthbearer_client_secret
        ):
            raise ValueError("sasl_mechanism OAUTHBEARER needs sasl_oauthbearer_token_endpoint_url, "
                             "sasl_oauthbearer_client_id and sasl_oauthbearer_client_secret")
        _tls(self)
        return self

    @property
    def broker_profile(self) -> BrokerProfile:
        return get_profile(self.profile)

    def security_config(self) -> dict[str, Any]:
        """The librdkafka settings of the connection's security (secrets revealed: for clients only)."""
        settings = {
            "security.protocol": self.security_protocol,
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": _revealed(self.sasl_password),
            **_tls(self),
        }
        if self.sasl_mechanism == "OAUTHBEARER":
            settings.update({
                "sasl.oauthbearer.method": "oidc",
                "sasl.oauthbearer.token.endpoint.url": self.sasl_oauthbearer_token_endpoint_url,
                "sasl.oauthbearer.client.id": self.sasl_oauthbearer_client_id,
                "sasl.oauthbearer.client.secret": _revealed(self.sasl_oauthbearer_client_secret),
                "sasl.oauthbearer.scope": self.sasl_oauthbearer_scope,
            })  # fmt: skip
        return {key: value for key, value in settings.items() if value is not None}

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """A plain librdkafka config dict for an admin client (no profile extras)."""
        base = {"bootstrap.servers": self.bootstrap_servers, "client.id": self.client_id, "logger": LIBRDKAFKA_LOG}
        return {**base, **self.security_config(), **self.extra, **overrides}

    def producer_config(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka producer settings: idempotent, profile extras, then user extras."""
        # Back within a second of a broker's return (librdkafka waits up to 10 s between
        # reconnects): what a producer spooled meanwhile is late by the outage, not by that.
        base = {"enable.idempotence": True, "linger.ms": 5, "partitioner": self.partitioner,
                "reconnect.backoff.max.ms": 1000, **self.broker_profile.producer}
        return {**base, **self.client_config(), **overrides}

    def consumer_config(self, group_id: str, **overrides: Any) -> dict[str, Any]:
        """librdkafka consumer settings for a group; offsets are committed explicitly."""
        base = {
            "group.id": group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **self.broker_profile.consumer,
        }
        return {**base, **self.client_config(), **overrides}


class RegistrySettings(ConfigSection):
    """Schema registry, or none: without a URL events use the Avro single-object encoding."""

    url: str | None = Field(
        None, description="http(s)://... of a Confluent-compatible registry, or mock://NAME: confluent-kafka's registry "
        "inside one process, for tests and the demo only (the workers and serve refuse it)",
    )  # fmt: skip
    framing: Literal["confluent", "single_object"] | None = Field(
        None, description="wire framing for produced events; default: confluent with a registry, else single_object"
    )
    subject_strategy: Literal["topic", "record", "topic_record"] = "topic"
    auto_register_schemas: bool = Field(
        True, description="register a schema on first use (Confluent's auto.register.schemas); false: it must be registered"
    )
    use_latest_version: bool = Field(
        False, description="write with the subject's latest registered schema (Confluent's use.latest.version); "
        "needs auto_register_schemas false",
    )  # fmt: skip
    basic_auth_user_info: SecretStr | None = Field(None, description="USER:PASSWORD, or basic_auth_user_info_file")
    bearer_token: SecretStr | None = Field(None, description="a static bearer token, or bearer_token_file")
    bearer_logical_cluster: str | None = Field(None, description="with bearer_token: the registry's logical cluster id")
    bearer_identity_pool_id: str | None = None
    ssl_ca_location: str | None = Field(None, description="CA bundle (PEM) that signed the registry's certificate")
    ssl_certificate_location: str | None = Field(None, description="client certificate (PEM), for mutual TLS")
    ssl_key_location: str | None = Field(None, description="client key (PEM), for mutual TLS")
    ssl_key_password: SecretStr | None = Field(None, description="or ssl_key_password_file")

    @field_validator("url")
    @classmethod
    def _no_credentials_in_url(cls, value: str | None) -> str | None:
        if value and urlsplit(value).password is not None:
            raise ValueError("credentials in the URL would be shown and logged: set registry.basic_auth_user_info "
                             "(from the environment or basic_auth_user_info_file) instead")
        return value

    @model_validator(mode="after")
    def _framing_needs_registry(self) -> "RegistrySettings":
        if self.framing == "confluent" and not self.url:
            raise ValueError("framing 'confluent' needs registry.url")
        if self.use_latest_version and self.auto_register_schemas:
            raise ValueError("use_latest_version writes what is registered: set auto_register_schemas false with it")
        if self.basic_auth_user_info is not None and ":" not in self.basic_auth_user_info.get_secret_value():
            raise ValueError("basic_auth_user_info must be USER:PASSWORD")
        if self.basic_auth_user_info is not None and self.bearer_token is not None:
            raise ValueError("basic_auth_user_info and bearer_token: give one")
        if self.bearer_token is not None and not self.bearer_logical_cluster:
            raise ValueError("bearer_token needs bearer_logical_cluster (the registry's logical cluster id)")
        _tls(self)
        return self

    @property
    def effective_framing(self) -> str:
        return self.framing or ("confluent" if self.url else "single_object")

    def client_config(self) -> dict[str, Any]:
        """confluent-kafka's ``SchemaRegistryClient`` settings (secrets revealed: for the client only)."""
        settings: dict[str, Any] = {
            "url": self.url,
            "basic.auth.user.info": _revealed(self.basic_auth_user_info),
            **_tls(self),
        }
        if self.bearer_token is not None:
            settings.update({
                "bearer.auth.credentials.source": "STATIC_TOKEN",
                "bearer.auth.token": _revealed(self.bearer_token),
                "bearer.auth.logical.cluster": self.bearer_logical_cluster,
                "bearer.auth.identity.pool.id": self.bearer_identity_pool_id,
            })  # fmt: skip
        return {key: value for key, value in settings.items() if value is not None}

    def client(self) -> Any:
        """A registry client, or None without a URL (``mock://``: confluent-kafka's in-process one)."""
        if not self.url:
            return None
        from confluent_kafka.schema_registry import SchemaRegistryClient

        return SchemaRegistryClient.new_client(self.client_config())

    def serde(self, name: str, topic: str | None = None, *, client: Any = None, max_payload_bytes: int | None = None,
              skip: Collection[str] = ()) -> AvroSerde:
        """The serde of one event type in this framing (decoding reads both, leaving out the
        fields in ``skip``), on ``client`` or a new one: one per process is enough (it caches
        the ids it looked up)."""
        framing = self.effective_framing
        if client is None and self.url:
            client = self.client()
        return AvroSerde(
            name, framing=framing, registry=client, topic=topic, subject_strategy=self.subject_strategy,
            auto_register=self.auto_register_schemas, use_latest_version=self.use_latest_version,
            max_payload_bytes=max_payload_bytes or DEFAULT_MAX_PAYLOAD_BYTES, skip=skip,
        )  # fmt: skip


class TopicSettings(ConfigSection):
    """Names and shapes of the project's topics."""

    decisions: str = "bandit.decisions"
    rewards: str = "bandit.rewards"
    updates: str = "bandit.updates"
    posterior: str = "bandit.posterior"
    deadletter: str = "bandit.deadletter"
    #: Partitions of decisions and rewards (they must be equal: co-partitioned by event_id).
    partitions: int = Field(8, ge=1, le=10_000)
    #: Partitions of the updates topic: one learner shard each.
    update_partitions: int = Field(8, ge=1, le=10_000)
    replication: int = Field(1, ge=1, le=16)
    #: Retention of the event topics (decisions, rewards, updates, deadletter); -1 keeps forever.
    retention_ms: int = Field(7 * 24 * 3600 * 1000, ge=-1)

    @model_validator(mode="after")
    def _distinct_names(self) -> "TopicSettings":
        names = [self.decisions, self.rewards, self.updates, self.posterior, self.deadletter]
        if len(set(names)) != len(names):
            raise ValueError(f"topic names must be distinct, got {names}")
        return self

    def names(self) -> dict[str, str]:
        """Role -> topic name."""
        return {
            "decisions": self.decisions,
            "rewards": self.rewards,
            "updates": self.updates,
            "posterior": self.posterior,
            "deadletter": self.deadletter,
        }
