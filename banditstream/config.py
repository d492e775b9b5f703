"""One typed configuration tree, loaded once (file, then environment) and passed down.

    >>> settings = load_settings(env={"BANDITSTREAM_KAFKA__BOOTSTRAP_SERVERS": "10.0.0.5:9092"})
    >>> settings.kafka.bootstrap_servers
    '10.0.0.5:9092'

Sources, later ones winning:

1. defaults (a local broker on 127.0.0.1:9092, a snapshot directory, no registry);
2. a file: ``path`` or ``$BANDITSTREAM_CONFIG`` (``.toml``, ``.yaml``/``.yml`` or ``.json``);
3. environment variables ``BANDITSTREAM_<SECTION>__<FIELD>[__<FIELD>...]``, e.g.
   ``BANDITSTREAM_KAFKA__BOOTSTRAP_SERVERS`` or ``BANDITSTREAM_DOMAINS__ROUTING__POLICY``.
   Values are strings coerced to the field's type; a value starting with ``{`` or ``[`` is
   read as JSON.

An invalid value raises :class:`ConfigError` whose message is one line naming the field, the
offending value and where it came from; the CLI prints it and exits 2.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator

from learner.domain import DomainSettings
from streams.settings import ConfigSection, KafkaSettings, RegistrySettings, TopicSettings
from streams.validation import DomainLimits, ValidationLimits
from streams.worker import WorkerConfig

ENV_PREFIX = "BANDITSTREAM_"
ENV_CONFIG_FILE = "BANDITSTREAM_CONFIG"
_ID = re.compile(r"^[A-Za-z0-9_.\-]+$")


class ConfigError(ValueError):
    """The configuration is invalid; the message is one line naming the field."""


class S3Settings(ConfigSection):
    """Where the S3 API is (for an S3 snapshot store), and its credentials: keys here (the
    secret from the environment or ``secret_access_key_file``), a named ``profile``, or
    neither, and boto3's standard chain finds them (``AWS_*`` variables, ``~/.aws``, a pod's
    IRSA web identity, the instance role)."""

    endpoint_url: str | None = Field(None, description="None: AWS itself")
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = Field(None, description="or secret_access_key_file")
    session_token: SecretStr | None = Field(None, description="with temporary keys; or session_token_file")
    profile: str | None = Field(None, description="a profile of ~/.aws/config and credentials")
    region: str = "us-east-1"

    @model_validator(mode="after")
    def _keys_go_together(self) -> "S3Settings":
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("access_key_id and secret_access_key go together (or neither: boto3's standard chain)")
        if self.profile and self.access_key_id:
            raise ValueError("profile and access_key_id: give one")
        return self


class StoreSettings(ConfigSection):
    """Local state of the workers and where signed snapshots live."""

    state_dir: str = Field(".banditstream/state", description="RocksDB shards and join tables live here")
    snapshots: str = Field(
        ".banditstream/snapshots", description="snapshot repository: a directory, file://..., s3://bucket/prefix or http(s)://..."
    )


class PublishSettings(ConfigSection):
    """The publisher: keys, cadence, channels, guards, retention."""

    keys_dir: str = Field(".banditstream/keys", description="Ed25519 keys and root.json from `banditstream keys generate`")
    every_updates: int = Field(1000, ge=1)
    every_seconds: float = Field(10.0, gt=0)
    channels: tuple[Literal["canary", "stable"], ...] = ("canary", "stable")
    keep_versions: int = Field(10, ge=1)
    min_samples: int = Field(1, ge=0)
    drift_factor: float = Field(2.0, gt=1.0, description="a context feature's spread may change, its share fall, by this factor")
    drift_shift: float = Field(1.0, gt=0, description="a context feature's mean may move by this many standard deviations")
    drift_window: int = Field(1000, ge=1, description="decisions compared: the newest window and its reference each")
    on_drift: Literal["abort", "flag"] = Field("abort", description="hold a drifted snapshot back, or publish it flagged")
    timestamp_expiry_s: float = Field(86_400.0, gt=0)


class SdkSettings(ConfigSection):
    """The SDK's pull side."""

    trusted_root: str | None = Field(None, description="root.json every client trusts; default: keys_dir/root.json")
    cache_dir: str = ".banditstream/cache"
    channel: Literal["canary", "stable"] = "stable"
    refresh_interval_s: float = Field(5.0, gt=0)


