"""``banditstream doctor``: a configuration checked against the services it names.

One line per check, each failure with the fix named; the command exits 1 when any check
fails. The checks, in order (a check that needs an earlier one to pass is skipped when it
did not):

* **broker**: the bootstrap servers answer a metadata request (security settings included);
* **topics**: every configured topic exists, decisions and rewards co-partitioned, and the
  posterior topic has at least as many partitions as the updates topic (as the workers demand);
* **registry**: none (single-object framing), or the registry answers ``GET /subjects``;
  ``mock://`` lives in one process only and fails here, as the workers refuse it;
* **snapshot store**: the store lists its objects (S3: bucket and credentials);
* **trusted root**: the root every client trusts reads, parses and is signed by its own
  root keys (python-tuf);
* **publish keys**: when ``publish.keys_dir`` holds private keys, they are the ones the root
  names for their roles, and its ``root.json`` is the trusted root;
* **clock**: against the S3 server's ``Date`` (within the join's ``max_clock_skew_s``; skipped
  for a directory store);
* **domains**: every declared domain builds its policy; a portfolio member that the log would
  never (or hardly ever) hand the acting role is a **warning** (the command still exits 0), with
  the member and its settings named.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from banditstream.config import Settings

__all__ = ["Check", "domain_check", "run_checks"]


@dataclass(frozen=True)
class Check:
    name: str
    #: "ok", "warning", "failed" or "skipped"
    status: str
    detail: str
    fix: str = ""


class _Failed(Exception):
    def __init__(self, detail: str, fix: str) -> None:
        super().__init__(detail)
        self.detail, self.fix = detail, fix


def run_checks(settings: Settings, *, timeout_s: float = 5.0) -> list[Check]:
    """Every check of the module's doc, in order."""
    checks: list[Check] = []
    done: dict[str, bool] = {}

    def check(name: str, needs: tuple[str, ...], probe: Callable[[], str]) -> None:
        missing = [n for n in needs if not done.get(n)]
        if missing:
            checks.append(Check(name, "skipped", f"needs {', '.join(missing)}"))
            done[name] = False
            return
        try:
            detail = probe()
        except _Failed as failure:
            checks.append(Check(name, "failed", failure.detail, failure.fix))
            done[name] = False
        else:
            checks.append(Check(name, "ok", detail))
            done[name] = True

    counts: dict[str, int] = {}

    def broker() -> str:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(settings.kafka.client_config(log_level=0))
        try:
            metadata = admin.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            raise _Failed(f"{settings.kafka.bootstrap_servers}: {exc.args[0].str()}",
                          "check kafka.bootstrap_servers, that the broker runs, and kafka's security settings") from None
        counts.update({n: len(t.partitions) for n, t in metadata.topics.items() if t.error is None})
        return f"{settings.kafka.bootstrap_servers}: {len(metadata.brokers)} broker(s), {len(counts)} topics"

    def topics() -> str:
        from streams.topics import CoPartitioningError, TopicError, verify_copartitioning

        t = settings.topics
        absent = [name for name in t.names().values() if name not in counts]
        if absent:
            raise _Failed(f"{', '.join(repr(n) for n in absent)} missing", "run `banditstream topics create`")
        try:
            verify_copartitioning(counts, t)
        except (CoPartitioningError, TopicError) as exc:
            raise _Failed(str(exc), "recreate the topics with equal partition counts (topics.partitions)") from None
        if counts[t.posterior] < counts[t.updates]:
            raise _Failed(f"{t.posterior!r} has {counts[t.posterior]} partitions, {t.updates!r} {counts[t.updates]}",
                          f"add partitions to {t.posterior!r}: the learner publishes shard p to partition p")
        return ", ".join(f"{name} ({counts[name]})" for name in t.names().values())

    def registry() -> str:
        url = settings.registry.url
        if not url:
            return "none: events use the Avro single-object framing"
        if url.startswith("mock://"):
            raise _Failed(f"{url!r} is confluent-kafka's registry inside one process",
                          "give registry.url a registry server's http(s):// URL, or none")
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        client = settings.registry.client()
        try:
            subjects = client.get_subjects()
        except SchemaRegistryError as exc:
            fix = ("check registry.basic_auth_user_info or registry.bearer_token" if exc.http_status_code in (401, 403)
                   else "check registry.url and that the registry runs")
            raise _Failed(f"{url}: {exc.http_status_code} {exc.error_message}", fix) from None
        except Exception as exc:  # the client's transport errors (httpx's)
            raise _Failed(f"{url}: {exc}", "check registry.url, registry.ssl_* and that the registry runs") from None
        return f"{url}: {len(subjects)} subjects"

    store_holder: list = []

    def snapshot_store() -> str:
        from publisher.errors import PublisherError
        from publisher.stores import open_store

        try:
            store = open_store(settings.stores.snapshots, s3=settings.s3_client_kwargs())
            objects = store.list("")
        except (PublisherError, OSError) as exc:
            raise _Failed(f"{settings.stores.snapshots}: {str(exc).splitlines()[0]}",
                          "check stores.snapshots and the s3 settings (endpoint, credentials, bucket)") from None
        store_holder.append(store)
        return f"{getattr(store, 'location', settings.stores.snapshots)}: {len(objects)} objects"

    root_holder: list = []

    def trusted_root() -> str:
        from tuf.api.metadata import Metadata, Root

        path = settings.trusted_root_path
        try:
            raw = path.read_bytes()
            root = Metadata[Root].from_bytes(raw)
            root.verify_delegate(Root.type, root)
        except OSError as exc:
            raise _Failed(f"{path}: {exc.strerror or exc}",
                          "run `banditstream keys generate`, or set sdk.trusted_root to the root.json clients trust") from None
        except Exception as exc:  # noqa: BLE001 - python-tuf raises several kinds for a bad root
            raise _Failed(f"{path}: not a valid self-signed root ({exc})",
                          "use the root.json written by `banditstream keys generate`") from None
        root_holder.append((raw, root))
        return f"{path}: version {root.signed.version}, expires {root.signed.expires:%Y-%m-%d}"

    def publish_keys() -> str:
        from publisher.cli_ops import load_keys
        from publisher.errors import PublisherError

        directory = Path(settings.publish.keys_dir)
        if not directory.is_dir():
            return f"{directory}: none here (only the publisher needs them)"
        try:
            keys, raw = load_keys(directory)
        except PublisherError as exc:
            raise _Failed(str(exc).splitlines()[0], "run `banditstream keys generate` into publish.keys_dir") from None
        trusted_raw, root = root_holder[0]
        for role in keys.roles():
            if role not in root.signed.roles:
                continue
            named = set(root.signed.roles[role].keyids)
            unknown = [key.keyid for key in keys.public_keys(role) if key.keyid not in named]
            if unknown:
                raise _Failed(f"the {role} key in {directory} is not one the trusted root names for {role}",
                              "publish with the keys of that root, or distribute the root of these keys")
        if raw != trusted_raw:
            raise _Failed(f"{directory / 'root.json'} differs from the trusted root {settings.trusted_root_path}",
                          "point sdk.trusted_root at the publisher's root.json (or copy it)")
        return f"{directory}: {', '.join(keys.roles())} keys of the trusted root"

    def clock() -> str:
        store = store_holder[0]
        client = getattr(store, "client", None)
        bucket = getattr(store, "bucket", None)
        if client is None or bucket is None:
            return "skipped: the snapshot store is no S3 server to compare with"
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            before = time.time()
            answer = client.head_bucket(Bucket=bucket)
            after = time.time()
        except (BotoCoreError, ClientError) as exc:
            raise _Failed(f"HEAD {bucket}: {exc}", "check the s3 settings") from None
        date = answer["ResponseMetadata"]["HTTPHeaders"].get("date")
        if not date:
            return "skipped: the S3 server sent no Date"
        skew = email.utils.parsedate_to_datetime(date).timestamp() - (before + after) / 2
        limit = float((settings.worker_config().extra.get("join") or {}).get("max_clock_skew_s", 5.0))
        if abs(skew) > limit + 1.0:  # the Date header has a resolution of 1 s
            raise _Failed(f"this host's clock is {skew:+.1f} s off the S3 server's",
                          f"synchronise the clocks (NTP): event time tolerates {limit:g} s (join.max_clock_skew_s)")
        return f"within {abs(skew):.1f} s of the S3 server's (Date resolution 1 s)"

    check("broker", (), broker)
    check("topics", ("broker",), topics)
    check("registry", (), registry)
    check("snapshot store", (), snapshot_store)
    check("trusted root", (), trusted_root)
    check("publish keys", ("trusted root",), publish_keys)
    check("clock", ("snapshot store",), clock)
    checks.append(domain_check(settings))
    return checks


def domain_check(settings: Settings) -> Check:
    """The **domains** check: every declared domain's policy builds, and no portfolio member is
    one the log would never (or hardly ever) hand the acting role (a warning, naming it)."""
    built, warnings = [], []
    for name, domain in settings.domains.items():
        try:
            policy = domain.make_policy(seed=0)
        except (TypeError, ValueError) as exc:
            return Check("domains", "failed", f"{name}: {exc}", f"fix domains.{name}'s policy and params")
        built.append(f"{name} ({policy.name})")
        order_warnings = getattr(policy, "order_warnings", None)
        warnings += [f"{name}: {message}" for message in (order_warnings() if order_warnings else [])]
    if warnings:
        return Check("domains", "warning", "; ".join(warnings), "reorder or drop the members named")
    return Check("domains", "ok", ", ".join(built) or "none declared")