class MetricsSettings(ConfigSection):
    port: int = Field(0, ge=0, le=65535, description="Prometheus port of a worker; 0 picks a free one")
    host: str = Field(
        "127.0.0.1", min_length=1,
        description="address the metrics endpoint binds to: loopback by default, 0.0.0.0 in a container or pod",
    )  # fmt: skip


class LimitSettings(ConfigSection):
    """What the boundary accepts (streams.validation.ValidationLimits): the SDK refuses it at
    decide(), the workers dead-letter it with reason ``field_too_large`` (``too_many_actions``)."""

    max_payload_bytes: int = Field(1_000_000, ge=1024)
    probability_tolerance: float = Field(1e-6, gt=0, lt=0.1)
    max_id_bytes: int = Field(
        256, ge=32, description="longest id in UTF-8 bytes: event, reward and action ids, tenant, workspace, domain, "
        "policy_version (the SDK's own event ids take 32)",
    )  # fmt: skip
    max_string_bytes: int = Field(1024, ge=1, description="longest feature or signal name, or categorical value, in UTF-8 bytes")
    max_actions: int = Field(256, ge=1, description="most candidates per decision, for domains that set no max_actions")
    max_features: int = Field(512, ge=1, description="most named features (numeric + categorical) in a context, and in each action")
    max_vector_dim: int = Field(4096, ge=1, description="longest dense vector, for domains that set no features.vector_dim")
    max_signals: int = Field(64, ge=1, description="most named signals in one reward")

    @field_validator(
        "max_payload_bytes", "max_id_bytes", "max_string_bytes", "max_actions", "max_features", "max_vector_dim", "max_signals",
        mode="before",
    )  # fmt: skip
    @classmethod
    def _not_a_boolean(cls, value: Any) -> Any:
        if isinstance(value, bool):  # pydantic would read true as 1
            raise ValueError("must be an integer, not a boolean")
        return value


class ServeRoute(ConfigSection):
    """Where one key's Personalizer calls go (empty: the tree's tenant and workspace, ``serve.domain``)."""

    tenant: str | None = None
    workspace: str | None = None
    domain: str | None = Field(None, description="the domain its calls decide for")
    domains: tuple[str, ...] = Field((), description="other domains the key may pick with ?domain=NAME")

    @field_validator("tenant", "workspace", "domain")
    @classmethod
    def _identifier(cls, value: str | None) -> str | None:
        if value is not None and not _ID.match(value):
            raise ValueError("must be letters, digits, '_', '.', or '-'")
        return value

    @field_validator("domains")
    @classmethod
    def _identifiers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not _ID.match(name):
                raise ValueError(f"domain name {name!r} must be letters, digits, '_', '.', or '-'")
        return value


class ServeSettings(ConfigSection):
    """``banditstream serve``: the Personalizer-compatible REST service.

    Keys are secrets: ``config show`` prints them as ``**********``. They come from ``keys``
    (name -> key, e.g. ``BANDITSTREAM_SERVE__KEYS__TEAM_A``) and from ``key_dir``, a directory
    of files (a mounted Kubernetes Secret: each file's name is the key's name, its content
    the key). ``routes`` sends each key name's calls to a tenant/workspace/domain.
    """

    host: str = Field("127.0.0.1", min_length=1, description="address to bind: 0.0.0.0 in a container or pod")
    port: int = Field(8080, ge=0, le=65535, description="0 picks a free one")
    keys: dict[str, SecretStr] = Field(default_factory=dict, description="key name -> Ocp-Apim-Subscription-Key value")
    key_dir: str | None = Field(None, description="a directory of key files (file name: key name)")
    routes: dict[str, ServeRoute] = Field(default_factory=dict, description="key name -> tenant/workspace/domain")
    domain: str = Field("personalizer", description="the domain of keys without a route's domain")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="larger request bodies are refused with 413")
    check_event_ids: bool = Field(
        True, description="answer 404 to rewards/activations of event ids this process surely never ranked; "
        "set false behind a load balancer with more than one replica",
    )  # fmt: skip
    remember_events: int = Field(200_000, ge=1, description="ranked event ids kept in memory per domain")
    allow_model_reset: bool = Field(False, description="let DELETE model publish a snapshot from priors (needs publish keys)")
    stats_cache_s: float = Field(5.0, ge=0, description="GET /v1/stats reuses a leaderboard this long before reading the updates topic again")

    @field_validator("domain")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not _ID.match(value):
            raise ValueError("must be letters, digits, '_', '.', or '-'")
        return value

    @field_validator("keys")
    @classmethod
    def _non_empty_keys(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, key in value.items():
            if not key.get_secret_value():
                raise ValueError(f"key {name!r} is empty")
        return value


class Settings(ConfigSection):
    """The whole tree."""

    tenant: str = "default"
    workspace: str = "main"
    kafka: KafkaSettings = KafkaSettings()
    registry: RegistrySettings = RegistrySettings()
    topics: TopicSettings = TopicSettings()
    stores: StoreSettings = StoreSettings()
    publish: PublishSettings = PublishSettings()
    sdk: SdkSettings = SdkSettings()
    s3: S3Settings = S3Settings()
    metrics: MetricsSettings = MetricsSettings()
    limits: LimitSettings = LimitSettings()
    serve: ServeSettings = ServeSettings()
    domains: dict[str, DomainSettings] = Field(default_factory=dict)
    #: join worker knobs (streams._join_state.JoinOptions: batch_max, sweep_interval_s, ...)
    join: dict[str, Any] = Field(default_factory=dict)
    #: learner worker knobs (streams.learn.LearnerOptions: block_size, emit_every_s, ...)
    learn: dict[str, Any] = Field(default_factory=dict)

    @field_validator("join")
    @classmethod
    def _join_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        from streams._join_state import JoinOptions

        return _check_options(JoinOptions.from_mapping, value)

    @field_validator("learn")
    @classmethod
    def _learn_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        from streams.learn import LearnerOptions

        return _check_options(LearnerOptions.from_extra, value)

    @field_validator("tenant", "workspace")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not _ID.match(value):
            raise ValueError("must be letters, digits, '_', '.', or '-'")
        return value

    @field_validator("domains")
    @classmethod
    def _domain_names(cls, value: dict[str, DomainSettings]) -> dict[str, DomainSettings]:
        for name in value:
            if not _ID.match(name):
                raise ValueError(f"domain name {name!r} must be letters, digits, '_', '.', or '-'")
        return value

    def worker_config(self) -> WorkerConfig:
        """What a worker process needs, as one value."""
        return WorkerConfig(
            kafka=self.kafka,
            topics=self.topics,
            registry=self.registry,
            domains=dict(self.domains),
            limits=self.validation_limits(),
            state_dir=Path(self.stores.state_dir),
            metrics_port=self.metrics.port,
            metrics_host=self.metrics.host,
            tenant=self.tenant,
            workspace=self.workspace,
            extra={"join": dict(self.join), "learn": dict(self.learn)},
        )

    def s3_client_kwargs(self) -> dict[str, Any]:
        """boto3 client keyword arguments for an s3:// snapshot repository."""
        kwargs: dict[str, Any] = {"region_name": self.s3.region}
        if self.s3.endpoint_url:
            kwargs["endpoint_url"] = self.s3.endpoint_url
        if self.s3.access_key_id:
            kwargs["aws_access_key_id"] = self.s3.access_key_id
            kwargs["aws_secret_access_key"] = self.s3.secret_access_key.get_secret_value()
            if self.s3.session_token is not None:
                kwargs["aws_session_token"] = self.s3.session_token.get_secret_value()
        if self.s3.profile:
            kwargs["profile_name"] = self.s3.profile
        return kwargs

    def snapshot_store(self) -> Any:
        """The snapshot repository's store (``stores.snapshots``: a directory or ``s3://``)."""
        from publisher.stores import open_store

        return open_store(self.stores.snapshots, s3=self.s3_client_kwargs())

    def publisher_config(self) -> Any:
        """The ``publish`` section as the publisher's ``PublisherConfig``."""
        from datetime import timedelta

        from publisher.guards import GuardConfig
        from publisher.publish import PublisherConfig
        from publisher.repository import RepositoryConfig

        p = self.publish
        return PublisherConfig(
            repository=RepositoryConfig(keep_versions=p.keep_versions, timestamp_expiry=timedelta(seconds=p.timestamp_expiry_s)),
            guards=GuardConfig(min_samples=p.min_samples, drift_factor=p.drift_factor, drift_shift=p.drift_shift,
                               drift_window=p.drift_window, on_drift=p.on_drift),
            channels=tuple(p.channels),
        )

    def publisher(self, domains: Mapping[str, Any] | None = None, *, tenant: str | None = None, workspace: str | None = None) -> Any:
        """A ``Publisher`` signing with ``publish.keys_dir``'s keys, for ``domains`` (default:
        every configured one) of ``tenant``/``workspace`` (default: the config's): what the
        operator commands (promote, gate, reset) write with."""
        from publisher.cli_ops import load_keys
        from publisher.publish import Publisher

        keys, root = load_keys(self.publish.keys_dir)
        return Publisher(self.snapshot_store(), keys, root, domains=dict(self.domains if domains is None else domains),
                         tenant=tenant or self.tenant, workspace=workspace or self.workspace,
                         config=self.publisher_config())  # fmt: skip

    @property
    def trusted_root_path(self) -> Path:
        return Path(self.sdk.trusted_root) if self.sdk.trusted_root else Path(self.publish.keys_dir) / "root.json"

    def validation_limits(self) -> ValidationLimits:
        """What the boundary validator accepts: the configured domains (any, if none are)."""
        domains = None
        if self.domains:
            domains = {
                name: DomainLimits(vector_dim=d.features.vector_dim or None, max_actions=d.max_actions)
                for name, d in self.domains.items()
            }
        return ValidationLimits(domains=domains, **self.limits.model_dump())


def _check_options(build, value: dict[str, Any]) -> dict[str, Any]:
    """Worker knobs are plain dataclasses: coerce environment strings, then let them judge."""
    value = {key: _scalar(item) for key, item in value.items()}
    try:
        build(value)
    except TypeError as exc:  # dataclass(**value) with a key it does not have, or a wrong type
        raise ValueError(str(exc).split("__init__() ")[-1]) from None
    return value


def _scalar(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    lowered = value.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def load_settings(
    path: str | os.PathLike | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Defaults, then the file, then the environment, then explicit ``overrides``."""
    env = os.environ if env is None else env
    path = path or env.get(ENV_CONFIG_FILE)
    tree: dict[str, Any] = {}
    sources: dict[tuple[str, ...], str] = {}
    if path:
        tree = _read_file(Path(path))
    for keys, value, name in _env_overrides(env):
        _set_path(tree, keys, value)
        sources[keys] = name
    for dotted, value in (overrides or {}).items():
        _set_path(tree, tuple(dotted.split(".")), value)
    try:
        return Settings.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc, sources, path)) from None


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from None
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigError(f"config file {path}: unknown format {path.suffix!r} (use .toml, .yaml or .json)")
    except (tomllib.TOMLDecodeError, yaml.YAMLError, json.JSONDecodeError) as exc:
        first_line = str(exc).splitlines()[0]
        raise ConfigError(f"config file {path}: not valid {path.suffix[1:]}: {first_line}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def _env_overrides(env: Mapping[str, str]):
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name == ENV_CONFIG_FILE or "__" not in name:
            continue
        keys = tuple(part.lower() for part in name[len(ENV_PREFIX) :].split("__"))
        if any(not key for key in keys):
            raise ConfigError(f"environment variable {name}: empty path segment")
        value: Any = env[name]
        if value[:1] in ("{", "["):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"environment variable {name}: not valid JSON: {exc.msg}") from None
        yield keys, value, name


def _set_path(tree: dict[str, Any], keys: tuple[str, ...], value: Any) -> None:
    node = tree
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[keys[-1]] = value


#: Fields whose invalid value an error must not repeat.
_SECRETISH = re.compile(r"password|secret|token|user_info|^keys$|^url$")


def _one_line(exc: ValidationError, sources: dict[tuple[str, ...], str], path) -> str:
    error = exc.errors()[0]
    loc = tuple(str(part) for part in error["loc"])
    field = ".".join(loc) or "(top level)"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown field"
    got = error.get("input")
    secret = any(_SECRETISH.search(part) for part in loc)  # never echo a secret (or a URL that may hold one)
    shown = "" if error["type"] in ("missing",) or isinstance(got, dict) or secret else f" (got {got!r})"
    # the variable that set this field, or (for a section-level error) one that set a field in it
    origin = next((name for keys, name in sources.items() if loc[: len(keys)] == keys), None)
    origin = origin or next((name for keys, name in sources.items() if keys[: len(loc)] == loc), None)
    where = f" from {origin}" if origin else (f" in {path}" if path else "")
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"invalid config{where}: {field}: {message}{shown}{more}"
